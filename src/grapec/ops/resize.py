"""Resize and Upsample: each output coordinate maps back to a source coordinate (the
coordinate_transformation_mode), and a few taps (nearest, linear, cubic; antialiased when
downscaling) are weighed from compile-time tables.
"""
from __future__ import annotations

import math

import numpy as np

from .. import dtypes
from ..ir import kernel as K
from ..ir.tensor import T, norm_axis
from . import op
from .indexing import const_tensor, highest, lowest


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
    return const_tensor(ctx, table, "resize_idx").at((o,))


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
            outside[a] = const_tensor(ctx, ext, "resize_outside")
        if mode == "nearest":
            nearest[a] = _nearest_index(src, nearest_mode, scale[a], x.shape[a])
        else:
            idx, w = _tap_tables(src, mode, scale[a], x.shape[a], cubic_a, antialias, exclude)
            taps[a] = (const_tensor(ctx, idx, "resize_idx"), w)
    acc = x.dtype if dtypes.is_float(x.dtype) else "float64"
    taps = {a: (idx, const_tensor(ctx, w.astype(dtypes.np_dtype(acc)), "resize_w")) for a, (idx, w) in taps.items()}
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
                lo, hi = lowest(x.dtype), highest(x.dtype)
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
