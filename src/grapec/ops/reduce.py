"""Reductions and the ops built on row statistics: Reduce*, ArgMax/ArgMin, the Softmax family,
normalizations, CumSum/CumProd, LRN and the classification losses.

Conventions:
  * float16 inputs accumulate (sums, means, variances, exps) in float32 and cast back at the end.
  * A statistic that every element of a row needs (a row max, sum, mean, 1/std) is realized as its
    own small kernel with `_stat`, and the elementwise output then loads it, so evaluating the
    output costs O(n) in total, not O(n) per element.
  * Softmax and LogSumExp subtract the row max before exponentiating.
"""
from __future__ import annotations

import math

import numpy as np

from .. import dtypes
from ..ir import kernel as K
from ..ir.interpret import reduction_identity
from ..ir.tensor import T, affine, cast, expand, guard_loads, map_, norm_axis, reduce, reshape
from . import op

E = K.Expr


# --- scalar helpers ----------------------------------------------------------------------------------

def _c(v, like: E) -> E:
    return K.const(v, like.dtype)


def _div(a: E, b: E) -> E:
    return K.binary("div", a, b)


def _sqrt(v: E) -> E:
    return K.unary("sqrt", v)


def _log(v: E) -> E:
    return K.unary("log", v)


def _rsqrt(v: E) -> E:
    return K.unary("reciprocal", K.unary("sqrt", v))


def _acc_dtype(dt: str) -> str:
    """The dtype sums are accumulated in: float32 for float16, the input's own otherwise."""
    return dtypes.accumulation(dt)


def _float_dtype(dt: str) -> str:
    """The dtype for transcendental math on dt (ints go through float64)."""
    return _acc_dtype(dt) if dtypes.is_float(dt) else "float64"


def _stat(ctx, t: T, axes, op: str, body=None, post=None, hint: str = "stat") -> T:
    """Realize reduce(t) over `axes` (keepdims), then `post(value)`, as its own kernel; returns a
    load of it, which broadcasts against t in `map_`."""
    r = reduce(t, axes, op, True, body)
    if post is not None:
        r = map_(post, r)
    return ctx.realize(r, hint)


def _mean(ctx, xf: T, axes) -> T:
    n = math.prod(xf.shape[a] for a in axes)
    return _stat(ctx, xf, axes, "sum", post=lambda s: _div(s, _c(n, s)), hint="mean")


def _variance(ctx, xf: T, mean: T, axes, post=None) -> T:
    """Population variance from the realized mean (two passes); `post` maps it (e.g. to 1/std)."""
    n = math.prod(xf.shape[a] for a in axes)
    var = lambda s: _div(s, _c(n, s))  # noqa: E731
    centered = map_(lambda a, m: a - m, xf, mean)
    return _stat(ctx, centered, axes, "sum", body=lambda d: d * d,
                 post=(lambda s: post(var(s))) if post else var, hint="var")


def _mean_and_rstd(ctx, xf: T, axes, eps: float):
    """Row mean and 1/sqrt(var + eps), keepdims-shaped."""
    mean = _mean(ctx, xf, axes)
    return mean, _variance(ctx, xf, mean, axes, post=lambda v: _rsqrt(v + eps))


# --- Reduce* -----------------------------------------------------------------------------------------

def _reduce_axes(ctx, rank: int) -> list:
    """Axes from input 1 (ReduceSum >= 13, the others >= 18) or the `axes` attribute. No axes means
    all of them, unless noop_with_empty_axes, where it means none (each element reduced alone)."""
    if ctx.has(1):
        axes = [int(a) for a in ctx.const(1, "axes").reshape(-1)]
    else:
        axes = list(ctx.attr("axes", None) or [])
    if not axes:
        return [] if ctx.attr("noop_with_empty_axes", 0) else list(range(rank))
    return sorted({norm_axis(a, rank, "reduction axis") for a in axes})


def _reduction(name: str, rop: str, body=None, post=None, accumulate: bool = True):
    """ReduceX = post(reduce_rop(body(x)), n) over the axes, computed in the accumulation dtype
    (float32 for float16 when `accumulate`), then cast back to x's dtype. n = elements per row.
    Empty rows give the identity of rop (0 for sums, 1 for prod, -inf/+inf for max/min)."""
    @op(name)
    def lower(ctx):
        x = ctx.input(0)
        axes = _reduce_axes(ctx, x.ndim)
        keep = bool(ctx.attr("keepdims", 1))
        n = math.prod(x.shape[a] for a in axes)
        xa = cast(x, _acc_dtype(x.dtype)) if accumulate else x
        r = reduce(xa, axes, rop, keep, body)
        if post is not None:
            r = map_(lambda e: post(e, n), r)
        return [cast(r, x.dtype)]
    return lower


def _in_float(f):
    """Apply scalar function f in a float dtype (ints go through float64) and cast back."""
    def g(e: E) -> E:
        ft = _float_dtype(e.dtype)
        return K.cast(f(K.cast(e, ft)), e.dtype)
    return g


_reduction("ReduceSum", "sum")
_reduction("ReduceProd", "prod")
_reduction("ReduceMax", "max", accumulate=False)
_reduction("ReduceMin", "min", accumulate=False)
_reduction("ReduceMean", "sum", post=lambda s, n: _div(s, _c(n, s)))
_reduction("ReduceSumSquare", "sum", body=lambda x: x * x)
_reduction("ReduceL1", "sum", body=lambda x: K.unary("abs", x))
_reduction("ReduceL2", "sum", body=lambda x: x * x, post=lambda s, n: _in_float(_sqrt)(s))
_reduction("ReduceLogSum", "sum", post=lambda s, n: _in_float(_log)(s))


@op("ReduceLogSumExp")
def reduce_log_sum_exp(ctx):
    """log(sum(exp(x - m))) + m with m the row max (0 where m is infinite: an all -inf row gives
    -inf, a row with +inf gives +inf)."""
    x = ctx.input(0)
    xf = cast(x, _float_dtype(x.dtype))
    axes = _reduce_axes(ctx, x.ndim)
    keep = bool(ctx.attr("keepdims", 1))
    finite_max = lambda m: K.where(K.unary("isinf", m), _c(0, m), m)  # noqa: E731
    m = _stat(ctx, xf, axes, "max", post=finite_max, hint="rowmax")
    s = reduce(map_(lambda a, b: K.unary("exp", a - b), xf, m), axes, "sum", keep)
    m_row = m if keep else reshape(m, s.shape)
    return [cast(map_(lambda v, mx: _log(v) + mx, s, m_row), x.dtype)]


# A row this long, in so few rows, is reduced in chunks first (_chunked_arg): one block reducing a
# vocabulary alone is latency-bound (GPT-2's 50257 logits: 12.6 us on an H200).
CHUNKED_ARG_LENGTH = 16384
CHUNKED_ARG_ROWS = 16
CHUNKS = 128     # about: each chunk a power of two of at least 256 elements


@op("ArgMax", "ArgMin")
def arg_max_min(ctx):
    """Index of the first (or, with select_last_index, the last) extreme element along axis."""
    x = ctx.input(0)
    axis = norm_axis(ctx.attr("axis", 0), x.ndim)
    rop = "argmax" if ctx.node.op == "ArgMax" else "argmin"
    if ctx.attr("select_last_index", 0):
        rop += "_last"
    keep = bool(ctx.attr("keepdims", 1))
    n = x.shape[axis]
    if n >= CHUNKED_ARG_LENGTH and x.size // n <= CHUNKED_ARG_ROWS:
        return [_chunked_arg(ctx, x, axis, rop, keep)]
    return [reduce(x, [axis], rop, keep)]


def _chunked_arg(ctx, x: T, axis: int, rop: str, keep: bool) -> T:
    """The same index in two kernels: each chunk's extreme index (a kernel over [rows, chunks], a warp
    or block per chunk), then the extreme of the values at those indices. Chunks are in order and
    each gives its first (last) extreme, so the first (last) chunk holding the row's extreme gives
    the row's first (last) one. The last chunk is padded with the value that never wins over a real
    one; on a tie with it (a row of -inf, select_last_index) the index is clamped to the row."""
    n = x.shape[axis]
    size = max(256, 1 << math.ceil(math.log2(n / CHUNKS)))
    chunks = -(-n // size)
    outer = [d for a, d in enumerate(x.shape) if a != axis]
    pad = _never_wins(rop, x.dtype)

    def element(ix):   # ix: the outer index, then chunk, then position in the chunk
        at = ix[-2] * K.const(size, "int64") + ix[-1]
        inside = K.binary("lt", at, K.const(n, "int64"))
        full = list(ix[:-2])
        full.insert(axis, at)
        return K.where(inside, guard_loads(x.at(full), inside), pad)
    tiles = T((*outer, chunks, size), x.dtype, element)
    local = reduce(tiles, [len(outer) + 1], rop, False)
    firsts = ctx.realize(T(local.shape, "int64", lambda ix: K.binary(
        "min", local.at(ix) + ix[-1] * K.const(size, "int64"), K.const(n - 1, "int64"))), "argchunks")

    def candidate(ix):   # ix: the outer index, then chunk
        full = list(ix[:-1])
        full.insert(axis, firsts.at(ix))
        return x.at(full)
    best = reduce(T((*outer, chunks), x.dtype, candidate), [len(outer)], rop, False)
    picked = T(tuple(outer), "int64", lambda ix: firsts.at((*ix, best.at(ix))))
    return reshape(picked, tuple(1 if a == axis else d for a, d in enumerate(x.shape))) if keep else picked


def _never_wins(rop: str, dtype: str) -> E:
    """The value an arg-reduction never prefers over a real element (it may tie with one)."""
    return K.const(reduction_identity("min" if rop.startswith("argmin") else "max", np.dtype(dtypes.np_dtype(dtype))), dtype)


# --- Softmax family ----------------------------------------------------------------------------------

def _softmax_view(ctx, x: T):
    """(x as the op sees it, the axis, a function restoring x's shape). Before opset 13 the input is
    flattened to 2-D at `axis` (default 1) and normalized over the second dim; from 13 on it is
    normalized over the single `axis` (default -1)."""
    opset = ctx.graph.opset
    if 0 < opset < 13:
        axis = norm_axis(ctx.attr("axis", 1), x.ndim)
        rows = math.prod(x.shape[:axis])
        x2 = reshape(x, (rows, x.size // rows if rows else math.prod(x.shape[axis:])))
        return x2, 1, lambda t: reshape(t, x.shape)
    return x, norm_axis(ctx.attr("axis", -1), x.ndim), lambda t: t


def _shifted_and_sum(ctx, xf: T, axis: int):
    """(x - rowmax, sum(exp(x - rowmax)) keepdims-shaped), each statistic its own kernel."""
    m = _stat(ctx, xf, [axis], "max", hint="rowmax")
    shifted = map_(lambda a, b: a - b, xf, m)
    s = _stat(ctx, shifted, [axis], "sum", body=lambda v: K.unary("exp", v), hint="rowsum")
    return shifted, s


@op("Softmax")
def softmax(ctx):
    x = ctx.input(0)
    v, axis, restore = _softmax_view(ctx, x)
    shifted, s = _shifted_and_sum(ctx, cast(v, _acc_dtype(x.dtype)), axis)
    y = map_(lambda d, z: _div(K.unary("exp", d), z), shifted, s)
    return [restore(cast(y, x.dtype))]


@op("LogSoftmax")
def log_softmax(ctx):
    x = ctx.input(0)
    v, axis, restore = _softmax_view(ctx, x)
    shifted, s = _shifted_and_sum(ctx, cast(v, _acc_dtype(x.dtype)), axis)
    y = map_(lambda d, z: d - _log(z), shifted, s)
    return [restore(cast(y, x.dtype))]


@op("Hardmax")
def hardmax(ctx):
    """1 at the first maximum along the axis, 0 elsewhere."""
    x = ctx.input(0)
    v, axis, restore = _softmax_view(ctx, x)
    am = expand(_stat(ctx, v, [axis], "argmax", hint="argmax"), v.shape)
    one, zero = K.const(1, x.dtype), K.const(0, x.dtype)
    y = T(v.shape, x.dtype, lambda ix: K.where(K.binary("eq", ix[axis], am.at(ix)), one, zero))
    return [restore(y)]


# --- normalizations ----------------------------------------------------------------------------------

def _stash_dtype(ctx, x_dtype: str) -> str:
    """Compute dtype: stash_type (default float32), but never less precise than x."""
    stash = dtypes.from_onnx(ctx.attr("stash_type", 1))
    return "float64" if x_dtype == "float64" else stash


@op("LayerNormalization")
def layer_normalization(ctx):
    """Normalize over axes [axis, rank): Y = (x - mean) * rstd * Scale + B. Optional outputs Mean
    and InvStdDev have x's shape with the normalized dims set to 1, in the stash dtype."""
    x, scale, bias = ctx.input(0), ctx.input(1), ctx.input(2)
    axis = norm_axis(ctx.attr("axis", -1), x.ndim)
    axes = list(range(axis, x.ndim))
    ct = _stash_dtype(ctx, x.dtype)
    xf = cast(x, ct)
    mean, rstd = _mean_and_rstd(ctx, xf, axes, ctx.attr("epsilon", 1e-5))
    y = map_(lambda a, m, r, s: (a - m) * r * s, xf, mean, rstd, cast(scale, ct))
    if bias is not None:
        y = map_(lambda a, b: a + b, y, cast(bias, ct))
    out_stat_dt = dtypes.from_onnx(ctx.attr("stash_type", 1))
    return [cast(y, x.dtype), cast(mean, out_stat_dt), cast(rstd, out_stat_dt)]


@op("RMSNormalization")
def rms_normalization(ctx):
    """Y = x / sqrt(mean(x^2 over [axis, rank)) + eps) * Scale."""
    x, scale = ctx.input(0), ctx.input(1)
    axis = norm_axis(ctx.attr("axis", -1), x.ndim)
    axes = list(range(axis, x.ndim))
    n = math.prod(x.shape[a] for a in axes)
    eps = ctx.attr("epsilon", 1e-5)
    ct = _stash_dtype(ctx, x.dtype)
    xf = cast(x, ct)
    rstd = _stat(ctx, xf, axes, "sum", body=lambda v: v * v,
                 post=lambda s: _rsqrt(_div(s, _c(n, s)) + eps), hint="rstd")
    y = map_(lambda a, r, s: a * r * s, xf, rstd, cast(scale, ct))
    return [cast(y, x.dtype)]


def _per_channel(t: T, rank: int) -> T:
    """A (C,) parameter shaped (C, 1, .., 1) to broadcast against an (N, C, ...) tensor."""
    return reshape(t, (t.shape[0],) + (1,) * (rank - 2))


@op("InstanceNormalization")
def instance_normalization(ctx):
    """Per (n, c): normalize over the spatial dims, then * scale[c] + B[c]."""
    x, scale, bias = ctx.input(0), ctx.input(1), ctx.input(2)
    ct = _acc_dtype(x.dtype)
    xf = cast(x, ct)
    mean, rstd = _mean_and_rstd(ctx, xf, list(range(2, x.ndim)), ctx.attr("epsilon", 1e-5))
    y = map_(lambda a, m, r, s, b: (a - m) * r * s + b, xf, mean, rstd,
             cast(_per_channel(scale, x.ndim), ct), cast(_per_channel(bias, x.ndim), ct))
    return [cast(y, x.dtype)]


@op("GroupNormalization")
def group_normalization(ctx):
    """Channels split into num_groups groups; each (n, group) is normalized over its channels and
    spatial dims, then scaled and shifted per channel (opset 21) or per group (opset 18, where
    scale and bias have num_groups entries)."""
    x, scale, bias = ctx.input(0), ctx.input(1), ctx.input(2)
    groups = int(ctx.attr("num_groups"))
    n, c = x.shape[0], x.shape[1]
    if c % groups:
        ctx.fail(f"{c} channels do not split into {groups} groups")
    per = c // groups
    ct = _stash_dtype(ctx, x.dtype)
    xg = cast(reshape(x, (n, groups, x.size // max(n * groups, 1))), ct)
    mean, rstd = _mean_and_rstd(ctx, xg, [2], ctx.attr("epsilon", 1e-5))
    scale, bias = cast(scale, ct), cast(bias, ct)
    param_of = (lambda ch: ch) if scale.shape[0] == c else (lambda ch: ch // per)
    xf = cast(x, ct)

    def fn(ix):
        ch = ix[1]
        g = (ix[0], ch // per, K.const(0, "int64"))
        p = (param_of(ch),)
        return (xf.at(ix) - mean.at(g)) * rstd.at(g) * scale.at(p) + bias.at(p)
    return [cast(T(x.shape, ct, fn), x.dtype)]


@op("BatchNormalization")
def batch_normalization(ctx):
    """Inference: Y = (x - mean[c]) / sqrt(var[c] + eps) * scale[c] + B[c]. With training_mode
    (opset >= 14) the batch statistics over all dims but 1 are used, and the running mean and
    variance come out as momentum * running + (1 - momentum) * batch."""
    x, scale, bias, mean, var = (ctx.input(i) for i in range(5))
    eps = ctx.attr("epsilon", 1e-5)
    ct = _acc_dtype(x.dtype)
    xf = cast(x, ct)
    params = [cast(_per_channel(t, x.ndim), ct) for t in (scale, bias, mean, var)]
    training = ctx.attr("training_mode", 0) and not 0 < ctx.graph.opset < 14
    if not training:
        if any(ctx.node.outputs[1:]):
            ctx.fail("the training outputs of BatchNormalization (opset < 14) are not supported")
        y = map_(lambda a, s, b, m, v: (a - m) * _rsqrt(v + eps) * s + b, xf, *params)
        return [cast(y, x.dtype)]
    axes = [a for a in range(x.ndim) if a != 1]
    bmean = _mean(ctx, xf, axes)
    bvar = _variance(ctx, xf, bmean, axes)
    y = map_(lambda a, m, v, s, b: (a - m) * _rsqrt(v + eps) * s + b, xf, bmean, bvar, *params[:2])
    mom = ctx.attr("momentum", 0.9)
    row = lambda t: reshape(t, (x.shape[1],))  # noqa: E731
    run_mean = map_(lambda r, b: r * mom + b * (1 - mom), cast(mean, ct), row(bmean))
    run_var = map_(lambda r, b: r * mom + b * (1 - mom), cast(var, ct), row(bvar))
    return [cast(y, x.dtype), cast(run_mean, ctx.dtype(3)), cast(run_var, ctx.dtype(4))]


@op("LpNormalization")
def lp_normalization(ctx):
    """x / ||x||_p along axis (p = 1 or 2); 0 where the norm is 0."""
    x = ctx.input(0)
    axis = norm_axis(ctx.attr("axis", -1), x.ndim)
    p = int(ctx.attr("p", 2))
    if p not in (1, 2):
        ctx.fail(f"p={p} (only 1 and 2 are defined)")
    ct = _acc_dtype(x.dtype)
    xf = cast(x, ct)
    if p == 1:
        norm = _stat(ctx, xf, [axis], "sum", body=lambda v: K.unary("abs", v), hint="l1norm")
    else:
        norm = _stat(ctx, xf, [axis], "sum", body=lambda v: v * v, post=_sqrt, hint="l2norm")
    y = map_(lambda a, nm: K.where(K.binary("eq", nm, _c(0, nm)), _c(0, a), _div(a, nm)), xf, norm)
    return [cast(y, x.dtype)]


@op("MeanVarianceNormalization")
def mean_variance_normalization(ctx):
    """(x - mean) / (sqrt(var) + 1e-9) over `axes` (default [0, 2, 3])."""
    x = ctx.input(0)
    axes = sorted({norm_axis(a, x.ndim) for a in ctx.attr("axes", [0, 2, 3])})
    ct = _acc_dtype(x.dtype)
    xf = cast(x, ct)
    mean = _mean(ctx, xf, axes)
    std = _variance(ctx, xf, mean, axes, post=lambda v: _sqrt(v) + 1e-9)
    return [cast(map_(lambda a, m, sd: _div(a - m, sd), xf, mean, std), x.dtype)]


# --- scans -------------------------------------------------------------------------------------------

def _scan(ctx, rop: str, identity):
    """CumSum/CumProd along the constant `axis` input: out[i] = rop of x[j] for j <= i (j < i with
    exclusive; j >= i / j > i with reverse, done as a forward scan of the reversed axis)."""
    x = ctx.input(0)
    axis = norm_axis(int(ctx.const(1, "axis").reshape(-1)[0]), x.ndim)
    n = x.shape[axis]
    flip = (lambda t: affine(t, axis, n - 1, -1, n)) if ctx.attr("reverse", 0) else (lambda t: t)
    xs = flip(cast(x, _acc_dtype(x.dtype)))
    cmp = "lt" if ctx.attr("exclusive", 0) else "le"
    ys = _forward_scan(ctx, xs, axis, rop, K.const(identity, xs.dtype), cmp)
    return [cast(flip(ys), x.dtype)]


def _forward_scan(ctx, xs: T, axis: int, rop: str, ident: E, cmp: str) -> T:
    """out[i] = rop of xs[j] over j with `j cmp i` along axis. Short axes loop over the whole axis
    per element; longer ones go through blocks of B ~ 1-2 sqrt(n): block totals, an exclusive scan of
    those, then each element adds its block's prefix to a loop within its block, O(n sqrt n)."""
    n = xs.shape[axis]
    last = K.const(n - 1, "int64")

    def window(ix, start, length, keep, src_of=lambda j: j, t=xs):
        """rop of t[.., src_of(start + k), ..] over k < length where keep(start + k)."""
        k = K.ridx(length)
        j = start + k
        src = list(ix)
        src[axis] = src_of(j)
        return K.reduce(rop, K.where(keep(j), t.at(src), ident), (k,))

    zero = K.const(0, "int64")
    if n <= 64:
        return T(xs.shape, xs.dtype, lambda ix: window(ix, zero, n, lambda j: K.binary(cmp, j, ix[axis])))
    # a power of two past sqrt(n): one block size over a wide span of lengths, so the sizes of a range
    # (--dynamic) keep one launch structure between powers of four (compiler/structures.py)
    size = 1 << math.isqrt(n - 1).bit_length()
    nb = -(-n // size)
    blocks = tuple(nb if a == axis else d for a, d in enumerate(xs.shape))
    clamp = lambda j: K.binary("min", j, last)  # noqa: E731
    totals = ctx.realize(T(blocks, xs.dtype, lambda ix: window(
        ix, ix[axis] * size, size, lambda j: K.binary("le", j, last), clamp)), "block_totals")
    prefix = ctx.realize(T(blocks, xs.dtype, lambda ix: window(
        ix, zero, nb, lambda b: K.binary("lt", b, ix[axis]), t=totals)), "block_prefix")
    combine = "add" if rop == "sum" else "mul"

    def fn(ix):
        b = ix[axis] // size
        at_block = list(ix)
        at_block[axis] = b
        within = window(ix, b * size, size, lambda j: K.binary(cmp, j, ix[axis]), clamp)
        return K.binary(combine, prefix.at(at_block), within)
    return T(xs.shape, xs.dtype, fn)


@op("CumSum")
def cumsum(ctx):
    return _scan(ctx, "sum", 0)


@op("CumProd")
def cumprod(ctx):
    return _scan(ctx, "prod", 1)


@op("LRN")
def lrn(ctx):
    """y = x / (bias + alpha/size * sum of x^2 over the channel window [c - (size-1)//2,
    c + ceil((size-1)/2)])^beta; out-of-range channels count as 0."""
    x = ctx.input(0)
    size = int(ctx.attr("size"))
    alpha, beta, bias = ctx.attr("alpha", 1e-4), ctx.attr("beta", 0.75), ctx.attr("bias", 1.0)
    ct = _acc_dtype(x.dtype)
    xf = cast(x, ct)
    c = x.shape[1]
    lo = (size - 1) // 2

    def square_sum(ix):
        r = K.ridx(size)
        ch = ix[1] + r - lo
        zero = K.const(0, "int64")
        valid = K.binary("and", K.binary("ge", ch, zero), K.binary("lt", ch, K.const(c, "int64")))
        src = list(ix)
        src[1] = K.binary("min", K.binary("max", ch, zero), K.const(c - 1, "int64"))
        v = xf.at(src)
        return K.reduce("sum", K.where(valid, v * v, K.const(0, ct)), (r,))
    ss = T(x.shape, ct, square_sum)
    y = map_(lambda a, s: _div(a, K.binary("pow", s * (alpha / size) + bias, _c(beta, s))), xf, ss)
    return [cast(y, x.dtype)]


# --- losses ------------------------------------------------------------------------------------------

def _nll(ctx, logp: T, target: T, weight: T | None, out_dtype: str):
    """NegativeLogLikelihoodLoss on log-probabilities logp (N, C, d..) and targets (N, d..):
    loss = -logp[n, t, d..] * weight[t], 0 where t == ignore_index; reduced by `reduction`
    (mean divides by the sum of the weights that were applied)."""
    ignore = ctx.attr("ignore_index", None)
    reduction = ctx.attr("reduction", "mean")
    if isinstance(reduction, bytes):
        reduction = reduction.decode()
    c = logp.shape[1]
    ct = logp.dtype

    def weight_of(ix):
        t = K.cast(target.at(ix), "int64")
        tc = K.binary("min", K.binary("max", t, K.const(0, "int64")), K.const(c - 1, "int64"))
        w = K.cast(weight.at((tc,)), ct) if weight is not None else K.const(1, ct)
        if ignore is not None:
            w = K.where(K.binary("eq", t, K.const(ignore, "int64")), K.const(0, ct), w)
        return tc, w

    def loss_at(ix):
        tc, w = weight_of(ix)
        return -(logp.at((ix[0], tc, *ix[1:])) * w)
    loss = T(target.shape, ct, loss_at)
    if reduction == "none":
        return cast(loss, out_dtype)
    all_axes = list(range(target.ndim))
    total = reduce(loss, all_axes, "sum", False)
    if reduction == "sum":
        return cast(total, out_dtype)
    if reduction != "mean":
        ctx.fail(f"reduction '{reduction}'")
    wsum = reduce(T(target.shape, ct, lambda ix: weight_of(ix)[1]), all_axes, "sum", False)
    return cast(map_(_div, total, wsum), out_dtype)


@op("NegativeLogLikelihoodLoss")
def negative_log_likelihood_loss(ctx):
    x = ctx.input(0)
    return [_nll(ctx, cast(x, _acc_dtype(x.dtype)), ctx.input(1), ctx.input(2), x.dtype)]


@op("SoftmaxCrossEntropyLoss")
def softmax_cross_entropy_loss(ctx):
    """NLL of LogSoftmax(scores) over axis 1; the optional second output is that log_prob."""
    x = ctx.input(0)
    shifted, s = _shifted_and_sum(ctx, cast(x, _acc_dtype(x.dtype)), 1)
    logp = ctx.realize(map_(lambda d, z: d - _log(z), shifted, s), "log_prob")
    return [_nll(ctx, logp, ctx.input(1), ctx.input(2), x.dtype), cast(logp, x.dtype)]
