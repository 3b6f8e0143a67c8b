"""Run a plan on the CPU: one numpy arena laid out exactly as the plan says, steps in order.

Because every value is a view into the same arena at the planned offset, a memory-planning bug
(two live values sharing bytes) shows up here as a wrong answer, on any machine.
"""
from __future__ import annotations

import numpy as np

from .. import dtypes
from ..ir.kernel import Kernel
from .cpu_kernels import run_kernel
from .library import run_library


class CpuPlanRunner:
    def __init__(self, bundle):
        self.bundle = bundle
        self.kernels = [Kernel.from_json(k) for k in bundle.kernels]
        self.weights = np.frombuffer(bundle.weights, np.uint8)
        arena_bytes = max((p["arena_bytes"] for p in bundle.plans), default=0)
        self.arena = np.zeros(arena_bytes, np.uint8)   # one arena shared by all buckets
        self._views = {}

    def views(self, bucket: int) -> list:
        if bucket not in self._views:
            out = []
            for name, space, off, nbytes, dt, shape in self.bundle.plans[bucket]["buffers"]:
                mem = self.arena if space == "arena" else self.weights
                out.append(mem[off:off + nbytes].view(dtypes.np_dtype(dt)).reshape(shape))
            self._views[bucket] = out
        return self._views[bucket]

    def run(self, bucket: int, feeds: dict) -> dict:
        plan = self.bundle.plans[bucket]
        v = self.views(bucket)
        for name, b in plan["inputs"]:
            v[b][...] = feeds[name]
        self.exec_steps(plan["steps"], v)
        return {name: v[b].copy() for name, b in plan["outputs"]}

    def exec_steps(self, steps, v):
        for st in steps:
            op = st["op"]
            if op == "kernel":
                run_kernel(self.kernels[st["kernel"]], [v[a] for a in st["args"]], out=v[st["out"]])
            elif op == "library":
                r = run_library(st["attrs"], [v[a] if a >= 0 else None for a in st["args"]])
                v[st["out"]][...] = r
            elif op == "if":
                body = st["then"] if bool(v[st["cond"]].reshape(-1)[0]) else st["else"]
                self.exec_steps(body["steps"], v)
                for src, dst in zip(body["outputs"], st["outputs"]):
                    v[dst][...] = v[src]
            elif op == "loop":
                self.exec_loop(st, v)
            else:  # pragma: no cover - validated at load
                raise ValueError(op)

    def exec_loop(self, st, v):
        body = st["body"]
        it, cond_in, *carried_in = body["inputs"]
        cond_out, *rest = body["outputs"]
        n = len(st["init"])
        carried_out, scans = rest[:n], rest[n:]
        trip = int(v[st["trip"]].reshape(-1)[0]) if st["trip"] >= 0 else None
        cond = bool(v[st["cond"]].reshape(-1)[0]) if st["cond"] >= 0 else True
        for src, dst in zip(st["init"], carried_in):
            v[dst][...] = v[src]
        i = 0
        while (trip is None or i < trip) and cond:
            v[it][...] = i
            v[cond_in][...] = cond
            self.exec_steps(body["steps"], v)
            cond = bool(v[cond_out].reshape(-1)[0])
            new = [v[o].copy() for o in carried_out]  # outputs may alias other inputs: copy first
            for dst, val in zip(carried_in, new):
                v[dst][...] = val
            for src, dst in zip(scans, st["scan_outputs"]):
                v[dst][i] = v[src]
            i += 1
        for src, dst in zip(carried_in, st["outputs"]):
            v[dst][...] = v[src]
