"""The measured timeline of a replay (`grapec bench --timeline`): when each top-level step of the
plan started and ended on the GPU, and on which branch of the stream schedule.

The bucket's graph is built once more with an event record node before each step (after the step's
predecessors) and one after it (runtime/cuda/graph.py, `stamps`); the events' times, read after each
launch, give every step's span. The extra nodes lengthen the replay and no edge is programmatic, so
the picture shows the shape of the schedule (what overlaps, where branches wait), not the exact
replay time; `grapec bench` reports that apart.
"""
from __future__ import annotations

from ...errors import BackendError
from ...plan import REGIONS
from ...cost.timeline import Span
from .driver import call
from .graph import GraphBuilder


def measure_timeline(runner, bucket: int, launches: int = 20) -> list:
    """[Span] per top-level step: the median over `launches` replays of its start and end, in
    microseconds from the first step's start."""
    steps = runner.plan(bucket).steps
    if any(isinstance(st, REGIONS) and not st.graphed for st in steps):
        raise BackendError("--timeline needs a plan that runs as one CUDA graph (this one has host-driven control flow)")
    runner.prepare(bucket)   # GEMMs tuned by the real graph's build, not this one's
    events = [(call("cuEventCreate", 0), call("cuEventCreate", 0)) for _ in steps]
    graph = call("cuGraphCreate", 0)
    try:
        GraphBuilder(runner, bucket).add_steps(graph, steps, [], stamps=events)
        exec_ = call("cuGraphInstantiate", graph, 0)
        samples = []
        for n in range(launches + 1):
            call("cuGraphLaunch", exec_, runner.stream)
            runner.synchronize()
            if n:   # the first launch warms up
                t0 = events[0][0]
                samples.append([(float(call("cuEventElapsedTime", t0, a)) * 1e3, float(call("cuEventElapsedTime", t0, b)) * 1e3)
                                for a, b in events])
        call("cuGraphExecDestroy", exec_)
    finally:
        call("cuGraphDestroy", graph)
        for a, b in events:
            call("cuEventDestroy", a)
            call("cuEventDestroy", b)
    spans = []
    for i, st in enumerate(steps):
        starts = sorted(s[i][0] for s in samples)
        ends = sorted(s[i][1] for s in samples)
        spans.append(Span(i, st.branch, starts[len(starts) // 2], ends[len(ends) // 2], st.op))
    t_min = min(s.start for s in spans)
    for s in spans:
        s.start, s.end = s.start - t_min, s.end - t_min
    return spans
