"""attention_engines: each fused attention (ir/attention.py) runs as the generated flash kernel or as
cuDNN's SDPA (an `sdpa` library step, ir/library.py), whichever the cost model prices lower.

The generated kernel wins where launches bind (batch 1: BERT s128, 12 heads, 4.1 us against
cuDNN's 6.9 on an H100); cuDNN's wins where arithmetic does (32 x 12 heads: 14.5 us against 27.8,
benchmarks/attention_batch.py). cuDNN takes a score of the form

    scale * (q @ kᵀ) + B        (or Where(C, that, -inf): B gets where(C, 0, -inf))

where B does not read the product: an additive mask. B that is one load of a half buffer shaped
[B|1, H|1, S, T] is read where it lies; any other B (BERT's Where on two boolean masks) is written
by a kernel of its own into such a buffer first, and priced with it (layers with the same mask
share that kernel). A mask that is exactly a causal band (GPT-2's, folded to [B, 1, S, T], or
computed from the shapes by kernels that a range of sizes keeps) is not read at all: cuDNN takes its
causal band, and the generated kernel compares the query and key indices instead, skipping the key
tiles past the band (_causal_instead, _causal_by_index); the kernels that made the mask go. Anything else (a score that
scales after the mask, a product read twice) keeps the generated kernel, as do operands cuDNN
cannot address: columns not contiguous, rows not 16-byte aligned, a dimension broadcast over heads,
q and v of different widths.

attention: "auto" (the cost model, where the profile prices cuDNN), "kernel" (never cuDNN) or
"cudnn" (cuDNN wherever the score and operands allow; where they do not, a compile note says why,
and --strict fails on it).
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from ..cost.device import DeviceProfile
from ..cost.model import CUDNN_SDPA_MIB_PER_SIZE, NODE_UPDATE_US, price_attention
from ..ir import kernel as K
from ..ir.attention import AttentionKernel, Operand
from ..ir.evaluate import run_node
from ..ir.graph import Graph, Node, outer_reads
from ..ir.interpret import _widen, run_kernel
from ..ir.library import causal_band, strided

ATTENTION_ENGINES = ("auto", "kernel", "cudnn")
ALIGN = 8            # elements of a half type in 16 bytes: cuDNN's operand alignment
MIN_QUERY_ROWS = 64  # auto: cuDNN's kernels tile 64-128 query rows; a decode step's few rows leave them empty
MAX_HEAD_DIM = 128
CAUSAL_HIDDEN = -1e4  # a mask value that hides a key: exporters write -inf, finfo.min (-65504 in half) or -1e4
# A range's cuDNN plans may take this much device memory: issue 33 bounds a range bundle's memory by its
# weights + 1.2 x its largest arena + 64 MiB, of which cuBLASLt's workspaces and the handles take ~52.
RANGE_CUDNN_MIB = 8.0
# A mask computed from constants alone (a range keeps GPT-2's, made from the shapes, computed rather than
# stored per size) is evaluated to see whether it is the causal band, up to this many elements in all.
CONE_ELEMENTS = 1 << 22


def attention_engines(g: Graph, profile: DeviceProfile | None, attention: str = "auto", notes: list | None = None,
                      sizes: int = 1) -> Graph:
    """sizes: how many sizes the bundle holds. With several, cuDNN's node has a launch per size, which a
    switch between them sets (cost/model.py NODE_UPDATE_US of host time, added to cuDNN's price), and a
    plan per size, each with device memory of its own: past RANGE_CUDNN_MIB of them, "auto" keeps the
    generated kernel, which reads its sizes at run time (one node for every size, no memory per size)."""
    switch_us = NODE_UPDATE_US if sizes > 1 else 0.0
    out = []
    masks: dict = {}   # (kernel, inputs) -> the value that kernel writes: layers with one mask share it
    causal: dict = {}  # a mask's source -> whether it is the causal band: every layer reads the same one
    cone = _ConstantCone(g)
    dropped: list = []   # mask inputs no longer read by attentions that compare indices instead
    for node in g.nodes:
        kernel = node.attrs.get("kernel") if node.op == "Kernel" else None
        if not isinstance(kernel, AttentionKernel):
            out.append(node)
            continue
        made = _as_sdpa(kernel)
        if isinstance(made, str):
            if attention == "cudnn":
                _note(notes, f"attention at '{_where(node)}' stays the generated kernel, not cuDNN: {made}")
            out.append(node)
            continue
        attrs, bias = made
        if _causal_instead(g, node, attrs, bias, causal, cone):
            bias = None   # cuDNN takes the band; the generated kernel compares indices and skips the tiles past it
            kernel = _causal_by_index(kernel)
            dropped += node.inputs[3:]
            node.inputs = list(node.inputs[:3])
            node.attrs = {**node.attrs, "kernel": kernel}
        if attention == "kernel":
            out.append(node)
            continue
        priced = price_attention(kernel, attrs, bias, profile, switch_us) \
            if profile is not None else []
        if attention == "auto" and (kernel.seq_q < MIN_QUERY_ROWS or not priced or priced[0][0] != "cuDNN"):
            out.append(node)
            continue
        if attention == "auto" and sizes * CUDNN_SDPA_MIB_PER_SIZE > RANGE_CUDNN_MIB:
            _note(notes, "attention runs the generated kernel where cuDNN's SDPA is priced faster: "
                         f"in a bundle of {sizes} sizes cuDNN would build a plan for each (about "
                         f"{sizes * CUDNN_SDPA_MIB_PER_SIZE:.0f} MiB of device memory) and set its node at every "
                         "switch between them; --attention cudnn takes it anyway")
            out.append(node)
            continue
        # grapec inspect --fusion shows the generated kernel's estimate as the alternative that lost
        attrs["priced"] = {name: round(us, 2) for name, us in priced}
        inputs = list(node.inputs[:3])
        if bias is not None:
            key = (bias, tuple(node.inputs[3:]))
            if key not in masks:
                value = g.add_value("attention_mask", bias.dtype, bias.shape).name
                out.append(Node("Kernel", list(node.inputs[3:]), [value], name=f"{node.name}_mask",
                                attrs={"kernel": bias}, origin=list(node.origin)))
                masks[key] = value
            inputs.append(masks[key])
        elif "bias" in attrs:
            inputs.append(node.inputs[attrs.pop("bias_input")])
        out.append(Node("Library", inputs, list(node.outputs), name=node.name, attrs=attrs, origin=list(node.origin)))
    g.nodes = out
    _drop_unread(g, dropped)
    return g


def _drop_unread(g: Graph, names: list):
    """The Kernel and View nodes that made `names` (a causal mask and what it was computed from), where
    nothing reads their outputs any more."""
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


def _causal_instead(g: Graph, node: Node, attrs: dict, bias, seen: dict, cone: "_ConstantCone") -> bool:
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
            if consts is not None and _same_along_axis0(bias, consts):   # a batch of one mask: checked once
                bias = replace(bias, shape=(1, *bias.shape[1:]))
            seen[source] = consts is not None and \
                is_causal(run_kernel(_unread_axes_shrunk(bias), [np.asarray(c) for c in consts]))
    if not seen[source]:
        return False
    for key in ("bias", "bias_input"):
        attrs.pop(key, None)
    attrs["causal"] = True
    return True


class _ConstantCone:
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
        once = node.op == "Kernel" and _same_along_axis0(node.attrs["kernel"], ins)   # a batch of copies: one made
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
    (_same_along_axis0) gives the view's first slice alone where that axis is the view's first (the same
    answer from is_causal, without the batch of copies made)."""
    per = math.prod(buf.shape[1:])
    reach = offset + sum((d - 1) * st for d, st in zip(dims[1:], strides[1:]))   # the view's last element in slice 0
    if buf.ndim > 1 and buf.strides[0] == 0 and dims[0] > 1 and strides[0] == per and 0 <= offset <= reach < per:
        return strided(np.ascontiguousarray(buf[:1]), offset, [1, *dims[1:]], strides)
    return strided(buf, offset, dims, strides)


def _same_along_axis0(k: K.Kernel, inputs: list) -> bool:
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


def _causal_by_index(k: AttentionKernel) -> AttentionKernel:
    """k with its causal mask, found exactly the band (_causal_instead), as a comparison of the query and key
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
        return _unmasked(a if _reads_raw(a) else b)
    if e.op == "where" and not _reads_raw(e.args[0]):
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


def _note(notes, text: str):
    if notes is not None and text not in notes:
        notes.append(text)


def _where(node: Node) -> str:
    return node.origin[0] if node.origin else node.name


def _as_sdpa(k: AttentionKernel):
    """-> (the sdpa step's attrs, the kernel writing its bias or None), or why not (a string)."""
    if len(k.batch) > 2:
        return f"{len(k.batch)} batch dimensions (cuDNN takes batch and heads)"
    if k.head_dim != k.value_dim or k.head_dim % ALIGN or k.head_dim > MAX_HEAD_DIM:
        return f"head dimensions {k.head_dim} and {k.value_dim} (cuDNN here: equal, a multiple of {ALIGN}, at most {MAX_HEAD_DIM})"
    if math.prod(k.batch) * k.seq_q * k.value_dim != math.prod(k.shape):
        return "the output does not fill its buffer"
    split = split_score(k.score)
    if split is None:
        return "a score that is not scale * q kᵀ + an additive mask"
    scale, mask = split
    lead = (1,) * (2 - len(k.batch)) + tuple(k.batch)
    views = {}
    for key, op, rows, cols in (("q", k.q, k.seq_q, k.head_dim), ("k", k.k, k.seq_k, k.head_dim),
                                ("v", k.v, k.seq_k, k.value_dim), ("out", k.out, k.seq_q, k.value_dim)):
        view = _four(op, lead, rows, cols)
        if isinstance(view, str):
            return f"{key} {view}"
        views[key] = view
    attrs = {"op": "sdpa", "dims": [*lead, k.seq_q, k.seq_k, k.head_dim, k.value_dim], "scale": scale,
             **views, "out_shape": list(k.shape)}
    if mask is None:
        return attrs, None
    direct = _mask_buffer(mask, k)
    if direct is not None:
        slot, dims, strides = direct
        attrs["bias"] = [0, dims, strides]
        attrs["bias_input"] = 2 + slot   # the score's slot s is the attention's input 2 + s
        return attrs, None
    if any(e.op in ("reduce", "ridx") for e in K.walk(mask)):
        return "a mask with a reduction in it"
    return attrs | {"bias": [0, *_dense(_mask_shape(mask, k))]}, _bias_kernel(k, mask)


def split_score(score: K.Kernel):
    """score = scale * raw + B -> (scale, B or None), raw the product (slot 0) and B free of it; None
    for any other form. B is the sum of the additive terms and of where(C, 0, -inf) for each
    Where(C, ..., -inf) around the product (exact: a finite score plus -inf is -inf)."""
    found = _split(score.body)
    if found is None:
        return None
    scale, terms = found
    if not terms:
        return scale, None
    mask = terms[0]
    for term in terms[1:]:
        mask = K.binary("add", K.cast(mask, "float32"), K.cast(term, "float32"))
    return scale, mask


def _split(e: K.Expr):
    while e.op == "cast":
        e = e.args[0]
    if e.op == "add":
        a, b = e.args
        if _reads_raw(b):
            a, b = b, a
        if _reads_raw(b) or not _reads_raw(a):
            return None
        inner = _split(a)
        return None if inner is None else (inner[0], inner[1] + [b])
    if e.op == "where" and not _reads_raw(e.args[0]):
        cond, a, b = e.args
        ninf = [x.is_const and x.value == float("-inf") for x in (a, b)]
        if ninf[0] == ninf[1]:
            return None
        kept = b if ninf[0] else a
        inner = _split(kept)
        if inner is None:
            return None
        zero, minus = K.const(0.0, kept.dtype), K.const(float("-inf"), kept.dtype)
        return inner[0], inner[1] + [K.where(cond, minus, zero) if ninf[0] else K.where(cond, zero, minus)]
    scale = _scaled_raw(e)
    return None if scale is None else (scale, [])


def _reads_raw(e: K.Expr) -> bool:
    return any(x.op == "load" and x.args[0] == 0 for x in K.walk(e))


def _scaled_raw(e: K.Expr):
    """The constant c when e is c * raw (through casts, products and quotients by constants)."""
    while e.op == "cast":
        e = e.args[0]
    if e.op == "load" and e.args[0] == 0:
        return 1.0
    if e.op == "mul":
        a, b = e.args
        if a.is_const:
            a, b = b, a
        inner = _scaled_raw(a) if b.is_const else None
        return None if inner is None else inner * float(b.value)
    if e.op == "div" and e.args[1].is_const and float(e.args[1].value) != 0.0:
        inner = _scaled_raw(e.args[0])
        return None if inner is None else inner / float(e.args[1].value)
    return None


def _four(op: Operand, lead: tuple, rows: int, cols: int):
    """An attention operand as cuDNN's [batch, heads, rows, cols] strides, or why it cannot be."""
    strides = [0] * (2 - (len(op.strides) - 2)) + list(op.strides)
    dims = [*lead, rows, cols]
    if strides[3] != 1 and cols > 1:
        return "columns are not contiguous"
    strides[3] = 1
    for i in (2, 1, 0):   # a dimension of one: any stride; cuDNN is given the packed one
        if dims[i] == 1:
            strides[i] = strides[i + 1] * dims[i + 1]
        elif strides[i] == 0:
            return "is broadcast along a dimension (grouped heads)"
    if op.offset % ALIGN or any(s % ALIGN for s in strides[:3]):
        return f"rows are not {ALIGN}-element aligned"
    return [op.offset, strides]


def _mask_buffer(mask: K.Expr, k: AttentionKernel):
    """(the score's slot, 4-D dims, strides) when the mask is one load of a buffer of the
    attention's type shaped [B|1, H|1, S, T] at the score's own index, else None."""
    while mask.op == "cast" and mask.args[0].op == "load":
        mask = mask.args[0]
    if mask.op != "load" or mask.args[2] is not None or mask.dtype != k.dtype:
        return None
    slot, index = mask.args[0], mask.args[1]
    shape, dtype = k.score.inputs[slot]
    if dtype != k.dtype or len(shape) != len(k.score.shape):
        return None
    for a, (i, n) in enumerate(zip(index, shape)):
        full = i.op == "idx" and i.args[0] == a and n == k.score.shape[a]
        if not (full or (i.is_const and i.value == 0 and n == 1)) or (a >= len(shape) - 2 and not full):
            return None
    dims = [1] * (4 - len(shape)) + list(shape)
    return slot, *_dense(dims)


def _dense(dims: list) -> tuple:
    strides, acc = [0] * 4, 1
    for i in (3, 2, 1, 0):
        strides[i] = acc
        acc *= dims[i]
    return list(dims), strides


def _mask_shape(mask: K.Expr, k: AttentionKernel) -> list:
    """[B|1, H|1, S, T]: the batch dimensions the mask varies along are kept."""
    used = {e.args[0] for e in K.walk(mask) if e.op == "idx"}
    nb = len(k.batch)
    batch = [n if a in used else 1 for a, n in enumerate(k.batch)]
    return [1] * (2 - nb) + batch + [k.seq_q, k.seq_k]


def _bias_kernel(k: AttentionKernel, mask: K.Expr) -> K.Kernel:
    """A kernel writing the mask (in the attention's type) over _mask_shape, reading the attention's
    extra inputs: the score's slots 1.. become its slots 0.. (a batch dimension of one is one the
    mask does not read)."""
    shape = _mask_shape(mask, k)
    shift = 2 - len(k.batch)   # score dimension a is the bias's a + shift (batch dims padded to two)
    own = tuple(K.idx(a + shift) for a in range(len(k.score.shape)))

    def relabel(ld):
        slot, index, m, other = ld.args
        return K.load(slot - 1, index, ld.dtype, m, other)
    return K.Kernel(tuple(shape), k.dtype, K.cast(K.rebuild(mask, own, relabel), k.dtype), tuple(k.score.inputs[1:]))


__all__ = ["attention_engines", "ATTENTION_ENGINES", "split_score"]
