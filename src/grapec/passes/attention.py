"""fuse_attention: GEMM → softmax kernel → GEMM becomes one flash-attention kernel (ir/attention.py).

Exporters spell attention as MatMul(q, kᵀ), then whatever the model does to the scores (a scale, an
additive mask, a Where on a causal mask), Softmax over the keys, and MatMul(p, v). After lowering,
fusion and strided_operands that is three plan steps: a matmul whose operands are views into the
QKV projection, one row-mode kernel holding the score expression and the softmax, and a matmul that
writes merged heads in place. This pass recognises the softmax in the middle kernel's IR

    [cast](div(exp(sub(X, max_r X[j→r])), sum_r exp(sub(X[j→r], max))))

takes X, the score, as a kernel of its own (the raw product a load at the kernel's index), and
replaces the three steps by one AttentionKernel that reads q, k and v through the matmuls' views and
writes through the second one's output view. The scores and probabilities then never leave the chip.

It fuses fp16 and bf16 (the kernel runs on tensor cores); what it leaves as three steps, and why, is
reported at compile time.
"""
from __future__ import annotations

from collections import Counter

from ..ir import kernel as K
from ..ir.attention import AttentionKernel, Operand
from ..ir.library import view_strides
from ..ir.graph import Graph, Node
from .fuse import drop_unused

HALF_TYPES = ("float16", "bfloat16")
# q·k and p·v accumulators live in registers: 16 rows x head_dim per warp. At 256 they spill (255 registers,
# 5 KB of spill stores a thread): GPT-J-6B's decode token took 5.86 ms with its attention fused at head_dim 256,
# 4.35 with GEMM + softmax + GEMM (H200, 2026-11-29, benchmarks/results/2026-11-29-h200-s60)
MAX_HEAD_DIM = 128


def fuse_attention(g: Graph, notes: list | None = None) -> Graph:
    producers = g.producers()
    readers = Counter({name: len(users) for name, users in g.consumers().items()})
    pinned = set(g.outputs)
    for node in list(g.nodes):
        if not _is_matmul(node):
            continue
        found = _pattern(node, producers, readers, pinned)
        if found is None:
            unfused = _softmax_not_after_product(g, node, producers, readers, pinned)
            if unfused is not None and notes is not None:
                note = (f"attention at '{unfused}' stays GEMM + kernels + GEMM: the scores reach the softmax through "
                        "a kernel of their own (a mask or scale the softmax kernel did not take in)")
                if note not in notes:
                    notes.append(note)
            continue
        fused = _attention(g, *found)
        if isinstance(fused, str):
            if notes is not None:
                note = f"attention at '{', '.join(found[1].origin[:1])}' stays GEMM + softmax + GEMM: {fused}"
                if note not in notes:
                    notes.append(note)
            continue
        qk, soft, pv, _ = found
        g.nodes[g.nodes.index(pv)] = fused
        g.nodes = [n for n in g.nodes if n is not qk and n is not soft]
    return drop_unused(g)


def _is_matmul(n: Node) -> bool:
    return n.op == "Library" and n.attrs.get("op") == "matmul"


def _plain(n: Node) -> bool:
    """A product with nothing folded in: no C operand, bias, activation or alpha."""
    extra = [i for i in n.inputs[2:] if i]
    return not extra and n.attrs.get("act", "") in ("", "none") and n.attrs.get("alpha", 1.0) == 1.0


def _pattern(pv: Node, producers, readers, pinned):
    """-> (qk matmul, softmax kernel, pv matmul, the score's slot in the softmax kernel) when pv's
    first operand is a softmax of a product (either through reshapes), each read by the next alone."""
    soft = _softmax_feeding(pv, producers, readers, pinned)
    if soft is None:
        return None
    for slot, name in enumerate(soft.inputs):
        qk = _source(name, producers, readers, pinned)
        if qk is not None and _is_matmul(qk) and soft.inputs.count(name) == 1:
            return qk, soft, pv, slot
    return None


def _softmax_feeding(pv: Node, producers, readers, pinned):
    """The kernel computing a softmax over the last axis that pv's first operand is (through reshapes,
    read by pv alone), else None."""
    soft = _source(pv.inputs[0], producers, readers, pinned)
    if soft is None or soft.op != "Kernel" or not isinstance(soft.attrs["kernel"], K.Kernel):
        return None
    return soft if _softmax_score(soft.attrs["kernel"]) is not None else None


def _softmax_not_after_product(g: Graph, pv: Node, producers, readers, pinned):
    """The softmax's ONNX node name where pv multiplies a half softmax of scores that come from a
    kernel, not straight from a product (what _pattern needs); else None."""
    soft = _softmax_feeding(pv, producers, readers, pinned)
    if soft is None or g.lookup(pv.inputs[0]).dtype not in HALF_TYPES:
        return None
    return (soft.origin or [soft.name])[0]


def _source(name: str, producers, readers, pinned):
    """The node that computes `name`, through reshapes (Views), when each value on the way is read
    once and is not a graph output; else None."""
    while True:
        node = producers.get(name)
        if node is None or readers[name] != 1 or name in pinned:
            return None
        if node.op != "View":
            return node
        name = node.inputs[0]


def _softmax_score(k: K.Kernel):
    """X when k's body is a softmax of X over the last axis (see the module docstring), else None."""
    body = k.body
    if body.op == "cast":
        body = body.args[0]
    if body.op != "div" or body.args[0].op != "exp" or body.args[0].args[0].op != "sub":
        return None
    x, mx = body.args[0].args[0].args
    last = len(k.shape) - 1
    if mx.op != "reduce" or mx.args[0] != "max" or len(mx.args[2]) != 1:
        return None
    r = mx.args[2][0]
    if r.args[1] != k.shape[last] or mx.args[1] is not _at_last(x, r, last):
        return None
    total = body.args[1]
    if total.op != "reduce" or total.args[0] != "sum" or len(total.args[2]) != 1:
        return None
    r2 = total.args[2][0]
    term = total.args[1]
    if term.op != "exp" or term.args[0].op != "sub" or term.args[0].args != (_at_last(x, r2, last), mx):
        return None
    if any(e.op in ("reduce", "ridx") for e in K.walk(x)):
        return None
    return x


def _at_last(x, r, last: int):
    return K.rebuild(x, tuple(r if a == last else K.idx(a) for a in range(last + 1)))


def _attention(g: Graph, qk: Node, soft: Node, pv: Node, slot: int):
    """-> the fused node, or why not (a string)."""
    sk = soft.attrs["kernel"]
    # a product of halves into float32 scores (passes/upcast_operands.py) is what the kernel's accumulators hold
    dt = g.lookup(qk.inputs[0] if qk.attrs.get("out_dtype") else qk.outputs[0]).dtype
    if dt not in HALF_TYPES:
        return f"{dt} (the fused kernel runs fp16/bf16 on tensor cores)"
    if not (_plain(pv) and len([i for i in qk.inputs[2:] if i]) == 0 and qk.attrs.get("act", "") in ("", "none")):
        return "a product with a bias, residual or activation folded in"
    if pv.attrs.get("trans_a") or "0" in (pv.attrs.get("views") or {}) or "out" in (qk.attrs.get("views") or {}):
        return "the probabilities are not read as they are written"
    shape = sk.shape
    *batch, s, t = shape
    if sk.inputs[slot][0] != tuple(shape) or any(
            tuple(g.lookup(n).shape[-2:]) != (s, t) for n in (qk.outputs[0], pv.inputs[0])):
        return "the scores are broadcast or reshaped into the softmax"
    x = _softmax_score(sk)
    for e in K.walk(x):
        if e.op == "load" and e.args[0] == slot and (e.args[2] is not None or not _identity(e.args[1], shape)):
            return "the softmax reads the scores at another index"
    q = _operand(g, qk, 0, batch)
    kt = _operand(g, qk, 1, batch)
    v = _operand(g, pv, 1, batch)
    out = _output(g, pv, batch)
    if None in (q, kt, v, out) or q[0][-2] != s or kt[0][-1] != t or v[0][-2] != t or q[0][-1] != kt[0][-2]:
        return "operands whose batch dimensions do not line up"
    d, dv = q[0][-1], v[0][-1]
    if out[0] != (*batch, s, dv):
        return "an output of another shape"
    if max(d, dv) > MAX_HEAD_DIM:
        return f"head dimension {max(d, dv)} > {MAX_HEAD_DIM}"
    names = [qk.inputs[0], qk.inputs[1], pv.inputs[1]]
    if any(g.lookup(n).dtype != dt for n in names) or g.lookup(pv.outputs[0]).dtype != dt:
        return "operands of mixed element types"
    extras = [n for i, n in enumerate(soft.inputs) if i != slot]
    extra_slot = {i: j + 1 for j, i in enumerate(i for i in range(len(soft.inputs)) if i != slot)}
    alpha = float(qk.attrs.get("alpha", 1.0))

    def relabel(ld):
        s_, index, mask, other = ld.args
        if s_ == slot:
            raw = K.load(0, index, ld.dtype)
            return raw if alpha == 1.0 else raw * K.const(alpha, ld.dtype)
        return K.load(extra_slot[s_], index, ld.dtype, mask, other)

    score = K.Kernel(tuple(shape), x.dtype, K.rebuild(x, None, relabel),
                     ((tuple(shape), dt),) + tuple(sk.inputs[i] for i in range(len(soft.inputs)) if i != slot))
    k_operand = Operand(kt[1].offset, (*kt[1].strides[:-2], kt[1].strides[-1], kt[1].strides[-2]))
    inputs = tuple((tuple(g.lookup(n).shape), dt) for n in names) + score.inputs[1:]
    attn = AttentionKernel(tuple(g.lookup(pv.outputs[0]).shape), dt, inputs, tuple(batch), s, t, d, dv,
                           q[1], k_operand, v[1], out[1], score)
    return Node("Kernel", names + extras, [pv.outputs[0]], name=f"attention_{pv.name or pv.outputs[0]}",
                attrs={"kernel": attn}, origin=list(dict.fromkeys(qk.origin + soft.origin + pv.origin)))


def _identity(index, shape) -> bool:
    return all((i.op == "idx" and i.args[0] == a) or (shape[a] == 1 and i.op == "const")
               for a, i in enumerate(index))


def _operand(g: Graph, node: Node, slot: int, batch: list):
    """Matmul operand -> (logical shape [*batch, rows, cols] after trans_*, Operand), or None."""
    view = (node.attrs.get("views") or {}).get(str(slot))
    trans = node.attrs.get("trans_a" if slot == 0 else "trans_b")
    return _layout(tuple(g.lookup(node.inputs[slot]).shape), view, bool(trans), batch)


def _output(g: Graph, node: Node, batch: list):
    return _layout(tuple(g.lookup(node.outputs[0]).shape), (node.attrs.get("views") or {}).get("out"), False, batch)


def _layout(buf_shape: tuple, view, trans: bool, batch: list):
    if view is not None:
        offset, shape, strides = view_strides(view)
    else:
        offset, shape = 0, buf_shape
        if len(shape) < 2:
            return None
        strides, acc = [0] * len(shape), 1
        for i in range(len(shape) - 1, -1, -1):
            strides[i] = acc if shape[i] > 1 else 0
            acc *= shape[i]
    rows, cols = shape[-2:]
    rs, cs = strides[-2:]
    if trans:
        rows, cols, rs, cs = cols, rows, cs, rs
    bshape, bstrides = list(shape[:-2]), list(strides[:-2])
    if len(bshape) > len(batch):
        return None
    pad = len(batch) - len(bshape)
    bshape, bstrides = [1] * pad + bshape, [0] * pad + bstrides
    for i, (have, want) in enumerate(zip(bshape, batch)):
        if have != want:
            if have != 1:
                return None
            bstrides[i] = 0
    return (*batch, rows, cols), Operand(int(offset), tuple(int(x) for x in (*bstrides, rs, cs)))


__all__ = ["fuse_attention", "MAX_HEAD_DIM"]
