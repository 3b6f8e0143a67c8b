"""MatMul and Gemm as `matmul` Library nodes, and the other NN ops built on products: TopK, Einsum,
Attention, RotaryEmbedding. (Convolutions: conv.py; pooling: pool.py.)

MatMul/Gemm lower to one `matmul` Library node (transposes, alpha, beta*C folded in, as cuBLASLt
takes them).
"""
from __future__ import annotations

import math

import numpy as np

from .. import dtypes
from ..ir import kernel as K
from ..ir.tensor import T, broadcast_shapes, cast, expand, map_, norm_axis, reshape, transpose
from ..ir.tensor import reduce as tensor_reduce
from . import op
from .selection import ranked
from .window import _acc_dtype, _and, _masked_at


def matmul_shape(a_shape, b_shape):
    """numpy.matmul semantics, 1-D operands promoted and the added dims removed afterwards."""
    a2 = (1,) + tuple(a_shape) if len(a_shape) == 1 else tuple(a_shape)
    b2 = tuple(b_shape) + (1,) if len(b_shape) == 1 else tuple(b_shape)
    if a2[-1] != b2[-2]:
        raise ValueError(f"inner dims differ: {list(a_shape)} @ {list(b_shape)}")
    batch = broadcast_shapes(a2[:-2], b2[:-2], what="MatMul batch dims")
    return a2, b2, batch + (a2[-2], b2[-1])


def numpy_matmul(ctx, a, b, dtype: str, a_shape=None, b_shape=None):
    """A `matmul` Library node with numpy.matmul semantics (1-D operands promoted and demoted).
    a_shape/b_shape: the operands' original shapes when a, b are already cast views of them."""
    a_shape, b_shape = a_shape or a.shape, b_shape or b.shape
    a2, b2, out = matmul_shape(a_shape, b_shape)
    y = ctx.library("matmul", [reshape(a, a2), reshape(b, b2)], {}, out, dtype)
    return demote_matmul_result(y, a_shape, b_shape)


def demote_matmul_result(y: T, a_shape, b_shape) -> T:
    """Drop the dims numpy.matmul added for 1-D operands from the product y."""
    final = list(y.shape)
    if len(b_shape) == 1:
        final.pop(-1)
    if len(a_shape) == 1:
        final.pop(-2 if len(b_shape) != 1 else -1)
    return reshape(y, final)


@op("MatMul")
def matmul(ctx):
    """`simplify` may have folded a Transpose of the last two dims of an operand into the node
    (internal attrs grapec_trans_a / grapec_trans_b): the library reads the stored operand
    transposed, so e.g. GPT-2's tied lm_head weight is never copied."""
    a, b = ctx.input(0), ctx.input(1)
    ta, tb = int(ctx.attr("grapec_trans_a", 0)), int(ctx.attr("grapec_trans_b", 0))
    if not (ta or tb):
        return [numpy_matmul(ctx, a, b, a.dtype)]
    swap = lambda s: tuple(s[:-2]) + (s[-1], s[-2])  # noqa: E731
    a_eff, b_eff = swap(a.shape) if ta else a.shape, swap(b.shape) if tb else b.shape
    a2, b2, out = matmul_shape(a_eff, b_eff)
    a_st, b_st = swap(a2) if ta else a2, swap(b2) if tb else b2
    y = ctx.library("matmul", [reshape(a, a_st), reshape(b, b_st)], {"trans_a": ta, "trans_b": tb}, out, a.dtype)
    return [demote_matmul_result(y, a_eff, b_eff)]


@op("Gemm")
def gemm(ctx):
    a, b, c = ctx.input(0), ctx.input(1), ctx.input(2)
    ta, tb = ctx.attr("transA", 0), ctx.attr("transB", 0)
    m = a.shape[1] if ta else a.shape[0]
    n = b.shape[0] if tb else b.shape[1]
    attrs = {"trans_a": int(ta), "trans_b": int(tb), "alpha": float(ctx.attr("alpha", 1.0)),
             "beta": float(ctx.attr("beta", 1.0))}
    ins = [a, b]
    if c is not None and attrs["beta"] != 0.0:
        if c.shape in ((n,), (1, n)) and attrs["beta"] == 1.0:
            ins += [None, reshape(c, (n,))]     # a bias vector: cuBLASLt's BIAS epilogue
        else:
            ins.append(expand(c, (m, n)) if c.shape != (m, n) else c)
    return [ctx.library("matmul", ins, attrs, (m, n), a.dtype)]


# --- TopK ----------------------------------------------------------------------------------------

def _fixed(v) -> bool:
    return v.bounds is not None and np.array_equal(*v.bounds)


@op("TopK")
def topk(ctx):
    """The k largest (or smallest) along axis, best first, ties broken by lower index, NaN last (one
    TopKKernel for the indices, ir/selection.py; the values are gathered by them). k from input 1
    (opset >= 10) or the attribute (opset 1); a run-time k is bounded by the axis's length, and the
    output's axis is then data-dependent (ops/counted.py)."""
    x = ctx.input(0)
    axis = norm_axis(int(ctx.attr("axis", -1)), x.ndim)
    dim = x.shape[axis]
    if ctx.has(1) and ctx.value(1).const is None and not _fixed(ctx.value(1)):
        k, k_arg = None, ctx.buffer(cast(reshape(ctx.input(1), (1,)), "int64"), "topk_k")
        if ctx.value(1).bounds is not None:   # k = min(candidates, a count): its upper bound bounds the output
            dim = min(dim, max(int(np.asarray(ctx.value(1).bounds[1]).max()), 0))
    else:
        k = int(ctx.const(1, "K").reshape(-1)[0]) if ctx.has(1) else int(ctx.attr("k"))
        if not 0 <= k <= dim:
            ctx.fail(f"k={k} out of range for axis of size {dim}")
        k_arg = ctx.graph.add_value("topk_k", "int64", (1,), np.array([k], np.int64)).name
    shape = list(x.shape)
    shape[axis] = dim if k is None else k
    indices = ranked(ctx, x, axis, k_arg, shape[axis], bool(ctx.attr("largest", 1)))

    def value(ix):
        at = indices.at(ix)
        at = K.where(K.binary("lt", at, K.const(0, "int64")), K.const(0, "int64"), at)
        return x.at(ix[:axis] + (at,) + ix[axis + 1:])
    values = T(tuple(shape), x.dtype, value)
    if k is None:
        kt = ctx.tensor(ctx.graph.lookup(k_arg))
        count = ctx.realize(T((), "int64", lambda ix: K.binary("max", K.binary("min", kt.at((K.const(0, "int64"),)),
                                                                               K.const(dim, "int64")),
                                                                  K.const(0, "int64"))), "topk_count")
        for j in (0, 1):
            ctx.count_output(j, axis, count, dim, f"k read at run time, at most {dim} (the axis, or k's own bound)")
    return [values, indices]


# --- Einsum --------------------------------------------------------------------------------------

_ELLIPSIS_LABELS = "0123456789"


def _einsum_terms(ctx, shapes):
    """Input label strings and the output's, '...' replaced by digit labels (right-aligned, so
    operands with fewer ellipsis dims broadcast); implicit output = ellipsis dims, then the labels
    used once, alphabetically."""
    eq = ctx.attr("equation")
    eq = (eq.decode() if isinstance(eq, bytes) else eq).replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        ctx.fail(f"equation {eq!r} has {len(terms)} operands, the node {len(shapes)}")
    ell = max([len(s) - (len(t) - 3) for t, s in zip(terms, shapes) if "..." in t], default=0)
    ell_labels = _ELLIPSIS_LABELS[:ell]
    out_terms = []
    for t, s in zip(terms, shapes):
        if "..." in t:
            n = len(s) - (len(t) - 3)
            t = t.replace("...", ell_labels[ell - n:])
        if len(t) != len(s):
            ctx.fail(f"einsum term {t!r} does not match operand rank {len(s)}")
        out_terms.append(t)
    if arrow:
        out = rhs.replace("...", ell_labels)
    else:
        letters = "".join(out_terms)
        out = ell_labels + "".join(sorted(c for c in set(letters) if c.isalpha() and letters.count(c) == 1))
    return out_terms, out


@op("Einsum")
def einsum(ctx):
    """Two operands with a contraction become one batched `matmul` Library node (labels summed in
    one operand only are reduced first); anything else (one operand, diagonals, 3+ operands, outer
    products) is a single kernel-IR sum of products."""
    xs = [ctx.input(i) for i in range(ctx.n_inputs)]
    terms, out = _einsum_terms(ctx, [x.shape for x in xs])
    sizes = {}
    for t, x in zip(terms, xs):
        for c, d in zip(t, x.shape):
            if sizes.get(c, 1) != 1 and d not in (1, sizes[c]):
                ctx.fail(f"label {c!r} has sizes {sizes[c]} and {d}")
            sizes[c] = max(sizes.get(c, 1), d)
    unique = all(len(set(t)) == len(t) for t in terms) and len(set(out)) == len(out)
    if len(xs) == 2 and unique and (set(terms[0]) & set(terms[1])) - set(out):
        return [_einsum_matmul(ctx, xs, terms, out, sizes)]
    return [_einsum_reduce(xs, terms, out, sizes)]


def _einsum_reduce(xs, terms, out, sizes):
    summed = sorted(set("".join(terms)) - set(out))
    shape = tuple(sizes[c] for c in out)
    dt = xs[0].dtype
    acc = _acc_dtype(dt)

    def fn(ix):
        var = {c: ix[i] for i, c in enumerate(out)}
        rv = {c: K.ridx(sizes[c]) for c in summed}
        var.update(rv)
        zero = K.const(0, "int64")
        prod = None
        for t, x in zip(terms, xs):
            e = K.cast(x.at(tuple(zero if d == 1 else var[c] for c, d in zip(t, x.shape))), acc)
            prod = e if prod is None else K.binary("mul", prod, e)
        return K.cast(K.reduce("sum", prod, tuple(rv.values())), dt)
    return T(shape, dt, fn)


def _einsum_matmul(ctx, xs, terms, out, sizes):
    xs, terms = list(xs), list(terms)
    # labels summed within one operand are reduced away first
    for which in (0, 1):
        t, other = terms[which], terms[1 - which]
        alone = [i for i, c in enumerate(t) if c not in other and c not in out]
        if alone:
            xs[which] = tensor_reduce(xs[which], alone, "sum", keepdims=False)
            terms[which] = "".join(c for i, c in enumerate(t) if i not in alone)
    (a, b), (ta, tb) = xs, terms
    batch = [c for c in out if c in ta and c in tb]
    m = [c for c in out if c in ta and c not in tb]
    n = [c for c in out if c in tb and c not in ta]
    k = [c for c in ta if c in tb and c not in out]

    def arrange(x, t, order):
        x = transpose(x, [t.index(c) for c in order])
        return expand(x, tuple(sizes[c] for c in order))
    bsz = math.prod(sizes[c] for c in batch)
    msz, nsz, ksz = (math.prod(sizes[c] for c in g) for g in (m, n, k))
    a3 = reshape(arrange(a, ta, batch + m + k), (bsz, msz, ksz))
    b3 = reshape(arrange(b, tb, batch + k + n), (bsz, ksz, nsz))
    y = ctx.library("matmul", [a3, b3], {}, (bsz, msz, nsz), a.dtype)
    labels = batch + m + n
    y = reshape(y, tuple(sizes[c] for c in labels))
    return transpose(y, [labels.index(c) for c in out])


# --- Attention (opset 23+) -----------------------------------------------------------------------

def _split_heads(x, heads):
    """(B, S, H*D) -> (B, H, S, D)."""
    b, s, hidden = x.shape
    if hidden % heads:
        raise ValueError(f"hidden size {hidden} is not a multiple of {heads} heads")
    return transpose(reshape(x, (b, s, heads, hidden // heads)), (0, 2, 1, 3))


def _concat_masked(ts, axis):
    """Concatenation along axis whose loads are masked to their own part (ir.tensor.concat
    selects with `where` but reads every part at every index)."""
    shape = list(ts[0].shape)
    shape[axis] = sum(t.shape[axis] for t in ts)

    def fn(ix):
        e, start = None, 0
        for t in ts:
            i = ix[axis] - start
            inside = K.binary("lt", i, K.const(t.shape[axis], "int64"))
            if start:
                inside = K.binary("and", K.binary("ge", i, K.const(0, "int64")), inside)
            sub = list(ix)
            sub[axis] = i
            v = _masked_at(t, sub, inside, K.const(0, t.dtype))
            e = v if e is None else K.where(inside, v, e)
            start += t.shape[axis]
        return e
    return T(shape, ts[0].dtype, fn)


class _AttnMask:
    """Which scores a query may use, as index math: attn_mask (bool: allowed, float: added),
    padded with masked columns up to the kv length; causal / sliding window aligned to the query
    block's offset (past length, or nonpad_kv_seqlen[b] - q_len); kv padding past
    nonpad_kv_seqlen[b]."""

    def __init__(self, ctx, shape, past_len):
        self.b, self.h, self.sq, self.skv = shape
        self.mask = ctx.input(3)
        self.nonpad = ctx.input(6) if ctx.n_inputs > 6 else None
        self.causal = bool(ctx.attr("is_causal", 0))
        self.left = int(ctx.attr("left_window_size", -1))
        self.right = int(ctx.attr("right_window_size", -1))
        self.past_len = past_len
        if self.nonpad is not None and past_len:
            ctx.fail("nonpad_kv_seqlen together with past_key/past_value is not allowed")
        if self.mask is not None and self.mask.ndim > 4:
            ctx.fail(f"attn_mask of rank {self.mask.ndim}")

    @property
    def present(self) -> bool:
        return self.mask is not None or self.nonpad is not None or self.causal or self.left >= 0 or self.right >= 0

    def _offset(self, b):
        if self.nonpad is not None:
            return K.cast(self.nonpad.at((b,)), "int64") - self.sq
        return K.const(self.past_len, "int64")

    def bias(self, ix, dtype):
        """The additive bias at (b, h, i, j): 0 or the float mask where allowed, else -inf."""
        b, h, i, j = ix
        allowed = None
        diff = None
        if self.causal or self.left >= 0 or self.right >= 0:
            diff = i + self._offset(b) - j  # query position minus key position
        if self.causal:
            allowed = _and(allowed, K.binary("ge", diff, K.const(0, "int64")))
        if self.left >= 0:
            allowed = _and(allowed, K.binary("le", diff, K.const(self.left, "int64")))
        if self.right >= 0:
            allowed = _and(allowed, K.binary("ge", diff, K.const(-self.right, "int64")))
        if self.nonpad is not None:
            allowed = _and(allowed, K.binary("lt", j, K.cast(self.nonpad.at((b,)), "int64")))
        value = K.const(0, dtype)
        if self.mask is not None:
            m = self.mask
            width = m.shape[-1]
            in_mask = K.binary("lt", j, K.const(width, "int64")) if width < self.skv else None
            full = (b, h, i, j)[4 - m.ndim:]
            zero = K.const(0, "int64")
            at = tuple(zero if d == 1 else e for d, e in zip(m.shape, full))
            if m.dtype == "bool":
                allowed = _and(allowed, _masked_at(m, at, in_mask, K.const(False, "bool")))
            else:
                value = K.cast(_masked_at(m, at, in_mask, K.const(-math.inf, m.dtype)), dtype)
        if allowed is None:
            return value
        return K.where(allowed, value, K.const(-math.inf, dtype))


@op("Attention")
def attention(ctx):
    """softmax(softcap(Q K^T * scale) + mask) V, with GQA (query heads grouped over kv heads),
    a kv cache (present = concat(past, new)), 3-D inputs split into heads, and the optional
    qk_matmul_output (mode 0/1: scaled scores after softcap, 2: plus the mask, 3: the softmax).
    A row with no allowed key gives zeros. Matmuls are Library nodes; the masked softmax is two
    row reductions (max, sum) and one elementwise kernel."""
    q, k, v = ctx.input(0), ctx.input(1), ctx.input(2)
    dt = q.dtype
    three_d = q.ndim == 3
    if three_d:
        hq, hkv = ctx.attr("q_num_heads"), ctx.attr("kv_num_heads")
        if not hq or not hkv:
            ctx.fail("3-D inputs need the q_num_heads and kv_num_heads attributes")
        q, k, v = _split_heads(q, hq), _split_heads(k, hkv), _split_heads(v, hkv)
    if q.ndim != 4:
        ctx.fail(f"Q of rank {q.ndim}")
    past_k, past_v = ctx.input(4), ctx.input(5)
    if (past_k is None) != (past_v is None):
        ctx.fail("past_key and past_value must be given together")
    if past_k is not None:
        k = ctx.realize(_concat_masked([past_k, k], 2), "present_key")
        v = ctx.realize(_concat_masked([past_v, v], 2), "present_value")
    bsz, hq, sq, d = q.shape
    hkv, skv, dv = k.shape[1], k.shape[2], v.shape[3]
    if hq % hkv or v.shape[1] != hkv:
        ctx.fail(f"{hq} query heads cannot be grouped over {hkv} key / {v.shape[1]} value heads")
    reps = hq // hkv
    scale = ctx.attr("scale")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    softcap = float(ctx.attr("softcap", 0.0) or 0.0)
    mode = int(ctx.attr("qk_matmul_output_mode", 0))
    precision = ctx.attr("softmax_precision")
    sm_dt = dtypes.from_onnx(precision) if precision is not None else dt
    alpha, k_scaled = scale, k
    if dt == "float16":  # like the reference: Q and K each scaled by sqrt(scale), rounded to fp16
        root = K.const(float(np.float16(math.sqrt(scale))), dt)
        q = map_(lambda a: K.binary("mul", a, root), q)
        k_scaled = map_(lambda a: K.binary("mul", a, root), k)
        alpha = 1.0

    # scores (B, Hq, Sq, Skv): query heads of one group share a kv head, so the group's queries
    # are stacked as rows of one matmul against that head's keys.
    scores = ctx.library("matmul", [reshape(q, (bsz, hkv, reps * sq, d)), k_scaled],
                         {"trans_b": 1, "alpha": alpha}, (bsz, hkv, reps * sq, skv), dt, hint="qk")
    scores = reshape(scores, (bsz, hq, sq, skv))
    if softcap > 0:
        scores = map_(lambda s: K.cast(K.binary("mul", K.unary("tanh", K.binary("div", K.cast(s, sm_dt), K.const(softcap, sm_dt))),
                                                K.const(softcap, sm_dt)), dt), scores)
        scores = ctx.realize(scores, "qk_softcap")
    mask = _AttnMask(ctx, (bsz, hq, sq, skv), past_k.shape[2] if past_k is not None else 0)
    shape = scores.shape

    def logits(ix):
        s = K.cast(scores.at(ix), sm_dt)
        return K.binary("add", s, mask.bias(ix, sm_dt)) if mask.present else s
    x = T(shape, sm_dt, logits)
    rmax = ctx.realize(tensor_reduce(x, [3], "max", keepdims=True), "row_max")
    safe = map_(lambda m: K.where(K.unary("isneginf", m), K.const(0, sm_dt), m), rmax)
    expo = map_(lambda a, m: K.unary("exp", K.binary("sub", a, m)), x, safe)
    rsum = ctx.realize(tensor_reduce(expo, [3], "sum", keepdims=True), "row_sum")
    probs = map_(lambda e, s: K.binary("div", e, K.where(K.binary("eq", s, K.const(0, sm_dt)), K.const(1, sm_dt), s)),
                 expo, rsum)
    if mask.present:  # a row whose bias is all -inf has no key to attend: zeros
        bias = T(shape, sm_dt, lambda ix: mask.bias(ix, sm_dt))
        dead = ctx.realize(map_(lambda m: K.unary("isneginf", m), tensor_reduce(bias, [3], "max", keepdims=True)), "row_masked")
        probs = map_(lambda dd, p: K.where(dd, K.const(0, sm_dt), p), dead, probs)
    probs = ctx.realize(cast(probs, dt), "probs")
    y = ctx.library("matmul", [reshape(probs, (bsz, hkv, reps * sq, skv)), v], {},
                    (bsz, hkv, reps * sq, dv), dt, hint="attn")
    y = reshape(y, (bsz, hq, sq, dv))
    if three_d:
        y = reshape(transpose(y, (0, 2, 1, 3)), (bsz, sq, hq * dv))
    if mode in (0, 1):
        qk_out = scores
    elif mode == 2:
        qk_out = cast(x, dt)
    elif mode == 3:
        qk_out = probs
    else:
        ctx.fail(f"qk_matmul_output_mode={mode} is not supported")
    return [y, k, v, qk_out]


# --- RotaryEmbedding (opset 23) ------------------------------------------------------------------

@op("RotaryEmbedding")
def rotary_embedding(ctx):
    """Rotate pairs of the first rotary_embedding_dim features of each head by the cached angle of
    the token's position: (x1, x2) -> (cos x1 - sin x2, sin x1 + cos x2), pairs being (d, d+half)
    or, interleaved, (2j, 2j+1). Input (B, H, S, D), or (B, S, H*D) with num_heads; the caches
    are (B, S, half), or (max_pos, half) indexed by position_ids (B, S)."""
    x, cos_c, sin_c, pos = ctx.input(0), ctx.input(1), ctx.input(2), ctx.input(3)
    interleaved = int(ctx.attr("interleaved", 0))
    if x.ndim == 4:
        head = x.shape[3]
    elif x.ndim == 3:
        heads = int(ctx.attr("num_heads", 0) or 0)
        if not heads:
            ctx.fail("3-D input needs the num_heads attribute")
        head = x.shape[2] // heads
    else:
        ctx.fail(f"input of rank {x.ndim}")
    rd = int(ctx.attr("rotary_embedding_dim", 0) or 0) or head
    half = rd // 2
    if cos_c.shape[-1] != half or sin_c.shape[-1] != half:
        ctx.fail(f"cos/sin caches {list(cos_c.shape)} do not end in rotary_embedding_dim/2 = {half}")
    i64 = lambda v: K.const(v, "int64")  # noqa: E731

    def fn(ix):
        if x.ndim == 4:
            b, s, d = ix[0], ix[2], ix[3]
            at = lambda dd, m=None: _masked_at(x, (ix[0], ix[1], ix[2], dd), m, K.const(0, x.dtype))  # noqa: E731
        else:
            b, s = ix[0], ix[1]
            base = ix[2] // head * head
            d = ix[2] % head
            at = lambda dd, m=None: _masked_at(x, (b, s, base + dd), m, K.const(0, x.dtype))  # noqa: E731
        rot = K.binary("lt", d, i64(rd)) if rd < head else None
        if interleaved:
            first = K.binary("eq", d % 2, i64(0))
            j = d // 2
            partner = K.where(first, d + 1, d - 1)
        else:
            first = K.binary("lt", d, i64(half))
            j = K.where(first, d, d - half)
            partner = K.where(first, d + half, d - half)
        if pos is not None:
            p = pos.at((b, s))
            ok = _and(rot, K.binary("and", K.binary("ge", p, i64(0)), K.binary("lt", p, i64(cos_c.shape[0]))))
            cache_ix = (p, j)
        else:
            ok = rot
            cache_ix = tuple(i64(0) if n == 1 else e for n, e in zip(cos_c.shape, (b, s, j)))
        c = _masked_at(cos_c, cache_ix, ok, K.const(0, cos_c.dtype))
        sn = _masked_at(sin_c, cache_ix, ok, K.const(0, sin_c.dtype))
        own, other = at(d), at(partner, rot)
        rotated = K.where(first, K.binary("sub", K.binary("mul", c, own), K.binary("mul", sn, other)),
                          K.binary("add", K.binary("mul", sn, other), K.binary("mul", c, own)))
        return rotated if rot is None else K.where(rot, rotated, own)
    return [T(x.shape, x.dtype, fn)]
