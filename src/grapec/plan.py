"""The execution plan: what a runtime replays for one input-shape bucket. Plain JSON-able data.

    buffers   [[name, space, offset, nbytes, dtype, shape]]; space "arena" (activations, inputs,
              outputs, workspaces) or "weight" (offset into the bundle's weight blob)
    steps     ordered; each names buffers by index:
              {"op": "kernel",  "kernel": k, "args": [b..], "out": b, "origin": [onnx nodes]}
              {"op": "library", "attrs": {...}, "args": [b or -1 ..], "out": b, "origin": [...]}
              {"op": "if",   "cond": b, "then": Body, "else": Body, "outputs": [b..]}
              {"op": "loop", "trip": b|-1, "cond": b|-1, "init": [b..], "body": Body,
                             "outputs": [b..], "scan_outputs": [b..]}
              Body = {"steps": [...], "inputs": [b..], "outputs": [b..]}; a loop body's inputs are
              (iteration, condition, carried...) and outputs (condition, carried..., scans...)
    inputs / outputs   [[onnx name, buffer]]
Kernels live once in the bundle (plans refer to them by index), so buckets share them.
"""
from __future__ import annotations

import hashlib

import numpy as np

from . import dtypes
from .ir.graph import Graph
from .passes.plan_memory import MemoryPlan, plan_memory

WEIGHT_ALIGN = 256


class WeightStore:
    """One blob of all weights and folded constants, deduplicated by content."""

    def __init__(self):
        self.chunks: list = []
        self.size = 0
        self._by_hash: dict = {}

    def add(self, arr: np.ndarray) -> int:
        data = np.ascontiguousarray(arr).tobytes()
        key = hashlib.sha256(data).hexdigest()
        off = self._by_hash.get(key)
        if off is None:
            pad = (-self.size) % WEIGHT_ALIGN
            if pad:
                self.chunks.append(b"\0" * pad)
                self.size += pad
            off = self._by_hash[key] = self.size
            self.chunks.append(data)
            self.size += len(data)
        return off

    def blob(self) -> bytes:
        return b"".join(self.chunks)


class KernelStore:
    """Kernels deduplicated by their canonical JSON."""

    def __init__(self):
        self.kernels: list = []
        self._index: dict = {}

    def add(self, kernel) -> int:
        import json
        j = kernel.to_json()
        key = json.dumps(j, sort_keys=True)
        k = self._index.get(key)
        if k is None:
            k = self._index[key] = len(self.kernels)
            self.kernels.append(j)
        return k


class PlanBuilder:
    def __init__(self, weights: WeightStore, kernels: KernelStore):
        self.weights = weights
        self.kernels = kernels
        self.buffers: list = []
        self._ids: dict = {}
        self._scopes: dict = {}   # id(graph) -> (graph, MemoryPlan, base offset)
        self.arena_bytes = 0

    def build(self, g: Graph) -> dict:
        mem = plan_memory(g)
        self.arena_bytes = mem.arena_bytes
        body = self._body(g, mem, 0)
        return {
            "inputs": [[n, self.buffer(g, n)] for n in g.inputs],
            "outputs": [[n, self.buffer(g, n)] for n in g.outputs],
            "buffers": self.buffers,
            "steps": body["steps"],
            "arena_bytes": mem.arena_bytes,
            "memory": mem.report(),
        }

    def buffer(self, g: Graph, name: str) -> int:
        scope = g
        while scope is not None and name not in scope.values:
            scope = scope.parent
        assert scope is not None, f"value {name} not found"
        key = (id(scope), name)
        if key in self._ids:
            return self._ids[key]
        v = scope.values[name]
        _, mem, base = self._scopes[id(scope)]
        if v.const is not None:
            row = [name, "weight", self.weights.add(v.const), v.nbytes, v.dtype, list(v.shape)]
        elif name in mem.offsets:
            row = [name, "arena", base + mem.offsets[name], v.nbytes, v.dtype, list(v.shape)]
        elif name in mem.weights:
            w = scope.lookup(mem.weights[name])
            row = [name, "weight", self.weights.add(w.const), v.nbytes, v.dtype, list(v.shape)]
        elif name in mem.outer:  # a View, inside a region body, of a value of an enclosing scope
            src = self.buffers[self.buffer(scope.parent, mem.outer[name])]
            row = [name, src[1], src[2], v.nbytes, v.dtype, list(v.shape)]
        else:  # pragma: no cover - a planner bug, not a user error
            raise AssertionError(f"value {name} has no storage")
        self._ids[key] = len(self.buffers)
        self.buffers.append(row)
        return self._ids[key]

    def _body(self, g: Graph, mem: MemoryPlan, base: int) -> dict:
        self._scopes[id(g)] = (g, mem, base)
        steps = []
        for i, node in enumerate(g.nodes):
            ref = lambda name: self.buffer(g, name) if name else -1  # noqa: E731
            if node.op == "Kernel":
                steps.append({"op": "kernel", "kernel": self.kernels.add(node.attrs["kernel"]),
                              "args": [ref(n) for n in node.inputs], "out": ref(node.outputs[0]),
                              "origin": node.origin})
            elif node.op == "Library":
                steps.append({"op": "library", "attrs": {k: v for k, v in node.attrs.items()},
                              "args": [ref(n) for n in node.inputs], "out": ref(node.outputs[0]),
                              "origin": node.origin})
            elif node.op == "View":
                ref(node.outputs[0])  # same bytes as its source; no work
            elif node.op in ("If", "Loop"):
                ws_off, plans = mem.workspaces[i]
                bodies = {}
                for (key, body), bplan in zip(node.subgraphs.items(), plans):
                    bodies[key] = self._body(body, bplan, base + ws_off)
                    bodies[key]["inputs"] = [self.buffer(body, n) for n in body.inputs]
                    bodies[key]["outputs"] = [self.buffer(body, n) for n in body.outputs]
                step = {"op": node.op.lower(), "outputs": [ref(o) for o in node.outputs], "origin": node.origin}
                if node.op == "If":
                    step.update(cond=ref(node.inputs[0]), then=bodies["then_branch"], **{"else": bodies["else_branch"]})
                else:
                    n_carried = node.attrs["n_carried"]
                    step.update(trip=ref(node.inputs[0]), cond=ref(node.inputs[1]),
                                init=[ref(n) for n in node.inputs[2:2 + n_carried]], body=bodies["body"],
                                scan_outputs=[ref(o) for o in node.outputs[n_carried:]])
                    step["outputs"] = [ref(o) for o in node.outputs[:n_carried]]
                steps.append(step)
            else:  # pragma: no cover
                raise AssertionError(f"unlowered node {node.op}")
        return {"steps": steps}


def kernel_steps(plans: list):
    """(bucket, step) for every kernel step of the plans, If/Loop bodies included."""
    def walk(steps, bucket):
        for st in steps:
            if st["op"] == "kernel":
                yield bucket, st
            for key in ("then", "else", "body"):
                if key in st:
                    yield from walk(st[key]["steps"], bucket)
    for b, p in enumerate(plans):
        yield from walk(p["steps"], b)


def buffer_dtype(row) -> np.dtype:
    return dtypes.np_dtype(row[4])
