"""Which steps of a plan touch a model input's or output's bytes: what binding a caller's buffer in
their place (IOBinding, runtime/binding.py) must patch, or why it cannot and a copy is made instead.

Grape's alias prediction, as grapec does it: the plan says which graph nodes read an input and which
write an output (their buffers and every alias of them: Views, values of region bodies kept in their
bytes; plan.aliases). A backend that can repoint those nodes at the caller's buffer skips the copy in
or out (runtime/cuda/binding.py decides when that pays). The analysis needs no GPU.

An input's bytes hold it for the whole run (plan_memory keeps graph inputs live to the end and never
writes them), so its readers are the steps that name any buffer of its storage. An output is
written by exactly one step of the top level here, or it is copied.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..plan import REGIONS, IfStep, KernelStep, LibraryStep, LoopStep, ScanStoreStep, walk_steps


@dataclass
class Route:
    """A bound input or output: its storage (the buffer owning its bytes), the top-level steps that
    touch those bytes, and why it must be copied instead ("" where the steps can be repointed)."""
    name: str
    kind: str          # "input" | "output"
    buffer: int
    nbytes: int
    steps: list = field(default_factory=list)
    reason: str = ""


def step_buffers(st) -> tuple:
    """(buffers read, buffers written) by one step, not counting what its region bodies do."""
    if isinstance(st, (KernelStep, LibraryStep)):
        return [a for a in st.args if a >= 0], [st.out]
    if isinstance(st, ScanStoreStep):
        return [st.src, st.counter], [st.dst]
    if isinstance(st, IfStep):
        return [st.cond], list(st.outputs)
    if isinstance(st, LoopStep):
        return [b for b in (st.trip, st.cond) if b >= 0], list(st.outputs)
    return [], []


def io_routes(plan) -> dict:
    """name -> Route for every input and output of the plan."""
    routes: dict = {}
    if plan.aliases is None:
        for kind, pairs in (("input", plan.inputs), ("output", plan.outputs)):
            for name, b in pairs:
                routes[name] = Route(name, kind, b, plan.buffers[b].nbytes,
                                     reason="the bundle records no aliases (made by an older grapec): recompile it")
        return routes
    root = plan.storage_of()
    inputs = {root[b]: name for name, b in plan.inputs}
    outputs: dict = {}
    for name, b in plan.outputs:
        outputs.setdefault(root[b], []).append(name)
    touching: dict = {}   # storage -> [(top-level step index, reads, writes, inside a region)]
    for i, st in enumerate(plan.steps):
        nested = [s for s in walk_steps([st]) if s is not st] if isinstance(st, REGIONS) else []
        for s in [st] + nested:
            reads, writes = step_buffers(s)
            for b in set(reads) | set(writes):
                touching.setdefault(root[b], []).append((i, b in reads, b in writes, s is not st))
    for kind, pairs in (("input", plan.inputs), ("output", plan.outputs)):
        for name, b in pairs:
            r = root[b]
            route = Route(name, kind, r, plan.buffers[r].nbytes)
            route.reason = _why_not(plan, route, touching.get(r, []), inputs, outputs)
            if plan.buffers[b].pitch:   # a caller's buffer is dense: the copy compacts the rows
                route.reason = "its rows are padded to 16 bytes (the GEMM writing it is fastest so)"
            route.steps = sorted({i for i, *_ in touching.get(r, [])}) if not route.reason else []
            routes[name] = route
    return routes


def _why_not(plan, route: Route, uses: list, inputs: dict, outputs: dict) -> str:
    buf = plan.buffers[route.buffer]
    if buf.space != "arena":
        return "it is a constant of the bundle"
    if route.kind == "output" and route.buffer in inputs:
        return f"it is input '{inputs[route.buffer]}' itself"
    if len(outputs.get(route.buffer, ())) > 1:
        return f"outputs {', '.join(repr(n) for n in outputs[route.buffer])} share its bytes"
    for i, _, _, nested in uses:
        if nested or isinstance(plan.steps[i], REGIONS):
            origin = ", ".join(plan.steps[i].origin) or f"step {i}"
            return f"an If/Loop ({origin}) uses it"
    writers = [i for i, _, writes, _ in uses if writes]
    if route.kind == "input" and writers:
        return f"step {writers[0]} writes it"
    if route.kind == "output" and len(writers) != 1:
        return f"{len(writers)} steps write it"
    if not uses:
        return "no step touches it"
    return ""
