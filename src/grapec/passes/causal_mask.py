"""A mask that is exactly the causal band, wherever it comes from, is not read: it is a comparison of the
query and key indices (passes/sdpa.py attention_engines asks here, for each fused attention).

An exporter folds GPT-2's causal mask into a [B, 1, S, T] constant where one size is compiled, and a range
of sizes keeps it computed from the shapes (Range, CumSum, GatherND, Where: each size would store its own).
Either way its values are known at compile time: a constant is read, a value computed from constants alone
is evaluated (ConstantCone, within CONE_ELEMENTS; a kernel whose slices along its first axis must be equal,
the batch of one band, evaluated once: same_along_axis0). Where they are exactly the band (is_causal),
cuDNN's SDPA takes its causal band and the generated kernel compares indices (causal_by_index), skipping
the key tiles past the band; the kernels that made the mask go (drop_unread).
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from ..ir import kernel as K
from ..ir.attention import AttentionKernel
from ..ir.evaluate import run_node
from ..ir.graph import Graph, Node, outer_reads
from ..ir.interpret import _widen, run_kernel
from ..ir.library import causal_band, strided

CAUSAL_HIDDEN = -1e4  # a mask value that hides a key: exporters write -inf, finfo.min (-65504 in half) or -1e4
# A mask computed from constants alone (a range keeps GPT-2's, made from the shapes, computed rather than
# stored per size) is evaluated to see whether it is the causal band, up to this many elements in all.
CONE_ELEMENTS = 1 << 22


def drop_unread(g: Graph, names: list):
    """The Kernel and View nodes that made `names` (a causal mask and what it was computed from), where
    nothing reads their outputs any more. Only those: simplify.remove_dead_code run over the lowered graph
    here dropped a value the plan still needed (GPT-2: "value add_17_as_c__54 has no storage" in build_plan)."""
    if not names:
        return
    readers: dict = {}
    for n in g.nodes:
        for x in list(n.inputs) + sorted(outer_reads(n)):
            readers[x] = readers.get(x, 0) + 1
    producer = {o: n for n in g.nodes for o in n.outputs if o}
    gone, todo = set(), list(names)
    while todo:
        name = todo.pop()
        node = producer.get(name)
        if node is None or id(node) in gone or readers.get(name, 0) or name in g.outputs \
                or node.op not in ("Kernel", "View") or len(node.outputs) != 1:
            continue
        gone.add(id(node))
        for x in list(node.inputs) + sorted(outer_reads(node)):
            readers[x] -= 1
            todo.append(x)
    g.nodes = [n for n in g.nodes if id(n) not in gone]


def causal_instead(g: Graph, node: Node, attrs: dict, bias, seen: dict, cone: "ConstantCone") -> bool:
    """Where the mask is a constant that hides exactly the keys after each query's own position
    (key j > query i + T - S: the causal mask an exporter folds into a [B, 1, S, T] constant, 0 and
    -inf or a value at most CAUSAL_HIDDEN), the sdpa step takes cuDNN's causal band instead of
    reading it: on an H200, GPT-2's 16 x 12 heads x 128 ran 12.9 us with the mask read, 8.5 with the
    band (benchmarks/results/2026-11-26-h200-sdpa-causal). A mask computed from constants alone is
    evaluated (cone) to tell. attrs change in place: "bias" and "bias_input" go, "causal" is set.
    seen: the answer per mask source, for the other layers."""
    if "bias" not in attrs:
        return False
    if bias is None:   # read where it lies: one buffer, a constant or not
        name = node.inputs[attrs["bias_input"]]
        offset, dims, strides = attrs["bias"]
        dims = [1 if a < len(dims) - 2 and st == 0 else d for a, (d, st) in enumerate(zip(dims, strides))]  # repeats
        source = (name, offset, tuple(dims), tuple(strides))
        if source not in seen:
            const = cone.values([name])
            seen[source] = const is not None and is_causal(_mask_view(np.asarray(const[0]), offset, dims, strides))
    else:              # an expression: constant when every input of the kernel writing it is
        source = (bias, tuple(node.inputs[3:]))
        if source not in seen:
            consts = cone.values(node.inputs[3:])
            if consts is not None and same_along_axis0(bias, consts):   # a batch of one mask: checked once
                bias = replace(bias, shape=(1, *bias.shape[1:]))
            seen[source] = consts is not None and \
                is_causal(run_kernel(_unread_axes_shrunk(bias), [np.asarray(c) for c in consts]))
    if not seen[source]:
        return False
    for key in ("bias", "bias_input"):
        attrs.pop(key, None)
    attrs["causal"] = True
    return True


class ConstantCone:
    """Values computed from constants alone by Kernel and View nodes, evaluated as the CPU backend computes
    them (ir/evaluate.py): one size folds GPT-2's causal mask, made from its shapes, into a constant, where
    a range of sizes keeps it computed (each size would store its own), and the mask is the same band."""

    def __init__(self, g: Graph):
        self.g = g
        self.producer = None   # output name -> node, made at the first question
        self.memo: dict = {}   # name -> its array, or None where it is not constant
        self.spent = 0         # elements evaluated so far (CONE_ELEMENTS in all)

    def values(self, names) -> list | None:
        """The named values' arrays, or None where one of them is not computed from constants alone."""
        if self.producer is None:
            self.producer = {o: n for n in self.g.nodes for o in n.outputs if o}
        out = []
        for name in names:
            v = self._value(name, 0)
            if v is None:
                return None
            out.append(v)
        return out

    def _value(self, name: str, depth: int):
        if name in self.memo:
            return self.memo[name]
        self.memo[name] = None   # a cycle or a failure below answers "not constant"
        value = self.g.lookup(name)
        if value is None:
            return None
        if value.const is not None:
            self.memo[name] = value.const
            return value.const
        node = self.producer.get(name)
        if node is None or node.op not in ("Kernel", "View") or depth > 64 or value.shape is None \
                or len(node.outputs) != 1 or (node.op == "Kernel" and getattr(node.attrs["kernel"], "kind", None)):
            return None
        size = math.prod(value.shape)
        ins = []
        for x in node.inputs:
            v = self._value(x, depth + 1) if x else None
            if v is None:
                return None
            ins.append(v)
        once = node.op == "Kernel" and same_along_axis0(node.attrs["kernel"], ins)   # a batch of copies: one made
        if self.spent + (size // value.shape[0] if once else size) > CONE_ELEMENTS:
            return None
        if once:
            k = node.attrs["kernel"]
            self.spent += size // k.shape[0]
            one = run_kernel(replace(k, shape=(1, *k.shape[1:])), [_widened(a) for a in ins])
            self.memo[name] = np.broadcast_to(one, k.shape)
            return self.memo[name]
        self.spent += size
        got = dict(zip([x for x in node.inputs if x], ins))
        self.memo[name] = run_node(node, lambda n, wide=False: _widened(got[n]) if wide else got[n], value)
        return self.memo[name]


def _mask_view(buf: np.ndarray, offset: int, dims: list, strides: list) -> np.ndarray:
    """The mask's view of its buffer; a buffer that the cone made as one slice broadcast over its first axis
    (same_along_axis0) gives the view's first slice alone where that axis is the view's first (the same
    answer from is_causal, without the batch of copies made)."""
    per = math.prod(buf.shape[1:])
    reach = offset + sum((d - 1) * st for d, st in zip(dims[1:], strides[1:]))   # the view's last element in slice 0
    if buf.ndim > 1 and buf.strides[0] == 0 and dims[0] > 1 and strides[0] == per and 0 <= offset <= reach < per:
        return strided(np.ascontiguousarray(buf[:1]), offset, [1, *dims[1:]], strides)
    return strided(buf, offset, dims, strides)


def same_along_axis0(k: K.Kernel, inputs: list) -> bool:
    """Is k's output the same at every index of its first axis? So where every input is the same along its own
    first axis (a broadcast, or equal slices: the batch of a mask made from the shapes) and the body reads
    the output's first index only to choose an input's first index: whichever it chooses, the load is the
    same. A [batch, 1, S, T] mask is then computed once, not batch times."""
    if len(k.shape) < 2 or k.shape[0] == 1 or not all(_equal_slices(a) for a in inputs):
        return False

    def free_of_axis0(e: K.Expr) -> bool:
        if e.op == "idx":
            return e.args[0] != 0
        if e.op == "load":
            _, index, mask, other = e.args
            return all(free_of_axis0(x) for x in (*index[1:], mask, other) if x is not None) and \
                (not index or _loads_only(index[0], free_of_axis0))
        return all(free_of_axis0(c) for c in K.children(e))
    return free_of_axis0(k.body)


def _loads_only(e: K.Expr, inner) -> bool:
    """A load's first index may use the output's first index as it likes, but the loads inside it must
    themselves be free of it (inner), as must nothing else."""
    if e.op == "load":
        return inner(e)
    return all(_loads_only(c, inner) for c in K.children(e))


def _equal_slices(a) -> bool:
    a = np.asarray(a)
    return a.ndim == 0 or a.shape[0] == 1 or a.strides[0] == 0 or bool(np.array_equal(a, np.broadcast_to(a[:1], a.shape)))


def _widened(a):
    return _widen(np.ascontiguousarray(a))


def causal_by_index(k: AttentionKernel) -> AttentionKernel:
    """k with its causal mask, found exactly the band (causal_instead), as a comparison of the query and key
    indices: the score keeps its scaled product where key j <= query i + T - S and is -inf elsewhere, and reads
    nothing but the product. Where the mask held 0 the score is the same number; where it held -inf or at most
    CAUSAL_HIDDEN, exp gives 0 either way (is_causal). The GPU kernel skips the key tiles past the band."""
    rank = len(k.score.shape)
    i, j = K.idx(rank - 2), K.idx(rank - 1)
    offset = k.seq_k - k.seq_q
    visible = K.binary("le", j, K.binary("add", i, K.const(offset, "int64")))
    body = K.where(visible, _unmasked(k.score.body), K.const(float("-inf"), k.score.dtype))
    score = replace(k.score, body=body, inputs=k.score.inputs[:1])
    return replace(k, score=score, inputs=k.inputs[:3], causal_offset=offset)


def _unmasked(e: K.Expr) -> K.Expr:
    """The score without its mask terms (split_score's form, the same casts kept): the scaled product."""
    if e.op == "cast":
        return K.cast(_unmasked(e.args[0]), e.dtype)
    if e.op == "add":
        a, b = e.args
        return _unmasked(a if reads_raw(a) else b)
    if e.op == "where" and not reads_raw(e.args[0]):
        _, a, b = e.args
        return _unmasked(b if a.is_const and a.value == float("-inf") else a)
    return e


def _unread_axes_shrunk(k: K.Kernel) -> K.Kernel:
    """k with each output axis that its body never indexes cut to one (the values repeat along it): a mask
    [batch, 1, S, T] built from constants is checked once, not batch times."""
    read = {e.args[0] for e in K.walk(k.body) if e.op == "idx"}
    shape = tuple(d if a in read or a >= len(k.shape) - 2 else 1 for a, d in enumerate(k.shape))
    return k if shape == tuple(k.shape) else replace(k, shape=shape)


def is_causal(mask: np.ndarray) -> bool:
    """mask [..., S, T]: 0 where key j <= query i + T - S, at most CAUSAL_HIDDEN (or -inf) elsewhere,
    for every leading index: adding it to the scores is softmax's causal band (exp of a score
    CAUSAL_HIDDEN below the row's largest is 0 in float32)."""
    s, t = mask.shape[-2:]
    if s > t:
        return False
    m = np.asarray(mask, np.float32)
    return bool(np.all(np.where(causal_band(s, t), m == 0, m <= CAUSAL_HIDDEN)))


def reads_raw(e: K.Expr) -> bool:
    return any(x.op == "load" and x.args[0] == 0 for x in K.walk(e))
