"""Per-step GPU time of a plan: what each step costs as the graph node it is.

Each top-level step is built alone into a CUDA graph as a chain of REPEAT copies of its node, and
that graph is replayed between CUDA events; the time per copy is the step's cost inside a graph,
launch gap included (what a node adds to a replay). The steps' sum is close to one replay of the
whole plan: `grapec bench --per-step` prints both, and the cost model (cost.py) is checked
against these numbers.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...plan import KernelStep, LibraryStep, chain_deps
from .driver import call, graph_ms
from .graph import GraphBuilder

REPEAT = 16
ITERATIONS = 10


@dataclass
class StepTime:
    index: int          # position in the plan's top-level steps
    kind: str           # kernel | attention | library op | if | loop | scan_store
    origin: list
    us: float           # GPU time per execution, microseconds

    def to_json(self) -> dict:
        return {"index": self.index, "kind": self.kind, "origin": self.origin[:4], "us": round(self.us, 3)}


def step_kind(bundle, st) -> str:
    if isinstance(st, KernelStep):
        return bundle.kernels[st.kernel].get("kind", "kernel")
    if isinstance(st, LibraryStep):
        return st.attrs["op"]
    return st.op


def profile_steps(runner, bucket: int, repeat: int = REPEAT, iterations: int = ITERATIONS) -> list:
    """-> [StepTime] for every top-level step of the bucket's plan (its inputs as they are now)."""
    steps = runner.plan(bucket).steps
    out = []
    for i, st in enumerate(steps):
        graph = call("cuGraphCreate", 0)
        GraphBuilder(runner, bucket).add_steps(graph, [st] * repeat, [], order=chain_deps(repeat))
        ms = graph_ms(graph, runner.stream, iterations)
        out.append(StepTime(i, step_kind(runner.bundle, st), list(st.origin), ms * 1e3 / repeat))
    return out
