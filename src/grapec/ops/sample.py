"""Sampling at computed coordinates: GridSample and AffineGrid (spatial transformers, optical flow),
RoiAlign (two-stage detectors).

    AffineGrid   grid[n, *o, :] = theta[n] @ (x_D-1.., x_0, 1), x_d the normalized position of o_d
                 in [-1, 1] (pixel centres, or corners with align_corners)
    GridSample   y[n, c, *o] = interpolate(X[n, c], denormalize(grid[n, *o]))
                 mode nearest | linear | cubic (Keys, a = -0.75), taps outside X read per
                 padding_mode: zeros, border (clamped) or reflection
    RoiAlign     y[r, c, i, j] = avg (or max) over a sampling_ratio^2 grid of bilinear samples of
                 X[batch_indices[r], c] inside bin (i, j) of roi r (onnxruntime's algorithm, which
                 onnx.reference follows: max mode takes the max of the weighted corner values)

Any number of spatial dims. The grid's last axis lists coordinates innermost dim first (x, y[, z]),
as onnx.reference does. Every output element reads its taps at runtime indices: one kernel.
"""
from __future__ import annotations

import itertools

from .. import dtypes
from ..ir import kernel as K
from ..ir.tensor import T
from . import op
from .indexing import clamp, in_range

I64 = "int64"


def _f(v) -> K.Expr:
    return K.const(float(v), "float32")


def _add(a, b):
    return K.binary("add", a, b)


def _sub(a, b):
    return K.binary("sub", a, b)


def _mul(a, b):
    return K.binary("mul", a, b)


def _denormalize(g: K.Expr, length: int, align_corners: bool) -> K.Expr:
    if align_corners:
        return _mul(_add(g, _f(1)), _f((length - 1) / 2))
    return K.binary("div", _sub(_mul(_add(g, _f(1)), _f(length)), _f(1)), _f(2))


def _reflect(x: K.Expr, lo: float, hi: float) -> K.Expr:
    """Fold x back into [lo, hi] by reflecting at the borders as often as it takes."""
    span = hi - lo
    if span <= 0:
        return _f(lo)

    def fold(dx, near, far):   # dx >= 0 past the `near` border
        n = K.unary("floor", K.binary("div", dx, _f(span)))
        r = _sub(dx, _mul(n, _f(span)))
        even = K.binary("eq", K.binary("mod", n, _f(2)), _f(0))
        return K.where(even, near(r), far(r))
    below = fold(_sub(_f(lo), x), lambda r: _add(_f(lo), r), lambda r: _sub(_f(hi), r))
    above = fold(_sub(x, _f(hi)), lambda r: _sub(_f(hi), r), lambda r: _add(_f(lo), r))
    return K.where(K.binary("lt", x, _f(lo)), below, K.where(K.binary("gt", x, _f(hi)), above, x))


def _cubic_weights(t: K.Expr) -> list:
    """Keys' cubic convolution weights (a = -0.75) of the taps at -1, 0, 1, 2 from floor(x)."""
    a = -0.75

    def near(d):   # |d| <= 1
        return _add(_mul(_mul(_sub(_mul(_f(a + 2), d), _f(a + 3)), d), d), _f(1))

    def far(d):    # 1 < |d| < 2
        return _sub(_mul(_add(_mul(_sub(_mul(_f(a), d), _f(5 * a)), d), _f(8 * a)), d), _f(4 * a))
    one = _f(1)
    return [far(_add(t, one)), near(t), near(_sub(one, t)), far(_sub(_f(2), t))]


def _taps(x: K.Expr, mode: str) -> list:
    """(integer index, weight) pairs along one dim for source coordinate x."""
    if mode == "nearest":
        return [(K.cast(x, I64), None)]
    x0 = K.unary("floor", x)
    t = _sub(x, x0)
    i0 = K.cast(x0, I64)
    if mode == "linear":
        return [(i0, _sub(_f(1), t)), (K.binary("add", i0, K.const(1, I64)), t)]
    return [(K.binary("add", i0, K.const(k, I64)), w) for k, w in zip((-1, 0, 1, 2), _cubic_weights(t))]


@op("GridSample")
def grid_sample(ctx):
    x, grid = ctx.input(0), ctx.input(1)
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(ctx.attr("mode", "linear"), ctx.attr("mode", "linear"))
    padding = ctx.attr("padding_mode", "zeros")
    align = bool(ctx.attr("align_corners", 0))
    if mode not in ("nearest", "linear", "cubic"):
        ctx.fail(f"mode '{mode}' is not one of nearest, linear, cubic")
    if padding not in ("zeros", "border", "reflection"):
        ctx.fail(f"padding_mode '{padding}' is not one of zeros, border, reflection")
    dims = x.shape[2:]
    nd = len(dims)
    if grid.shape[-1] != nd or grid.shape[0] != x.shape[0]:
        ctx.fail(f"grid shape {list(grid.shape)} does not fit X {list(x.shape)}: expected [N, ..., {nd}]")
    acc = dtypes.accumulation(x.dtype) if dtypes.is_float(x.dtype) else "float32"
    bounds = [(0.0, d - 1.0) if align else (-0.5, d - 0.5) for d in dims]

    def source(ix, d):
        g = K.cast(grid.at((ix[0], *ix[2:], K.const(nd - 1 - d, I64))), "float32")
        s = _denormalize(g, dims[d], align)
        if mode == "nearest":
            s = K.unary("round", s)
        lo, hi = bounds[d]
        if padding == "border" and mode != "cubic":
            # cubic clamps each tap instead, as PyTorch and onnxruntime do: clamping the coordinate
            # first (onnx.reference) would shift the taps' weights at the border
            s = K.binary("min", K.binary("max", s, _f(0)), _f(dims[d] - 1))
        elif padding == "reflection":
            s = _reflect(s, lo, hi)
        return s

    def pixel_index(i, d):
        """-> (index to read, valid) for an integer tap index along dim d."""
        if padding == "zeros":
            return clamp(i, dims[d]), in_range(i, dims[d])
        if padding == "reflection":
            lo, hi = bounds[d]
            i = K.cast(_reflect(K.cast(i, "float32"), lo, hi), I64)
        return clamp(i, dims[d]), None

    def fn(ix):
        per_dim = [_taps(source(ix, d), mode) for d in range(nd)]
        total = None
        for combo in itertools.product(*per_dim):
            idx, valid, weight = [], None, None
            for d, (i, w) in enumerate(combo):
                j, ok = pixel_index(i, d)
                idx.append(j)
                valid = ok if valid is None else (valid if ok is None else K.binary("and", valid, ok))
                weight = w if weight is None else (weight if w is None else _mul(weight, w))
            v = K.cast(x.at((ix[0], ix[1], *idx)), acc)
            if valid is not None:
                v = K.where(valid, v, K.const(0.0, acc))
            if weight is not None:
                v = _mul(K.cast(weight, acc), v)
            total = v if total is None else _add(total, v)
        return K.cast(total, x.dtype)
    return [T((x.shape[0], x.shape[1], *grid.shape[1:-1]), x.dtype, fn)]


@op("AffineGrid")
def affine_grid(ctx):
    theta = ctx.input(0)
    size = [int(v) for v in ctx.const(1, "size", "the grid's shape").reshape(-1)]
    align = bool(ctx.attr("align_corners", 0))
    n, spatial = size[0], size[2:]
    nd = len(spatial)
    if theta.shape != (n, nd, nd + 1):
        ctx.fail(f"theta has shape {list(theta.shape)}, expected {[n, nd, nd + 1]} for size {size}")

    def position(o: K.Expr, length: int) -> K.Expr:
        """Normalized coordinate of index o along a dim of `length` (a pixel centre, or a corner)."""
        if length == 1:
            return _f(-1.0 if align else 0.0)
        step = 2.0 / (length - 1) if align else 2.0 / length
        start = -1.0 if align else -1.0 + 1.0 / length
        return _add(_f(start), _mul(K.cast(o, "float32"), _f(step)))

    def fn(ix):
        b, out_axis = ix[0], ix[-1]
        # homogeneous base coordinate, innermost spatial dim first: (x, y[, z], 1)
        base = [position(ix[1 + nd - 1 - k], spatial[nd - 1 - k]) for k in range(nd)] + [_f(1.0)]
        total = None
        for k, coord in enumerate(base):
            t = K.cast(theta.at((b, out_axis, K.const(k, I64))), "float32")
            total = _mul(t, coord) if total is None else _add(total, _mul(t, coord))
        return K.cast(total, theta.dtype)
    return [T((n, *spatial, nd), theta.dtype, fn)]



@op("RoiAlign")
def roi_align(ctx):
    x, rois, batch = ctx.input(0), ctx.input(1), ctx.input(2)
    mode = ctx.attr("mode", "avg")
    ph, pw = int(ctx.attr("output_height", 1)), int(ctx.attr("output_width", 1))
    grid = int(ctx.attr("sampling_ratio", 0))
    scale = float(ctx.attr("spatial_scale", 1.0))
    half_pixel = ctx.attr("coordinate_transformation_mode", "half_pixel") == "half_pixel"
    if grid <= 0:
        ctx.fail("sampling_ratio 0 takes a number of samples per bin that depends on each roi's size "
                 "(runtime data); export with a fixed sampling_ratio (torchvision's default is 2 in most detectors)")
    if x.ndim != 4 or rois.shape[-1] != 4:
        ctx.fail(f"X {list(x.shape)} and rois {list(rois.shape)}: expected [N, C, H, W] and [R, 4]")
    height, width = x.shape[2:]
    F64 = "float64"
    d = lambda v: K.const(float(v), F64)   # noqa: E731

    def corner(r, k):
        return _sub(_mul(K.cast(rois.at((r, K.const(k, I64))), F64), d(scale)), d(0.5 if half_pixel else 0.0))

    def axis_taps(start, size, pooled, o, t, extent):
        """Sample t of bin o along one axis: (low index, high index, weight of high, inside)."""
        extent_f = d(extent)
        bin_size = K.binary("div", size, d(pooled))
        v = _add(_add(start, _mul(K.cast(o, F64), bin_size)),
                 _mul(_add(K.cast(t, F64), d(0.5)), K.binary("div", bin_size, d(grid))))
        inside = K.binary("and", K.binary("ge", v, d(-1.0)), K.binary("le", v, extent_f))
        v = K.binary("max", v, d(0.0))
        low = K.cast(v, I64)
        at_edge = K.binary("ge", low, K.const(extent - 1, I64))
        low = K.where(at_edge, K.const(extent - 1, I64), low)
        high = K.where(at_edge, low, K.binary("add", low, K.const(1, I64)))
        frac = K.where(at_edge, d(0.0), _sub(v, K.cast(low, F64)))
        return low, high, frac, inside

    def fn(ix):
        r, c, i, j = ix
        # an image index past the batch reads nothing (0 out, as Gather's out-of-range indices), never
        # memory beyond X
        b = K.cast(batch.at((r,)), I64)
        b_valid = K.binary("and", K.binary("ge", b, K.const(0, I64)), K.binary("lt", b, K.const(x.shape[0], I64)))
        b = K.binary("min", K.binary("max", b, K.const(0, I64)), K.const(x.shape[0] - 1, I64))
        x1, y1, x2, y2 = (corner(r, k) for k in range(4))
        roi_w, roi_h = _sub(x2, x1), _sub(y2, y1)
        if not half_pixel:
            roi_w, roi_h = K.binary("max", roi_w, d(1.0)), K.binary("max", roi_h, d(1.0))
        ty, tx = K.ridx(grid), K.ridx(grid)
        y0, y1_, ly, in_y = axis_taps(y1, roi_h, ph, i, ty, height)
        x0, x1_, lx, in_x = axis_taps(x1, roi_w, pw, j, tx, width)
        hy, hx = _sub(d(1.0), ly), _sub(d(1.0), lx)
        terms = [_mul(_mul(wy, wx), K.cast(x.at((b, c, yy, xx)), F64))
                 for wy, yy in ((hy, y0), (ly, y1_)) for wx, xx in ((hx, x0), (lx, x1_))]
        if mode == "avg":
            sample = _add(_add(terms[0], terms[1]), _add(terms[2], terms[3]))
        else:
            sample = K.binary("max", K.binary("max", terms[0], terms[1]), K.binary("max", terms[2], terms[3]))
        sample = K.where(K.binary("and", K.binary("and", in_y, in_x), b_valid), sample, d(0.0))
        if mode == "avg":
            out = K.binary("div", K.reduce("sum", sample, (ty, tx)), d(grid * grid))
        else:
            out = K.reduce("max", sample, (ty, tx))
        return K.cast(out, x.dtype)
    if mode not in ("avg", "max"):
        ctx.fail(f"mode '{mode}' is not avg or max")
    return [T((rois.shape[0], x.shape[1], ph, pw), x.dtype, fn)]
