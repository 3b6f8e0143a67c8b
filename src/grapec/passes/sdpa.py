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
tiles past the band (passes/causal_mask.py); the kernels that made the mask go. Anything else (a score that
scales after the mask, a product read twice) keeps the generated kernel, as do operands cuDNN
cannot address: columns not contiguous, rows not 16-byte aligned, a dimension broadcast over heads,
q and v of different widths.

attention: "auto" (the cost model, where the profile prices cuDNN), "kernel" (never cuDNN) or
"cudnn" (cuDNN wherever the score and operands allow; where they do not, a compile note says why,
and --strict fails on it).
"""
from __future__ import annotations

import math

from ..cost.device import DeviceProfile
from ..cost.model import CUDNN_SDPA_MIB_PER_SIZE, NODE_UPDATE_US, price_attention
from ..ir import kernel as K
from ..ir.attention import AttentionKernel, Operand
from ..ir.graph import Graph, Node
from .causal_mask import ConstantCone, causal_by_index, causal_instead, drop_unread, reads_raw

ATTENTION_ENGINES = ("auto", "kernel", "cudnn")
ALIGN = 8            # elements of a half type in 16 bytes: cuDNN's operand alignment
MIN_QUERY_ROWS = 64  # auto: cuDNN's kernels tile 64-128 query rows; a decode step's few rows leave them empty
MAX_HEAD_DIM = 128
# A range's cuDNN plans may take this much device memory: issue 33 bounds a range bundle's memory by its
# weights + 1.2 x its largest arena + 64 MiB, of which cuBLASLt's workspaces and the handles take ~52.
RANGE_CUDNN_MIB = 8.0


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
    cone = ConstantCone(g)
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
        if causal_instead(g, node, attrs, bias, causal, cone):
            bias = None   # cuDNN takes the band; the generated kernel compares indices and skips the tiles past it
            kernel = causal_by_index(kernel)
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
    drop_unread(g, dropped)
    return g


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
        if reads_raw(b):
            a, b = b, a
        if reads_raw(b) or not reads_raw(a):
            return None
        inner = _split(a)
        return None if inner is None else (inner[0], inner[1] + [b])
    if e.op == "where" and not reads_raw(e.args[0]):
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
