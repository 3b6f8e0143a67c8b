"""Data movement: almost every op here is an index remap (no arithmetic), so it folds into its
consumer's loads or, when it is still a plain reshape of a value, becomes a free View. Scatter*
reduce over the updates that target each element; Resize weighs a few taps from constant tables.

Compile-time parameters (axes, starts, pads, repeats, scales...) come from attributes in older
opsets and from constant inputs in newer ones; `_ints_of` and `_axes_of` read either form.
Runtime indices (Gather, Scatter*, ReverseSequence) are normalized with `where` and every read
that may fall outside its tensor goes through `_read`, which masks the load.
"""
from __future__ import annotations

import math

import numpy as np

from .. import dtypes
from ..errors import IndexRangeError
from ..ir import kernel as K
from ..ir.tensor import T, affine, broadcast_shapes, expand, norm_axis, reshape, transpose
from . import op

I64 = "int64"


# --- helpers ---------------------------------------------------------------------------------------

def _i(v) -> K.Expr:
    return K.const(v, I64)


def _and(a: K.Expr, b: K.Expr) -> K.Expr:
    return K.binary("and", a, b)


def _ints(a) -> list:
    return [int(v) for v in np.asarray(a).reshape(-1)]


def _ints_of(ctx, i: int, attr: str, what: str | None = None) -> list | None:
    """Integer list from constant input i if present, else from attribute `attr` (older opsets)."""
    if ctx.has(i):
        return _ints(ctx.const(i, what or attr))
    v = ctx.attr(attr)
    return None if v is None else _ints(v)


def _axes_of(ctx, i: int, rank: int, attr: str = "axes") -> list | None:
    axes = _ints_of(ctx, i, attr, "axes")
    return None if axes is None else [norm_axis(a, rank) for a in axes]


def _in_range(i: K.Expr, n: int) -> K.Expr:
    return _and(K.binary("ge", i, _i(0)), K.binary("lt", i, _i(n)))


def _clamp(i: K.Expr, n: int) -> K.Expr:
    return K.binary("min", K.binary("max", i, _i(0)), _i(max(n - 1, 0)))


def _wrap_negative(i: K.Expr, n: int) -> K.Expr:
    """A runtime index in [-n, n) made non-negative (ONNX's negative indices count from the end)."""
    i = K.cast(i, I64)
    return K.where(K.binary("lt", i, _i(0)), i + n, i)


def _read(t: T, ix, valid: K.Expr, other: K.Expr) -> K.Expr:
    """t[ix] where `valid`, else `other`. Where not valid, ix may be out of range: a plain load gets
    the mask (no read happens), anything else is evaluated at a clamped index and selected away."""
    e = t.at(ix)
    if e.op == "load" and e.args[2] is None:
        slot, index, _, _ = e.args
        return K.load(slot, index, e.dtype, mask=valid, other=other)
    inside = t.at([_clamp(i, d) for i, d in zip(ix, t.shape)])
    return K.where(valid, inside, other)


def _const_tensor(ctx, arr: np.ndarray, hint: str) -> T:
    """A lazy load of a compile-time table (becomes a weight of the plan)."""
    v = ctx.graph.add_value(hint, dtypes.from_numpy(arr.dtype), arr.shape, const=np.array(arr, order="C"))
    return ctx.tensor(v)


def _take_const(ctx, t: T, axis: int, sel: np.ndarray) -> T:
    """out[.., k, ..] = t[.., sel[k], ..] for a compile-time index list (affine runs need no table)."""
    sel = np.asarray(sel, np.int64).reshape(-1)
    n = len(sel)
    step = int(sel[1] - sel[0]) if n > 1 else 1
    if n == 0 or np.array_equal(sel, sel[0] + step * np.arange(n)):
        return affine(t, axis, int(sel[0]) if n else 0, step, n)
    table = _const_tensor(ctx, sel, "take")
    shape = list(t.shape)
    shape[axis] = n

    def fn(ix):
        ix = list(ix)
        ix[axis] = table.at((ix[axis],))
        return t.at(ix)
    return T(shape, t.dtype, fn)


def _scalar_of(t: T) -> K.Expr:
    return t.at((_i(0),) * t.ndim)


def _lowest(dtype: str):
    if dtypes.is_float(dtype):
        return -math.inf
    if dtype == "bool":
        return False
    return int(np.iinfo(dtypes.np_dtype(dtype)).min)


def _highest(dtype: str):
    if dtypes.is_float(dtype):
        return math.inf
    if dtype == "bool":
        return True
    return int(np.iinfo(dtypes.np_dtype(dtype)).max)


# --- reshapes (Views) ------------------------------------------------------------------------------

@op("Reshape")
def reshape_(ctx):
    x = ctx.input(0)
    if ctx.has(1):
        shape = [int(d) for d in ctx.const(1, "shape")]
    else:  # opset < 5
        shape = list(ctx.attr("shape"))
    allowzero = ctx.attr("allowzero", 0)
    out = [x.shape[i] if d == 0 and not allowzero else d for i, d in enumerate(shape)]
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1]))
        out[out.index(-1)] = x.size // known if known else 0
    return [reshape(x, out)]


@op("Flatten")
def flatten(ctx):
    """2-D: dims before `axis` form the rows, the rest the columns."""
    x = ctx.input(0)
    axis = ctx.attr("axis", 1)
    axis = axis + x.ndim if axis < 0 else axis
    return [reshape(x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))]


@op("Squeeze")
def squeeze(ctx):
    x = ctx.input(0)
    axes = _axes_of(ctx, 1, x.ndim)
    if axes is None:
        axes = [a for a, d in enumerate(x.shape) if d == 1]
    for a in axes:
        if x.shape[a] != 1:
            ctx.fail(f"cannot squeeze axis {a} of size {x.shape[a]}")
    return [reshape(x, [d for a, d in enumerate(x.shape) if a not in axes])]


@op("Unsqueeze")
def unsqueeze(ctx):
    """Insert size-1 dims at `axes`, which index the output."""
    x = ctx.input(0)
    axes = _ints_of(ctx, 1, "axes")
    rank = x.ndim + len(axes)
    axes = {norm_axis(a, rank) for a in axes}
    dims = iter(x.shape)
    return [reshape(x, [1 if a in axes else next(dims) for a in range(rank)])]


@op("Transpose")
def transpose_(ctx):
    x = ctx.input(0)
    perm = ctx.attr("perm", list(range(x.ndim))[::-1])
    return [transpose(x, perm)]


# --- slicing, joining, splitting -------------------------------------------------------------------

@op("Slice")
def slice_(ctx):
    """Python slice semantics per axis: starts/ends clamp to the dim, negative values count from
    the end, negative steps walk backwards. Opset 1 has attributes, opset 10+ inputs."""
    x = ctx.input(0)
    if ctx.attr("starts") is not None:
        starts, ends = _ints(ctx.attr("starts")), _ints(ctx.attr("ends"))
        axes = _ints(ctx.attr("axes", range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts, ends = _ints(ctx.const(1, "starts")), _ints(ctx.const(2, "ends"))
        axes = _ints(ctx.const(3, "axes")) if ctx.has(3) else list(range(len(starts)))
        steps = _ints(ctx.const(4, "steps")) if ctx.has(4) else [1] * len(starts)
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = norm_axis(a, x.ndim)
        if st == 0:
            ctx.fail("slice step 0")
        start, stop, step = slice(s, e, st).indices(x.shape[a])
        n = len(range(start, stop, step))
        if (start, step, n) != (0, 1, x.shape[a]):
            x = affine(x, a, start, step, n)
    return [x]


@op("Concat")
def concat_(ctx):
    """Pieces side by side along `axis`: each output element reads the piece its coordinate falls
    in; every piece's read is masked to its own range, so no load leaves its tensor."""
    ts = [t for t in ctx.inputs() if t is not None]
    axis = norm_axis(ctx.attr("axis"), ts[0].ndim)
    ts = [t for t in ts if t.shape[axis] != 0] or ts[:1]
    if len(ts) == 1:
        return [ts[0]]
    starts = np.cumsum([0] + [t.shape[axis] for t in ts]).tolist()
    shape = list(ts[0].shape)
    shape[axis] = starts[-1]

    def fn(ix):
        i, e = ix[axis], K.const(0, ts[0].dtype)
        for k in reversed(range(len(ts))):
            inside = K.const(True, "bool")
            if k > 0:
                inside = K.binary("ge", i, _i(starts[k]))
            if k < len(ts) - 1:
                inside = _and(inside, K.binary("lt", i, _i(starts[k + 1])))
            src = list(ix)
            src[axis] = i - starts[k]
            e = _read(ts[k], src, inside, e)
        return e
    return [T(shape, ts[0].dtype, fn)]


@op("Split")
def split(ctx):
    """Pieces along `axis`: sizes from the `split` input/attribute, else `num_outputs` chunks of
    ceil(dim/n) (the last one smaller), else equal parts, one per output."""
    x = ctx.input(0)
    axis = norm_axis(ctx.attr("axis", 0), x.ndim)
    dim = x.shape[axis]
    n = len(ctx.node.outputs)
    sizes = _ints_of(ctx, 1, "split")
    if sizes is None:
        num = ctx.attr("num_outputs", n)
        chunk = -(-dim // num)
        sizes = [chunk] * (num - 1) + [dim - chunk * (num - 1)]
    if sum(sizes) != dim or min(sizes) < 0:
        ctx.fail(f"split sizes {sizes} do not add up to dim {dim}")
    starts = np.cumsum([0] + sizes).tolist()
    return [affine(x, axis, s, 1, k) for s, k in zip(starts, sizes)]


@op("Compress")
def compress(ctx):
    """Keep the slices along `axis` (or of the flattened input) where the constant condition holds."""
    x = ctx.input(0)
    if not ctx.has(1) or ctx.value(1).const is None:
        ctx.fail("the condition depends on runtime data, so the output length is data-dependent")
    cond = np.asarray(ctx.const(1, "condition")).reshape(-1).astype(bool)
    axis = ctx.attr("axis")
    if axis is None:
        x, axis = reshape(x, (x.size,)), 0
    axis = norm_axis(axis, x.ndim)
    sel = np.nonzero(cond[:x.shape[axis]])[0]
    return [_take_const(ctx, x, axis, sel)]


# --- gathers ---------------------------------------------------------------------------------------

def _check_const_indices(ctx, coords, dims: list):
    """Indices known at compile time must lie in [-dim, dim) along each axis they index: a run
    with them would read past the table (onnxruntime refuses it; grapec's masked read would give 0)."""
    v = ctx.value(1)
    if v.const is None or v.const.size == 0:
        return
    idx = np.asarray(v.const, np.int64)
    for c, dim in enumerate(dims):
        sel = idx if coords is None else idx[..., c]
        lo, hi = int(sel.min()), int(sel.max())
        if lo < -dim or hi >= dim:
            bad = hi if hi >= dim else lo
            table = ctx.node.inputs[0]
            raise IndexRangeError(
                f"node '{ctx.node.name}' ({ctx.node.op}): index {bad} reaches past '{table}', which has {dim} "
                f"entries along the axis it indexes (valid: {-dim}..{dim - 1}); the indices '{ctx.node.inputs[1]}' "
                f"are known at compile time, so these input shapes ask for more than the model holds")


@op("Gather")
def gather(ctx):
    """out[a, i.., b] = x[a, ind[i..], b] along `axis`; out-of-range indices read 0."""
    x, ind = ctx.input(0), ctx.input(1)
    axis = norm_axis(ctx.attr("axis", 0), x.ndim)
    dim, q = x.shape[axis], ind.ndim
    shape = x.shape[:axis] + ind.shape + x.shape[axis + 1:]
    _check_const_indices(ctx, None, [dim])

    def fn(ix):
        i = _wrap_negative(ind.at(ix[axis:axis + q]), dim)
        return _read(x, ix[:axis] + (i,) + ix[axis + q:], _in_range(i, dim), K.const(0, x.dtype))
    return [T(shape, x.dtype, fn)]


@op("GatherElements")
def gather_elements(ctx):
    """out[i] = x[i with i[axis] replaced by ind[i]]; out has the indices' shape."""
    x, ind = ctx.input(0), ctx.input(1)
    axis = norm_axis(ctx.attr("axis", 0), x.ndim)
    dim = x.shape[axis]
    _check_const_indices(ctx, None, [dim])

    def fn(ix):
        i = _wrap_negative(ind.at(ix), dim)
        src = list(ix)
        src[axis] = i
        return _read(x, src, _in_range(i, dim), K.const(0, x.dtype))
    return [T(ind.shape, x.dtype, fn)]


@op("GatherND")
def gather_nd(ctx):
    """ind[..., k] holds k coordinates into x after its first `batch_dims` dims (shared with ind):
    out[b.., j.., rest..] = x[b.., ind[b.., j.., :], rest..]."""
    x, ind = ctx.input(0), ctx.input(1)
    b = ctx.attr("batch_dims", 0)
    k = ind.shape[-1]
    lead = ind.ndim - 1
    shape = ind.shape[:-1] + x.shape[b + k:]
    _check_const_indices(ctx, k, list(x.shape[b:b + k]))

    def fn(ix):
        coords, valid = [], K.const(True, "bool")
        for c in range(k):
            i = _wrap_negative(ind.at(ix[:lead] + (_i(c),)), x.shape[b + c])
            coords.append(i)
            valid = _and(valid, _in_range(i, x.shape[b + c]))
        return _read(x, ix[:b] + tuple(coords) + ix[lead:], valid, K.const(0, x.dtype))
    return [T(shape, x.dtype, fn)]


# --- scatters: out[i] = a reduction over the update positions that target i -------------------------

def _combine(reduction: str, old: K.Expr, hit: K.Expr, upd: K.Expr, r: tuple) -> K.Expr:
    """Fold every update with hit=True into old: add/mul/max/min (reduction 'none' is handled by
    the callers, which pick the last hitting update)."""
    dt = old.dtype
    if reduction == "add":
        return K.binary("add", old, K.reduce("sum", K.where(hit, upd, K.const(0, dt)), r))
    if reduction == "mul":
        return K.binary("mul", old, K.reduce("prod", K.where(hit, upd, K.const(1, dt)), r))
    if reduction == "max":
        return K.binary("max", old, K.reduce("max", K.where(hit, upd, K.const(_lowest(dt), dt)), r))
    if reduction == "min":
        return K.binary("min", old, K.reduce("min", K.where(hit, upd, K.const(_highest(dt), dt)), r))
    raise ValueError(f"unknown reduction {reduction!r}")


def _last_hit(hit: K.Expr, pos: K.Expr, r: tuple) -> K.Expr:
    """The largest position (in update order) whose hit is true, or -1."""
    return K.reduce("max", K.where(hit, pos, _i(-1)), r)


def _scatter_elements(ctx, reduction: str):
    """out[i] = x[i] combined with upd[j] for every j with ind[j] == i[axis] and j == i elsewhere.
    Only j[axis] varies for a given i, so each element reduces over ind.shape[axis] positions."""
    x, ind, upd = ctx.input(0), ctx.input(1), ctx.input(2)
    axis = norm_axis(ctx.attr("axis", 0), x.ndim)
    dim, m = x.shape[axis], ind.shape[axis]

    def fn(ix):
        r = K.ridx(m)
        j, inside = list(ix), K.const(True, "bool")
        for d in range(x.ndim):
            if d == axis:
                j[d] = r
            elif ind.shape[d] < x.shape[d]:  # positions past the indices' extent get no update
                inside = _and(inside, K.binary("lt", ix[d], _i(ind.shape[d])))
                j[d] = K.binary("min", ix[d], _i(ind.shape[d] - 1))
        hit = _and(inside, K.binary("eq", _wrap_negative(ind.at(j), dim), ix[axis]))
        old = x.at(ix)
        if reduction != "none":
            return _combine(reduction, old, hit, upd.at(j), (r,))
        last = _last_hit(hit, r, (r,))
        j[axis] = K.binary("max", last, _i(0))
        return K.where(K.binary("ge", last, _i(0)), upd.at(j), old)
    return [T(x.shape, x.dtype, fn)]


@op("ScatterElements")
def scatter_elements(ctx):
    return _scatter_elements(ctx, ctx.attr("reduction", "none"))


@op("Scatter")
def scatter(ctx):
    """Opset 9-10 name of ScatterElements without reduction."""
    return _scatter_elements(ctx, "none")


@op("ScatterND")
def scatter_nd(ctx):
    """ind[j, :k] addresses x[ind[j], ...]; upd[j, ...] is written (or combined) there. Each output
    element reduces over all update rows j."""
    x, ind, upd = ctx.input(0), ctx.input(1), ctx.input(2)
    reduction = ctx.attr("reduction", "none")
    k = ind.shape[-1]
    rows = math.prod(ind.shape[:-1])
    ind2 = reshape(ind, (rows, k))
    upd2 = reshape(upd, (rows,) + x.shape[k:])

    def fn(ix):
        r = K.ridx(rows)
        hit = K.const(True, "bool")
        for c in range(k):
            hit = _and(hit, K.binary("eq", _wrap_negative(ind2.at((r, _i(c))), x.shape[c]), ix[c]))
        old = x.at(ix)
        if reduction != "none":
            return _combine(reduction, old, hit, upd2.at((r,) + tuple(ix[k:])), (r,))
        last = _last_hit(hit, r, (r,))
        new = upd2.at((K.binary("max", last, _i(0)),) + tuple(ix[k:]))
        return K.where(K.binary("ge", last, _i(0)), new, old)
    return [T(x.shape, x.dtype, fn)]


# --- padding and cropping --------------------------------------------------------------------------

def _pad_source(mode: str, o: K.Expr, before: int, d: int) -> K.Expr:
    """The source coordinate of output coordinate o along an axis padded by `before` (reflect,
    edge and wrap always land inside [0, d))."""
    src = o - before
    if mode == "edge":
        return _clamp(src, d)
    if mode == "wrap":
        return (o + (-before) % d) % d  # o >= 0, so C mod is the math mod here
    if mode == "reflect":
        if d == 1:
            return _i(0)
        period = 2 * (d - 1)
        m = (o + (-before) % period) % period
        return K.where(K.binary("lt", m, _i(d)), m, _i(period) - m)
    raise ValueError(f"unknown pad mode {mode!r}")


def _pad(ctx, x: T, before: list, after: list, mode: str, value: K.Expr) -> T:
    """Pad every axis by before/after; negative amounts crop first (as onnxruntime does, so
    reflect and wrap see the cropped tensor)."""
    for axis, (d, b, a) in enumerate(zip(x.shape, before, after)):
        if b < 0 or a < 0:
            if d + min(b, 0) + min(a, 0) < 0:
                ctx.fail(f"pads {before + after} crop more than the input shape {list(x.shape)}")
            x = affine(x, axis, max(-b, 0), 1, d + min(b, 0) + min(a, 0))
    before, after = [max(b, 0) for b in before], [max(a, 0) for a in after]
    shape = tuple(d + b + a for d, b, a in zip(x.shape, before, after))
    if mode != "constant" and any(d == 0 and (b or a) for d, b, a in zip(x.shape, before, after)):
        ctx.fail(f"{mode} padding of an empty axis")

    def fn(ix):
        src, valid = [], K.const(True, "bool")
        for o, b, a, d in zip(ix, before, after, x.shape):
            if b == 0 and a == 0:
                src.append(o)
            elif mode == "constant":
                s = o - b
                if b > 0:
                    valid = _and(valid, K.binary("ge", s, _i(0)))
                if a > 0:
                    valid = _and(valid, K.binary("lt", s, _i(d)))
                src.append(s)
            else:
                src.append(_pad_source(mode, o, b, d))
        return _read(x, src, valid, value) if mode == "constant" else x.at(src)
    return T(shape, x.dtype, fn)


@op("Pad")
def pad(ctx):
    """pads = [x1_begin, x2_begin, .., x1_end, x2_end, ..] over `axes` (default all); from the
    attribute `pads`/`paddings` (opset < 11) or input 1. The constant is input 2 or attr `value`."""
    x = ctx.input(0)
    mode = ctx.attr("mode", "constant")
    pads = _ints_of(ctx, 1, "pads")
    if pads is None:
        pads = _ints(ctx.attr("paddings"))
    axes = _axes_of(ctx, 3, x.ndim) or list(range(x.ndim))
    if len(pads) != 2 * len(axes):
        ctx.fail(f"{len(pads)} pads for {len(axes)} axes")
    before, after = [0] * x.ndim, [0] * x.ndim
    for k, a in enumerate(axes):
        before[a], after[a] = pads[k], pads[k + len(axes)]
    if ctx.has(2):
        value = K.cast(_scalar_of(ctx.input(2)), x.dtype)
    else:
        value = K.const(ctx.attr("value", 0.0), x.dtype)
    return [_pad(ctx, x, before, after, mode, value)]


@op("CenterCropPad")
def center_crop_pad(ctx):
    """Each listed axis becomes shape[k]: centered crop when smaller, centered zero pad when larger
    (the odd extra element goes to the end)."""
    x = ctx.input(0)
    target = _ints(ctx.const(1, "shape"))
    axes = [norm_axis(a, x.ndim) for a in ctx.attr("axes", range(x.ndim))]
    before, after = [0] * x.ndim, [0] * x.ndim
    for a, t in zip(axes, target):
        diff = t - x.shape[a]
        before[a] = diff // 2 if diff > 0 else -((-diff) // 2)
        after[a] = diff - before[a]
    return [_pad(ctx, x, before, after, "constant", K.const(0, x.dtype))]


# --- broadcasting and repetition -------------------------------------------------------------------

@op("Expand")
def expand_(ctx):
    """Bidirectional broadcast of x with the constant shape."""
    x = ctx.input(0)
    shape = broadcast_shapes(x.shape, _ints(ctx.const(1, "shape")), what="Expand")
    return [expand(x, shape)]


@op("Tile")
def tile(ctx):
    """out[i] = x[i mod shape]; repeats from input 1 (opset 1-5: `tiles` times along input `axis`)."""
    x = ctx.input(0)
    if ctx.has(2):
        reps = [1] * x.ndim
        reps[norm_axis(int(ctx.const(2, "axis").reshape(-1)[0]), x.ndim)] = int(ctx.const(1, "tiles").reshape(-1)[0])
    else:
        reps = _ints(ctx.const(1, "repeats"))
    shape = tuple(d * r for d, r in zip(x.shape, reps))

    def fn(ix):
        return x.at([i if r == 1 else i % d for i, d, r in zip(ix, x.shape, reps)])
    return [T(shape, x.dtype, fn)]


@op("DepthToSpace")
def depth_to_space(ctx):
    """(N, C, H, W) -> (N, C/b², H*b, W*b); DCR takes the block offset from the channel's high
    bits, CRD from its low bits."""
    x = ctx.input(0)
    b = ctx.attr("blocksize")
    n, c, h, w = x.shape
    if ctx.attr("mode", "DCR") == "DCR":
        t = transpose(reshape(x, (n, b, b, c // (b * b), h, w)), (0, 3, 4, 1, 5, 2))
    else:
        t = transpose(reshape(x, (n, c // (b * b), b, b, h, w)), (0, 1, 4, 2, 5, 3))
    return [reshape(t, (n, c // (b * b), h * b, w * b))]


@op("SpaceToDepth")
def space_to_depth(ctx):
    """(N, C, H, W) -> (N, C*b², H/b, W/b), the block offset in the channel's high bits (DCR, the
    default) or low bits (CRD)."""
    x = ctx.input(0)
    b = ctx.attr("blocksize")
    n, c, h, w = x.shape
    perm = (0, 3, 5, 1, 2, 4) if ctx.attr("mode", "DCR") == "DCR" else (0, 1, 3, 5, 2, 4)
    t = transpose(reshape(x, (n, c, h // b, b, w // b, b)), perm)
    return [reshape(t, (n, c * b * b, h // b, w // b))]


# --- masks and reversals ---------------------------------------------------------------------------

@op("Trilu")
def trilu(ctx):
    """Keep the upper (j - i >= k) or lower (j - i <= k) triangle of the last two dims; zero
    elsewhere. k (input 1, default 0) may be runtime data."""
    x = ctx.input(0)
    k = K.cast(_scalar_of(ctx.input(1)), I64) if ctx.has(1) else _i(0)
    upper = ctx.attr("upper", 1)

    def fn(ix):
        diag = ix[-1] - ix[-2]
        keep = K.binary("ge", diag, k) if upper else K.binary("le", diag, k)
        return K.where(keep, x.at(ix), K.const(0, x.dtype))
    return [T(x.shape, x.dtype, fn)]


@op("ReverseSequence")
def reverse_sequence(ctx):
    """For batch entry b, the first lens[b] steps along time_axis are reversed, the rest kept."""
    x, lens = ctx.input(0), ctx.input(1)
    tax, bax = ctx.attr("time_axis", 0), ctx.attr("batch_axis", 1)
    steps = x.shape[tax]

    def fn(ix):
        t = ix[tax]
        n = K.binary("min", K.cast(lens.at((ix[bax],)), I64), _i(steps))
        src = list(ix)
        src[tax] = K.where(K.binary("lt", t, n), n - 1 - t, t)
        return x.at(src)
    return [T(x.shape, x.dtype, fn)]


# --- Resize / Upsample -----------------------------------------------------------------------------
# Resizing is separable: along each resized axis, output position o reads a few input positions
# idx[o, t] with weights w[o, t]. Those tables depend only on shapes and constant scales, so they
# are computed here (the formulas of the ONNX spec, in float64) and the kernel is
#     out[o] = sum over taps t of prod_axes w_a[o_a, t_a] * x[idx_a[o_a, t_a] ..]
# Nearest needs one tap per axis and no weights.

def _source_coords(ctm: str, out_len: int, in_len: int, scale: float, roi) -> tuple:
    """Input coordinate of every output position (float64, the spec's formulas, with
    length_resized the integer output length as onnxruntime and PyTorch use it) and, for
    tf_crop_and_resize, which positions fall outside the input (they get extrapolation_value)."""
    y = np.arange(out_len, dtype=np.float64)
    outside = None
    if ctm == "align_corners":
        x = np.zeros(out_len) if out_len == 1 else y * (in_len - 1) / (out_len - 1)
    elif ctm == "asymmetric":
        x = y / scale
    elif ctm == "tf_crop_and_resize":
        lo, hi = roi
        x = np.full(out_len, (hi - lo) * (in_len - 1) / 2) if out_len == 1 else y * (hi - lo) * (in_len - 1) / (out_len - 1)
        x = x + lo * (in_len - 1)
        outside = (x < 0) | (x > in_len - 1)
    elif ctm == "pytorch_half_pixel":
        x = np.zeros(out_len) if out_len == 1 else (y + 0.5) / scale - 0.5
    elif ctm == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif ctm == "half_pixel_symmetric":
        offset = in_len / 2 * (1 - out_len / (scale * in_len))
        x = offset + (y + 0.5) / scale - 0.5
    else:
        raise ValueError(f"unknown coordinate_transformation_mode {ctm!r}")
    return x, outside


def _nearest_index(x: np.ndarray, mode: str, scale: float, in_len: int) -> np.ndarray:
    """One input index per output position. 'simple' is the rule of Resize-10 and Upsample: floor
    when upsampling, ceil when downsampling."""
    fl = np.floor(x)
    if mode == "simple":
        mode = "floor" if scale >= 1 else "ceil"
    pick = {"round_prefer_floor": fl + (x - fl > 0.5), "round_prefer_ceil": fl + (x - fl >= 0.5),
            "floor": fl, "ceil": np.ceil(x)}[mode]
    return np.clip(pick, 0, in_len - 1).astype(np.int64)


def _tap_weights(mode: str, ratio: float, scale: float, a: float, antialias: bool) -> np.ndarray:
    """Weights of the taps around a source coordinate whose distance to its left tap is `ratio`
    (in (0, 1]); with antialias, downsampling widens the filter by 1/scale."""
    if antialias and scale < 1:
        if mode == "linear":
            start = int(np.floor(-1 / scale) + 1)
            args = (np.arange(start, 2 - start) - ratio) * scale
            w = np.clip(1 - np.abs(args), 0, 1)
        else:
            start = int(np.floor(-2 / scale) + 1)
            d = np.abs(scale * (np.arange(start, 2 - start) - ratio))
            w = np.where(d <= 1, (a + 2) * d ** 3 - (a + 3) * d ** 2 + 1,
                         np.where(d < 2, a * d ** 3 - 5 * a * d ** 2 + 8 * a * d - 4 * a, 0.0))
        return w / w.sum()
    if mode == "linear":
        return np.array([1 - ratio, ratio])
    r, s = ratio, 1 - ratio
    return np.array([((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
                     ((a + 2) * r - (a + 3)) * r * r + 1,
                     ((a + 2) * s - (a + 3)) * s * s + 1,
                     ((a * (s + 1) - 5 * a) * (s + 1) + 8 * a) * (s + 1) - 4 * a])


def _tap_tables(x: np.ndarray, mode: str, scale: float, in_len: int, a: float, antialias: bool,
                exclude_outside: bool) -> tuple:
    """(idx, w), both (out_len, taps): the taps nearest each source coordinate (ties to the left),
    indices clamped into the input (edge padding), weights of taps outside zeroed and renormalized
    when exclude_outside."""
    fl = np.floor(x)
    ratios = np.where(x == fl, 1.0, x - fl)
    w = np.stack([_tap_weights(mode, float(r), scale, a, antialias) for r in ratios])
    n = w.shape[1]
    pad = (n + 1) // 2
    xp = x + pad
    p = np.floor(xp)
    frac = xp - p
    if n % 2 == 0:
        offset = np.where(frac == 0, -(n // 2), -(n // 2) + 1)
    else:
        offset = np.where(frac <= 0.5, -((n - 1) // 2), -((n - 1) // 2) + 1)
    idx = (p + offset).astype(np.int64)[:, None] + np.arange(n)[None, :] - pad
    if exclude_outside:
        w = np.where((idx < 0) | (idx >= in_len), 0.0, w)
        total = w.sum(axis=1, keepdims=True)
        w = w / np.where(total == 0, 1.0, total)
    return np.clip(idx, 0, in_len - 1), w


def _index_expr(ctx, table: np.ndarray, o: K.Expr) -> K.Expr:
    """table[o] for an int table: inline when affine or o // s, else a load of the table."""
    n = len(table)
    step = int(table[1] - table[0]) if n > 1 else 0
    if np.array_equal(table, table[0] + step * np.arange(n)):
        return o * step + int(table[0])
    for s in range(2, n + 1):
        if np.array_equal(table, np.arange(n) // s):
            return o // s
    return _const_tensor(ctx, table, "resize_idx").at((o,))


def _resize_geometry(shape, axes, scales, sizes, policy: str) -> tuple:
    """Per-axis scale and output length, as the spec derives them from scales or sizes."""
    r = len(shape)
    scale, out = [1.0] * r, list(shape)
    if sizes is not None:
        for k, a in enumerate(axes):
            out[a] = int(sizes[k])
            scale[a] = out[a] / shape[a]
        if policy != "stretch":
            pick = min if policy == "not_larger" else max
            s = pick(scale[a] for a in axes)
            for a in axes:
                scale[a], out[a] = s, int(s * shape[a] + 0.5)
    else:
        for k, a in enumerate(axes):
            scale[a] = float(scales[k])
            out[a] = int(float(np.float64(scales[k]) * shape[a]))
    return scale, out


def _resize(ctx, x: T, mode: str, scales, sizes, axes, roi, ctm: str, nearest_mode: str = "simple") -> T:
    mode = {"bilinear": "linear", "trilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    if mode not in ("nearest", "linear", "cubic"):
        ctx.fail(f"mode {mode!r} is not supported")
    antialias = bool(ctx.attr("antialias", 0))
    if antialias and mode == "nearest":
        ctx.fail("antialias with mode 'nearest' is undefined")
    r = x.ndim
    if (scales is None) == (sizes is None):
        ctx.fail("exactly one of scales and sizes must be given")
    scale, out = _resize_geometry(x.shape, axes, scales, sizes, ctx.attr("keep_aspect_ratio_policy", "stretch"))
    if ctm == "tf_crop_and_resize":
        full = [0.0] * r + [1.0] * r
        for k, a in enumerate(axes):
            full[a], full[a + r] = float(roi[k]), float(roi[k + len(axes)])
        roi_of = lambda a: (full[a], full[a + r])  # noqa: E731
    else:
        roi_of = lambda a: None  # noqa: E731
    cubic_a = ctx.attr("cubic_coeff_a", -0.75)
    exclude = bool(ctx.attr("exclude_outside", 0))
    nearest, taps, outside = {}, {}, {}
    for a in axes:
        trivial_roi = roi_of(a) is None or (math.isclose(roi_of(a)[0], 0) and math.isclose(roi_of(a)[1], 1))
        if math.isclose(scale[a], 1.0) and out[a] == x.shape[a] and trivial_roi:
            continue  # identity along this axis
        if out[a] == 0:
            continue
        src, ext = _source_coords(ctm, out[a], x.shape[a], scale[a], roi_of(a))
        if ext is not None and ext.any():
            outside[a] = _const_tensor(ctx, ext, "resize_outside")
        if mode == "nearest":
            nearest[a] = _nearest_index(src, nearest_mode, scale[a], x.shape[a])
        else:
            idx, w = _tap_tables(src, mode, scale[a], x.shape[a], cubic_a, antialias, exclude)
            taps[a] = (_const_tensor(ctx, idx, "resize_idx"), w)
    acc = x.dtype if dtypes.is_float(x.dtype) else "float64"
    taps = {a: (idx, _const_tensor(ctx, w.astype(dtypes.np_dtype(acc)), "resize_w")) for a, (idx, w) in taps.items()}
    ev = K.const(ctx.attr("extrapolation_value", 0.0), x.dtype)

    def fn(ix):
        src, weight, rvars = list(ix), None, []
        for a, table in nearest.items():
            src[a] = _index_expr(ctx, table, ix[a])
        for a, (idx, w) in taps.items():
            t = K.ridx(idx.shape[1])
            rvars.append(t)
            src[a] = idx.at((ix[a], t))
            wa = w.at((ix[a], t))
            weight = wa if weight is None else K.binary("mul", weight, wa)
        v = x.at(src)
        if rvars:
            v = K.reduce("sum", K.binary("mul", K.cast(v, acc), weight), tuple(rvars))
            if acc != x.dtype:  # integers: round half to even and saturate, as the spec's cast does
                lo, hi = _lowest(x.dtype), _highest(x.dtype)
                v = K.binary("min", K.binary("max", K.unary("round", v), K.const(lo, acc)), K.const(hi, acc))
                v = K.cast(v, x.dtype)
        for a, mask in outside.items():
            v = K.where(mask.at((ix[a],)), ev, v)
        return v
    return T(out, x.dtype, fn)


def _const_or_none(ctx, i: int, what: str):
    """A constant input, or None when it is absent or empty (Resize's unused roi/scales)."""
    if not ctx.has(i):
        return None
    v = ctx.const(i, what)
    return v if v.size else None


@op("Resize")
def resize(ctx):
    """Resize-10: (X, scales), asymmetric coordinates. Resize-11+: (X, roi, scales, sizes) with
    coordinate_transformation_mode, nearest_mode, cubic_coeff_a, exclude_outside, axes, ..."""
    x = ctx.input(0)
    mode = ctx.attr("mode", "nearest")
    axes = [norm_axis(a, x.ndim) for a in ctx.attr("axes", range(x.ndim))]
    if ctx.n_inputs == 2 and (ctx.graph.opset or 10) < 11:
        return [_resize(ctx, x, mode, ctx.const(1, "scales"), None, axes, None, "asymmetric")]
    scales = _const_or_none(ctx, 2, "scales")
    sizes = _const_or_none(ctx, 3, "sizes")
    ctm = ctx.attr("coordinate_transformation_mode", "half_pixel")
    roi = _const_or_none(ctx, 1, "roi") if ctm == "tf_crop_and_resize" else None
    if ctm == "tf_crop_and_resize" and roi is None:
        ctx.fail("tf_crop_and_resize needs the roi input")
    return [_resize(ctx, x, mode, scales, sizes, axes, roi, ctm, ctx.attr("nearest_mode", "round_prefer_floor"))]


@op("Upsample")
def upsample(ctx):
    """Deprecated Resize: scales from the attribute (opset 7) or input 1 (opset 9); asymmetric
    coordinates, nearest rounds down."""
    x = ctx.input(0)
    scales = ctx.const(1, "scales") if ctx.has(1) else np.asarray(ctx.attr("scales"), np.float32)
    return [_resize(ctx, x, ctx.attr("mode", "nearest"), scales, None, list(range(x.ndim)), None, "asymmetric")]
