"""build_plan: a scheduled, memory-planned graph -> a Plan (plan.py), with weights and kernels
stored once for all buckets.

Regions become the steps both backends run (plan.py says how): an If's branches already write its
outputs (plan_memory pinned them there); a Loop gets copies that bring initial values into its
carried slots, copies home for carried values that could not be updated in place, a scan-row store
per scan output, and copies out where a carried slot is not the Loop's output itself.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import replace

import numpy as np

from ..ir.graph import Graph
from ..ir.kernel import Kernel, idx, load
from ..plan import Body, Buffer, IfStep, KernelStep, LibraryStep, LoopStep, Plan, ScanStoreStep
from .plan_memory import MemoryPlan, plan_memory

WEIGHT_ALIGN = 256
PREFIX_HEAD = 4096   # entries shorter than this are not worth sharing as prefixes


class WeightStore:
    """One blob of all weights and folded constants, deduplicated by content.

    A constant is looked up by a cheap key (its size, a hash of its first and last bytes) and then
    compared byte for byte, so the model's weights, met again in every bucket, are not hashed whole
    each time.

    An entry is the constant's own bytes (a uint8 view of its array, made read-only: a constant
    stored is final), not a copy: a 1.2 B model's weights are held once while the graph still holds
    them, and blob() copies each once, into the bundle's bytes."""

    def __init__(self):
        self.size = 0
        self._by_key: dict = {}   # cheap key -> [(offset, uint8 array)]
        self.entries: list = []   # (offset, uint8 array) in the order added

    def add(self, arr: np.ndarray) -> int:
        arr = np.ascontiguousarray(arr)
        raw = arr.reshape(-1).view(np.uint8)
        key = (raw.size, hashlib.sha1(raw[:4096].tobytes() + raw[-4096:].tobytes()).digest())
        same = self._by_key.setdefault(key, [])
        for off, data in same:
            # the same memory again (a range's every size adds the model's weights): equal without reading it
            if data.ctypes.data == raw.ctypes.data or same_bytes(data, raw):
                return off
        off = self.size + (-self.size) % WEIGHT_ALIGN
        arr.flags.writeable = False
        data = raw
        same.append((off, data))
        self.entries.append((off, data))
        self.size = off + len(data)
        return off

    def share_prefixes(self) -> dict:
        """Stores once an entry whose bytes begin a longer one: a weight and its copy with zero rows
        appended (passes/aligned_rows.py pads a GEMM's weight; in a range the sizes that keep the
        unpadded one, and a tied embedding's Gather, read the same table). Relocates the rest.
        Returns old offset -> new offset for every entry (the plans' weight buffers are rewritten
        with it, relocate_weights)."""
        longest_first = sorted(self.entries, key=lambda e: -len(e[1]))
        by_head: dict = {}
        home: dict = {}   # old offset -> the old offset of the entry that holds its bytes
        for off, data in longest_first:
            head = hashlib.sha1(data[:PREFIX_HEAD]).digest() if len(data) >= PREFIX_HEAD else None
            holder = next((o for o, d in by_head.get(head, ()) if same_bytes(d[:len(data)], data)), None) if head else None
            home[off] = off if holder is None else holder
            if holder is None and head:
                by_head.setdefault(head, []).append((off, data))
        if all(home[off] == off for off in home):
            return {off: off for off in home}
        kept = [(off, data) for off, data in self.entries if home[off] == off]
        self.__init__()
        moved = {off: self.add(np.frombuffer(data, np.uint8)) for off, data in kept}
        return {off: moved[home[off]] for off in home}

    def parts(self) -> "WeightParts":
        """All entries at their offsets, the gaps zero, as a bundle's weights: joined into one bytes
        object only where a reader asks for them, and streamed into the file where the bundle is
        written."""
        return WeightParts(list(self.entries), self.size)

    def blob(self) -> bytes:
        return self.parts().join()


def same_bytes(a, b, chunk: int = 16 << 20) -> bool:
    """Two uint8 arrays (or bytes) equal, compared a chunk at a time: a whole-array comparison of a
    500 MB embedding would allocate a 500 MB temporary."""
    a, b = np.frombuffer(a, np.uint8), np.frombuffer(b, np.uint8)
    if a.size != b.size:
        return False
    return all(np.array_equal(a[i:i + chunk], b[i:i + chunk]) for i in range(0, a.size, chunk))


class WeightParts:
    """A bundle's weights as the compile left them: (offset, buffer) entries in a blob of `size` bytes,
    the gaps zero. Writing the bundle streams them into the file; the whole blob is joined only where
    something reads Bundle.weights (a session run from the bundle in memory), so a compile that is
    written to a file never holds its weights twice (bundle/format.py Bundle.weights)."""

    def __init__(self, entries: list, size: int):
        self.entries, self.size = entries, size

    def pieces(self):
        at = 0
        for off, data in self.entries:
            if off > at:
                yield bytes(off - at)
            yield memoryview(data).cast("B")
            at = off + len(data)
        if self.size > at:
            yield bytes(self.size - at)

    def join(self) -> bytes:
        return b"".join(self.pieces())

    def sha256(self) -> str:
        h = hashlib.sha256()
        for piece in self.pieces():
            h.update(piece)
        return h.hexdigest()


class KernelStore:
    """Kernels deduplicated by their canonical JSON."""

    def __init__(self):
        self.kernels: list = []
        self._index: dict = {}

    def add(self, kernel: Kernel) -> int:
        return self.add_json(kernel.to_json())

    def add_json(self, j: dict) -> int:
        key = json.dumps(j, sort_keys=True)
        k = self._index.get(key)
        if k is None:
            k = self._index[key] = len(self.kernels)
            self.kernels.append(j)
        return k


def relocate_weights(plans: list, moved: dict):
    """The plans' weight buffers moved as WeightStore.share_prefixes moved the entries they start."""
    for plan in plans:
        for b in plan.buffers:
            if b.space == "weight":
                b.offset = moved[b.offset]


def copy_kernel(shape: tuple, dtype: str) -> Kernel:
    """out = in, element for element."""
    shape = tuple(shape)
    return Kernel(shape, dtype, load(0, tuple(idx(a) for a in range(len(shape))), dtype), ((shape, dtype),))


class PlanBuilder:
    def __init__(self, weights: WeightStore, kernels: KernelStore):
        self.weights = weights
        self.kernels = kernels
        self.buffers: list = []
        self.aliases: list = []   # (buffer, the buffer whose bytes it is)
        self._ids: dict = {}
        self._scopes: dict = {}   # id(graph) -> (graph, MemoryPlan, base offset)

    def build(self, g: Graph, held: tuple = ()) -> Plan:
        """held: outputs whose bytes are theirs alone for the whole run (plan_memory)."""
        mem = plan_memory(g, held=held)
        steps = self._steps(g, mem, 0)
        return Plan(self.buffers, [(n, self.buffer(g, n)) for n in g.inputs],
                    [(n, self.buffer(g, n)) for n in g.outputs], steps, mem.arena_bytes, mem.report(),
                    sorted(set(self.aliases)))

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
            space, off = "weight", self.weights.add(v.const)
        elif name in mem.offsets:
            space, off = "arena", base + mem.offsets[name]
        elif name in mem.weights:
            space, off = "weight", self.weights.add(scope.lookup(mem.weights[name]).const)
        elif name in mem.outer:  # bytes of a value of an enclosing scope (a View of it, or pinned there)
            outer = self.buffer(scope.parent, mem.outer[name])
            src = self.buffers[outer]
            space, off = src.space, src.offset
            self.aliases.append((len(self.buffers), outer))
        else:  # pragma: no cover - a planner bug, not a user error
            raise AssertionError(f"value {name} has no storage")
        self._ids[key] = len(self.buffers)
        self.buffers.append(Buffer(name, space, off, v.nbytes, v.dtype, tuple(v.shape)))
        return self._ids[key]

    def copy(self, src: int, dst: int, origin: list):
        """A copy step, or None where the two buffers are the same bytes."""
        s, d = self.buffers[src], self.buffers[dst]
        if (s.space, s.offset) == (d.space, d.offset):
            return None
        assert (s.shape, s.dtype) == (d.shape, d.dtype), (s, d)
        return KernelStep(self.kernels.add(copy_kernel(d.shape, d.dtype)), [src], dst, origin)

    def _steps(self, g: Graph, mem: MemoryPlan, base: int) -> list:
        self._scopes[id(g)] = (g, mem, base)
        steps = []
        for i, node in enumerate(g.nodes):
            ref = lambda name: self.buffer(g, name) if name else -1  # noqa: E731
            if node.op == "Kernel":
                steps.append(KernelStep(self.kernels.add(node.attrs["kernel"]), [ref(n) for n in node.inputs],
                                        ref(node.outputs[0]), node.origin))
            elif node.op == "Library":
                steps.append(LibraryStep(dict(node.attrs), [ref(n) for n in node.inputs], ref(node.outputs[0]),
                                         node.origin))
            elif node.op == "View":   # same bytes as its source; no work
                out, src = ref(node.outputs[0]), ref(node.inputs[0])
                self.aliases.append((out, src))
                if node.attrs.get("pitch"):   # the leading columns of the source's padded rows
                    self.buffers[out] = replace(self.buffers[out], pitch=int(node.attrs["pitch"]),
                                                nbytes=self.buffers[src].nbytes)
            elif node.op == "If":
                ws_off, (then_plan, else_plan) = mem.workspaces[i]
                branches = [Body(self._steps(node.subgraphs[k], p, base + ws_off))
                            for k, p in (("then_branch", then_plan), ("else_branch", else_plan))]
                steps.append(IfStep(ref(node.inputs[0]), *branches, [ref(o) for o in node.outputs],
                                    **_region_mode(node)))
            elif node.op == "Loop":
                steps.append(self._loop(g, node, mem.workspaces[i], base, ref))
            else:  # pragma: no cover
                raise AssertionError(f"unlowered node {node.op}")
        return steps

    def _loop(self, g: Graph, node, workspace, base: int, ref) -> LoopStep:
        ws_off, (body_plan,) = workspace
        body = node.subgraphs["body"]
        n = node.attrs["n_carried"]
        steps = self._steps(body, body_plan, base + ws_off)
        slot = [self.buffer(body, x) for x in body.inputs[2:]]
        new = [self.buffer(body, x) for x in body.outputs[1:1 + n]]
        scans = [self.buffer(body, x) for x in body.outputs[1 + n:]]
        origin = [node.name]
        enter = [self.copy(ref(init), s, origin) for init, s in zip(node.inputs[2:], slot)]
        steps += [self.copy(v, s, origin) for v, s in zip(new, slot)]
        steps += [ScanStoreStep(v, ref(o), self.buffer(body, body.inputs[0]), origin)
                  for v, o in zip(scans, node.outputs[n:]) if o]
        exit_ = [self.copy(s, ref(o), origin) for s, o in zip(slot, node.outputs[:n]) if o]
        if node.attrs.get("iterations_output"):   # the scan rows written: the counter after the loop
            exit_.append(self.copy(self.buffer(body, body.inputs[0]), ref(node.attrs["iterations_output"]), origin))
        return LoopStep(ref(node.inputs[0]), ref(node.inputs[1]),
                        self.buffer(body, body.inputs[0]), self.buffer(body, body.inputs[1]),
                        self.buffer(body, body.outputs[0]), [s for s in enter if s], Body([s for s in steps if s]),
                        [s for s in exit_ if s], [ref(o) for o in node.outputs], **_region_mode(node), carried=slot)


def _region_mode(node) -> dict:
    return {"graphed": bool(node.attrs.get("graphed", True)), "host_reason": node.attrs.get("host_reason", ""),
            "origin": [node.name]}
