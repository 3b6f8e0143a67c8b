"""If and Loop steps driven from the host: their semantics once, for every backend.

A backend hands in `mem`, its view of the plan's buffers, and `execute(steps)`, which runs a body:
    mem.scalar(b)          the one element of buffer b, as a Python value
    mem.set(b, array)      write a host array into buffer b
    mem.snapshot(b)        a host copy of buffer b
    mem.copy(src, dst)     buffer to buffer
    mem.copy_row(src, dst, i)   src into row i of dst (a Loop's scan output)
"""
from __future__ import annotations

import numpy as np


def run_if(st: dict, mem, execute):
    body = st["then"] if bool(mem.scalar(st["cond"])) else st["else"]
    execute(body["steps"])
    for src, dst in zip(body["outputs"], st["outputs"]):
        mem.copy(src, dst)


def run_loop(st: dict, mem, execute):
    """ONNX Loop: body inputs (iteration, condition, carried...), outputs (condition,
    carried..., scans...); runs while i < trip count (if any) and the condition holds."""
    body = st["body"]
    it, cond_in, *carried_in = body["inputs"]
    cond_out, *rest = body["outputs"]
    n = len(st["init"])
    carried_out, scans = rest[:n], rest[n:]
    trip = int(mem.scalar(st["trip"])) if st["trip"] >= 0 else None
    cond = bool(mem.scalar(st["cond"])) if st["cond"] >= 0 else True
    for src, dst in zip(st["init"], carried_in):
        mem.copy(src, dst)
    i = 0
    while (trip is None or i < trip) and cond:
        mem.set(it, np.array(i))
        mem.set(cond_in, np.array(cond))
        execute(body["steps"])
        cond = bool(mem.scalar(cond_out))
        new = [mem.snapshot(o) for o in carried_out]   # outputs may alias other inputs: copy first
        for dst, val in zip(carried_in, new):
            mem.set(dst, val)
        for src, dst in zip(scans, st["scan_outputs"]):
            mem.copy_row(src, dst, i)
        i += 1
    for src, dst in zip(carried_in, st["outputs"]):
        mem.copy(src, dst)
