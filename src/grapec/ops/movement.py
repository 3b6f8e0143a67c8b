"""Data movement: almost every op here is an index remap (no arithmetic), so it folds into its
consumer's loads or, when it is still a plain reshape of a value, becomes a free View. Gather* and
Scatter* are in gather.py, Resize in resize.py; what they share is in indexing.py.

Compile-time parameters (axes, starts, pads, repeats, scales...) come from attributes in older
opsets and from constant inputs in newer ones; `ints_of` and `axes_of` read either form.
Runtime indices (ReverseSequence) are normalized with `where` and every read that may fall outside
its tensor goes through `masked_read`, which masks the load.
"""
from __future__ import annotations

import math

import numpy as np

from ..ir import kernel as K
from ..ir.tensor import T, affine, broadcast_shapes, expand, norm_axis, reshape, transpose
from . import op
from .counted import concat_counted, counted_inputs
from .indexing import I64, all_of, axes_of, clamp, int_const, ints, ints_of, masked_read, scalar_of


# --- reshapes (Views) ------------------------------------------------------------------------------

@op("Reshape")
def reshape_(ctx):
    """A target computed from a data-dependent size is taken at its bound: the data is at its bound too,
    and its counts follow the axes (ops/counted.py)."""
    x = ctx.input(0)
    if ctx.has(1):
        shape = [int(d) for d in ctx.shape_param(1, "shape")[0]]
    else:  # opset < 5
        shape = list(ctx.attr("shape"))
    allowzero = ctx.attr("allowzero", 0)
    out = [x.shape[i] if d == 0 and not allowzero else d for i, d in enumerate(shape)]
    counts = ctx.value(0).counts or {}
    if -1 not in out and math.prod(out) < x.size and set(counts) == {0} and ctx.value(1).const is not None:
        return [_first_rows_reshaped(ctx, x, out, counts[0])]
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1]))
        out[out.index(-1)] = x.size // known if known else 0
    return [reshape(x, out)]


def _first_rows_reshaped(ctx, x: T, out: list, count: str) -> T:
    """A constant target shape smaller than the bound of rows counted along axis 0: the valid rows lead,
    so the output is the first prod(out) elements, and the run must hold exactly that many (ONNX's
    rule, checked at run time: ultralytics pads its detections to max_det rows this way)."""
    size, inner = math.prod(out), math.prod(x.shape[1:])
    rows = ctx.tensor(ctx.graph.lookup(count))
    ctx.check_equals(T((), I64, lambda ix: rows.at(()) * int_const(inner)), size)
    ctx.counts_handled = True   # the output is fixed: no count travels on
    flat = reshape(x, (x.size,))
    return reshape(T((size,), x.dtype, lambda ix: flat.at(ix)), out)


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
    axes = axes_of(ctx, 1, x.ndim)
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
    axes = ints_of(ctx, 1, "axes")
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
        starts, ends = ints(ctx.attr("starts")), ints(ctx.attr("ends"))
        axes = ints(ctx.attr("axes", range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts = ints(ctx.const(1, "starts"))
        ends, runtime_ends = ctx.shape_param(2, "ends")   # x[:n] with n a data-dependent count: its bound
        ends = ints(ends)
        axes = ints(ctx.const(3, "axes")) if ctx.has(3) else list(range(len(starts)))
        steps = ints(ctx.const(4, "steps")) if ctx.has(4) else [1] * len(starts)
        for k, end in runtime_ends.items():
            a = norm_axis(axes[k], x.ndim)
            if starts[k] != 0 or steps[k] != 1 or np.asarray(ctx.value(2).bounds[0]).reshape(-1)[k] < 0:
                ctx.fail("a run-time end is taken only from 0 by 1 and when it cannot be negative")
            dim = x.shape[a]
            n = T((), "int64", lambda ix, end=end, dim=dim: K.binary("min", end.at(()), int_const(dim)))
            ctx.count_output(0, a, n, min(ends[k], dim), ctx.size_source(2, "end"))
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
    if any(axis in (v.counts or {}) for _, v in counted_inputs(ctx.node, ctx.graph)):
        return [concat_counted(ctx, axis)]
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
                inside = K.binary("ge", i, int_const(starts[k]))
            if k < len(ts) - 1:
                inside = all_of(inside, K.binary("lt", i, int_const(starts[k + 1])))
            src = list(ix)
            src[axis] = i - starts[k]
            e = masked_read(ts[k], src, inside, e)
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
    sizes = ints_of(ctx, 1, "split")
    if sizes is None:
        num = ctx.attr("num_outputs", n)
        chunk = -(-dim // num)
        sizes = [chunk] * (num - 1) + [dim - chunk * (num - 1)]
    if sum(sizes) != dim or min(sizes) < 0:
        ctx.fail(f"split sizes {sizes} do not add up to dim {dim}")
    starts = np.cumsum([0] + sizes).tolist()
    return [affine(x, axis, s, 1, k) for s, k in zip(starts, sizes)]


def _pad_source(mode: str, o: K.Expr, before: int, d: int) -> K.Expr:
    """The source coordinate of output coordinate o along an axis padded by `before` (reflect,
    edge and wrap always land inside [0, d))."""
    src = o - before
    if mode == "edge":
        return clamp(src, d)
    if mode == "wrap":
        return (o + (-before) % d) % d  # o >= 0, so C mod is the math mod here
    if mode == "reflect":
        if d == 1:
            return int_const(0)
        period = 2 * (d - 1)
        m = (o + (-before) % period) % period
        return K.where(K.binary("lt", m, int_const(d)), m, int_const(period) - m)
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
                    valid = all_of(valid, K.binary("ge", s, int_const(0)))
                if a > 0:
                    valid = all_of(valid, K.binary("lt", s, int_const(d)))
                src.append(s)
            else:
                src.append(_pad_source(mode, o, b, d))
        return masked_read(x, src, valid, value) if mode == "constant" else x.at(src)
    return T(shape, x.dtype, fn)


@op("Pad")
def pad(ctx):
    """pads = [x1_begin, x2_begin, .., x1_end, x2_end, ..] over `axes` (default all); from the
    attribute `pads`/`paddings` (opset < 11) or input 1. The constant is input 2 or attr `value`."""
    x = ctx.input(0)
    mode = ctx.attr("mode", "constant")
    if ctx.has(2):
        value = K.cast(scalar_of(ctx.input(2)), x.dtype)
    else:
        value = K.const(ctx.attr("value", 0.0), x.dtype)
    axes = axes_of(ctx, 3, x.ndim) or list(range(x.ndim))
    pv = ctx.value(1) if ctx.has(1) else None
    if pv is not None and pv.const is None and pv.bounds is not None:   # amounts from a data-dependent size
        return [_pad_at_run_time(ctx, x, axes, mode, value)]
    pads = ints_of(ctx, 1, "pads")
    if pads is None:
        pads = ints(ctx.attr("paddings"))
    if len(pads) != 2 * len(axes):
        ctx.fail(f"{len(pads)} pads for {len(axes)} axes")
    before, after = [0] * x.ndim, [0] * x.ndim
    for k, a in enumerate(axes):
        before[a], after[a] = pads[k], pads[k + len(axes)]
    if any(after[a] for a in (ctx.value(0).counts or {})):   # the pad rows follow the valid ones
        return [_pad_at_run_time(ctx, x, axes, mode, value)]
    return [_pad(ctx, x, before, after, mode, value)]


def _pad_at_run_time(ctx, x: T, axes: list, mode: str, value: K.Expr) -> T:
    """Constant padding at the end of axes whose valid length is known at run time: the amounts read at
    run time (their upper bounds, passes/bounds.py, size the output), or an input's counted axis
    (ops/counted.py). Along such an axis the output holds the valid rows, then the pad rows, and is
    counted by their sum (torch's F.pad(dets, (0, 0, 0, max_det - len(dets))) in ultralytics' NMS export)."""
    n = len(axes)
    pv = ctx.value(1) if ctx.has(1) else None
    if pv is not None and pv.const is None:
        low, high = (np.asarray(b).reshape(-1).astype(np.int64) for b in pv.bounds)
        pads_t = ctx.tensor(pv)
        amount = lambda k: K.cast(pads_t.at((int_const(k),)), I64)  # noqa: E731
    else:
        low = high = np.asarray(ints_of(ctx, 1, "pads") if pv is not None else ints(ctx.attr("paddings")), np.int64)
        amount = lambda k: int_const(int(low[k]))  # noqa: E731
    if len(low) != 2 * n:
        ctx.fail(f"{len(low)} pads for {n} axes")
    if mode not in ("constant", b"constant") or (low[:n] != 0).any() or (high[:n] != 0).any() or (low[n:] < 0).any():
        ctx.fail("padding by amounts known only at run time (or after data-dependent rows) is supported at the end "
                 f"of axes, with a constant, and not cropping; got mode {mode} and pads between {low.tolist()} and "
                 f"{high.tolist()}")
    counts = ctx.value(0).counts or {}
    shape, valid = list(x.shape), {}
    ctx.out_counts = {}
    for k, a in enumerate(axes):
        if high[n + k] == 0:
            continue
        shape[a] = x.shape[a] + int(high[n + k])
        rows = ctx.tensor(ctx.graph.lookup(counts[a])).at(()) if a in counts else int_const(x.shape[a])
        valid[a] = rows
        ctx.count_output(0, a, T((), I64, lambda ix, rows=rows, k=k: rows + amount(n + k)), shape[a],
                         f"the input's {'counted ' if a in counts else ''}rows and the pads '{ctx.node.inputs[1]}'")
    for a, c in counts.items():   # counted axes without padding keep their counts
        ctx.out_counts.setdefault(0, {}).setdefault(a, c)
    ctx.counts_handled = True

    def fn(ix):
        inside = K.const(True, "bool")
        for a, rows in valid.items():
            inside = all_of(inside, K.binary("lt", ix[a], rows))
        return masked_read(x, list(ix), inside, value)
    return T(tuple(shape), x.dtype, fn)


@op("CenterCropPad")
def center_crop_pad(ctx):
    """Each listed axis becomes shape[k]: centered crop when smaller, centered zero pad when larger
    (the odd extra element goes to the end)."""
    x = ctx.input(0)
    target = ints(ctx.const(1, "shape"))
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
    """Bidirectional broadcast of x with the constant shape (or, computed from a data-dependent size, its
    bound: the axes it sizes are counted by its elements at run time)."""
    x = ctx.input(0)
    target, runtime = ctx.shape_param(1, "shape")
    target = ints(target)
    shape = broadcast_shapes(x.shape, target, what="Expand")
    for e, count in runtime.items():
        axis = len(shape) - len(target) + e
        if shape[axis] == target[e] and target[e] != 1:
            ctx.count_output(0, axis, count, shape[axis], ctx.size_source(1, "shape"))
    return [expand(x, shape)]


@op("Tile")
def tile(ctx):
    """out[i] = x[i mod shape]; repeats from input 1 (opset 1-5: `tiles` times along input `axis`)."""
    x = ctx.input(0)
    if ctx.has(2):
        reps = [1] * x.ndim
        reps[norm_axis(int(ctx.const(2, "axis").reshape(-1)[0]), x.ndim)] = int(ctx.const(1, "tiles").reshape(-1)[0])
    else:
        reps = ints(ctx.const(1, "repeats"))
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
    k = K.cast(scalar_of(ctx.input(1)), I64) if ctx.has(1) else int_const(0)
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
        n = K.binary("min", K.cast(lens.at((ix[bax],)), I64), int_const(steps))
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
