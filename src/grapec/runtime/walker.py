"""The plan walker both backends share: If and Loop semantics, once.

The CPU backend walks every plan with it. The CUDA backend builds graphed regions into its CUDA
graph as conditional IF/WHILE nodes (the device then evaluates the same semantics in its setter
kernels, codegen/control.py), and walks only host-driven regions with it, between graph launches.

A backend hands in `mem`, its view of the plan's buffers, and `execute(steps)`, which runs a list
of steps (and, through this module, the regions among them):
    mem.scalar(b)          the one element of buffer b, as a Python value
    mem.set(b, value)      write a one-element host value into buffer b
and, optionally, `progress()`, called once a Loop's carried values are set and after each of its
steps (what a streamed generation reads its tokens at: runtime/generation.py).
"""
from __future__ import annotations

from ..plan import IfStep, LoopStep


def run_region(st, mem, execute, progress=None):
    if isinstance(st, IfStep):
        run_if(st, mem, execute)
    elif isinstance(st, LoopStep):
        run_loop(st, mem, execute, progress)
    else:  # pragma: no cover - callers pass regions only
        raise TypeError(type(st).__name__)


def run_if(st: IfStep, mem, execute):
    """Both branches write the If's outputs themselves (plan_memory pinned them there)."""
    execute(st.then.steps if bool(mem.scalar(st.cond)) else st.else_.steps)


def loop_goes_on(i: int, trip, cond: bool) -> bool:
    """ONNX Loop: for (i = 0; i < M && cond; ++i); a missing M or cond does not stop it."""
    return bool(cond) and (trip is None or i < trip)


def run_loop(st: LoopStep, mem, execute, progress=None):
    execute(st.enter)
    if progress is not None:
        progress()
    trip = int(mem.scalar(st.trip)) if st.trip >= 0 else None
    cond = bool(mem.scalar(st.cond)) if st.cond >= 0 else True
    i = 0
    mem.set(st.counter, i)
    mem.set(st.cond_in, cond)
    while loop_goes_on(i, trip, cond):
        execute(st.body.steps)
        if progress is not None:
            progress()
        cond = bool(mem.scalar(st.cond_out))
        i += 1
        mem.set(st.counter, i)
        mem.set(st.cond_in, cond)
    execute(st.exit)
