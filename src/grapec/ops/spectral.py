"""Signal processing: DFT, STFT and the window functions (audio front ends).

    DFT          y[.., k, :] = sum_n x[.., n, :] * exp(-+2 pi i k n / N)  (/ N when inverse); complex
                 values are a trailing axis of 2 (real input: 1). onesided keeps bins 0..N/2; an
                 inverse onesided DFT reads the missing bins as conjugates (numpy's irfft)
    STFT         frames of frame_length every frame_step, times the window, each one DFT
    Hann/Hamming/BlackmanWindow   w[n] = sum_j a_j cos(2 pi j n / N'), N' = size (periodic) or size - 1

Each DFT output element is one reduction over the signal (O(N) per bin: audio frames are hundreds
of samples). Angles come from (k * n) mod N in integers and sums run in float64, so a bin that should
be zero is zero to float64 rounding, as numpy's FFT gives.
"""
from __future__ import annotations

import math

import numpy as np

from .. import dtypes
from ..ir import kernel as K
from ..ir.tensor import T, norm_axis
from . import op

I64, F64 = "int64", "float64"


def _d(v) -> K.Expr:
    return K.const(float(v), F64)


def _n(v) -> K.Expr:
    return K.const(int(v), I64)


def _twiddle(k: K.Expr, n: K.Expr, size: int) -> tuple:
    """(cos, sin) of 2 pi k n / size, with k n reduced mod size first."""
    theta = K.binary("mul", K.cast(K.binary("mod", K.binary("mul", k, n), _n(size)), F64), _d(2 * math.pi / size))
    return K.unary("cos", theta), K.unary("sin", theta)


def _complex_at(x: T, ix: list, axis_pos: int, n: K.Expr, conj: K.Expr | None = None) -> tuple:
    """(re, im) of x at ix with ix[axis] = n, in float64; `conj` (bool) negates im."""
    at = list(ix)
    at[axis_pos] = n
    re = K.cast(x.at((*at, _n(0))), F64)
    im = K.cast(x.at((*at, _n(1))), F64) if x.shape[-1] == 2 else _d(0)
    if conj is not None:
        im = K.where(conj, K.unary("neg", im), im)
    return re, im


def dft(x: T, axis: int, size: int, inverse: bool, onesided: bool, scale: T | None = None) -> T:
    """The DFT of x (trailing axis: 1 real or 2 re/im) along `axis`, of length `size`; `scale`, a
    [size] tensor, multiplies the signal first (STFT's window)."""
    length = x.shape[axis]
    hermitian = inverse and onesided     # numpy's irfft: bins >= length are conjugates of N - k
    bins = size if inverse or not onesided else size // 2 + 1
    out_shape = list(x.shape[:-1])
    out_shape[axis] = bins
    out_shape.append(1 if hermitian else 2)
    sign = 1.0 if inverse else -1.0
    taps = size if hermitian else min(length, size)

    def fn(ix):
        k, part = ix[axis], ix[-1]
        r = K.ridx(taps)
        if hermitian:
            mirrored = K.binary("ge", r, _n(length))
            src = K.where(mirrored, K.binary("sub", _n(size), r), r)
            re, im = _complex_at(x, ix[:-1], axis, src, conj=mirrored)
        else:
            re, im = _complex_at(x, ix[:-1], axis, r)
        if scale is not None:
            w = K.cast(scale.at((r,)), F64)
            re, im = K.binary("mul", re, w), K.binary("mul", im, w)
        c, s = _twiddle(k, r, size)
        s = K.binary("mul", s, _d(sign))
        # (re + i im)(c + i s)
        real = K.binary("sub", K.binary("mul", re, c), K.binary("mul", im, s))
        imag = K.binary("add", K.binary("mul", re, s), K.binary("mul", im, c))
        body = real if hermitian else K.where(K.binary("eq", part, _n(0)), real, imag)
        total = K.reduce("sum", body, (r,))
        if inverse:
            total = K.binary("div", total, _d(size))
        return K.cast(total, x.dtype)
    return T(tuple(out_shape), x.dtype, fn)


@op("DFT")
def dft_(ctx):
    x = ctx.input(0)
    if x.shape[-1] not in (1, 2):
        ctx.fail(f"the last axis of the input has size {x.shape[-1]}, expected 1 (real) or 2 (complex)")
    if ctx.has(2):
        axis = int(ctx.const(2, "axis").reshape(()))
    else:
        axis = ctx.attr("axis", 1 if ctx.graph.opset < 20 else -2)
    axis = norm_axis(axis, x.ndim)
    if axis == x.ndim - 1:
        ctx.fail("axis is the complex axis (the last one)")
    inverse, onesided = bool(ctx.attr("inverse", 0)), bool(ctx.attr("onesided", 0))
    if ctx.has(1):
        size = int(ctx.const(1, "dft_length", "the output length").reshape(()))
    else:
        size = 2 * (x.shape[axis] - 1) if inverse and onesided else x.shape[axis]
    return [dft(x, axis, size, inverse, onesided)]


@op("STFT")
def stft(ctx):
    x = ctx.input(0)
    step = int(ctx.const(1, "frame_step", "the frame count").reshape(()))
    window = ctx.input(2)
    if ctx.has(3):
        size = int(ctx.const(3, "frame_length", "the frame length").reshape(()))
    elif window is not None:
        size = window.shape[0]
    else:
        ctx.fail("needs a window or a frame_length")
    if window is not None and window.shape[0] != size:
        ctx.fail(f"window length {window.shape[0]} differs from frame_length {size}")
    if x.ndim != 3 or x.shape[-1] not in (1, 2):
        ctx.fail(f"signal has shape {list(x.shape)}, expected [batch, length, 1 or 2]")
    frames = (x.shape[1] - size) // step + 1
    if frames < 1:
        ctx.fail(f"signal of length {x.shape[1]} is shorter than one frame ({size})")
    # [batch, frames, size, c]: frame f is the signal from f * step, read in place (no copy)
    framed = T((x.shape[0], frames, size, x.shape[2]), x.dtype,
               lambda ix: x.at((ix[0], K.binary("add", K.binary("mul", ix[1], _n(step)), ix[2]), ix[3])))
    return [dft(framed, 2, size, False, bool(ctx.attr("onesided", 1)), window)]


def _window(ctx, coefficients: tuple):
    size = int(ctx.const(0, "size", "the window length").reshape(()))
    periodic = bool(ctx.attr("periodic", 1))
    out_dt = dtypes.from_onnx(ctx.attr("output_datatype", 1))
    n = np.arange(size, dtype=np.float64)
    denom = size if periodic else size - 1
    w = np.zeros(size)
    for j, a in enumerate(coefficients):
        w += a * np.cos(2 * np.pi * j * n / denom) if denom else (a if j == 0 else 0)
    return [w.astype(dtypes.np_dtype(out_dt))]


@op("HannWindow")
def hann_window(ctx):
    return _window(ctx, (0.5, -0.5))


@op("HammingWindow")
def hamming_window(ctx):
    return _window(ctx, (25 / 46, -21 / 46))


@op("BlackmanWindow")
def blackman_window(ctx):
    return _window(ctx, (0.42, -0.5, 0.08))
