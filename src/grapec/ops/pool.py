"""Pooling in kernel IR: a reduce over the window, masked loads for the padding."""
from __future__ import annotations

import math

from ..ir import kernel as K
from ..ir.tensor import T, map_
from ..ir.tensor import reduce as tensor_reduce
from . import op
from .window import _acc_dtype, _and, _lowest, _masked_at, _window_params


# --- pooling (kernel IR: a reduce over the window, masked loads for padding) ---------------------

def _pool_geometry(ctx, x, kernel):
    """strides, dilations, pads (auto_pad resolved) and output spatial shape; ceil_mode drops a
    last window that would start in the end padding, like onnx.reference / PyTorch."""
    in_sp = x.shape[2:]
    nd = len(in_sp)
    strides, dil, pads, ext = _window_params(ctx, in_sp, kernel)
    ceil_mode = int(ctx.attr("ceil_mode", 0))
    out_sp = []
    for i in range(nd):
        span = in_sp[i] + pads[i] + pads[i + nd] - ext[i]
        n = (-(-span // strides[i]) if ceil_mode else span // strides[i]) + 1
        if ceil_mode and (n - 1) * strides[i] >= in_sp[i] + pads[i]:
            n -= 1
        out_sp.append(max(n, 0))
    return strides, dil, pads, out_sp


class _Window:
    """The window of output element `ix`: input coordinates for reduction variables `rv` and
    whether each coordinate lies inside the input (None where it always does)."""

    def __init__(self, x, kernel, strides, dil, pads, out_sp):
        self.x, self.kernel, self.strides, self.dil, self.pads = x, kernel, strides, dil, pads
        self.in_sp = x.shape[2:]
        nd = len(kernel)
        # a dim needs a bounds check when some window reaches the padding
        self.checked = [pads[i] > 0 or (out_sp[i] - 1) * strides[i] - pads[i] + (kernel[i] - 1) * dil[i] >= self.in_sp[i]
                        for i in range(nd)]

    def coord(self, ix, d, r):
        return ix[2 + d] * self.strides[d] - self.pads[d] + r * self.dil[d]

    def inside(self, p, d, lo=0, hi=None):
        hi = self.in_sp[d] if hi is None else hi
        return K.binary("and", K.binary("ge", p, K.const(lo, "int64")), K.binary("lt", p, K.const(hi, "int64")))

    def values(self, ix, rv, fill):
        """(element at the window position rv, valid mask) with `fill` outside the input."""
        coords = [self.coord(ix, d, r) for d, r in enumerate(rv)]
        valid = None
        for d, p in enumerate(coords):
            if self.checked[d]:
                valid = _and(valid, self.inside(p, d))
        return _masked_at(self.x, (ix[0], ix[1], *coords), valid, K.const(fill, self.x.dtype)), valid

    def count(self, ix, dtype, include_pad):
        """How many window positions lie inside the input (or the explicit padding)."""
        n = K.const(1, dtype)
        for d, k in enumerate(self.kernel):
            if not self.checked[d]:
                n = K.binary("mul", n, K.const(k, dtype))
                continue
            r = K.ridx(k)
            p = self.coord(ix, d, r)
            ok = self.inside(p, d, -self.pads[d], self.in_sp[d] + self.pads[d + len(self.kernel)]) \
                if include_pad else self.inside(p, d)
            n = K.binary("mul", n, K.reduce("sum", K.cast(ok, dtype), (r,)))
        return n


def _pool_input(ctx):
    x = ctx.input(0)
    if x.ndim < 3:
        ctx.fail(f"input of rank {x.ndim}: pooling needs N, C and at least one spatial dim")
    kernel = [int(k) for k in ctx.attr("kernel_shape")]
    strides, dil, pads, out_sp = _pool_geometry(ctx, x, kernel)
    return x, kernel, _Window(x, kernel, strides, dil, pads, out_sp), (*x.shape[:2], *out_sp)


@op("MaxPool")
def max_pool(ctx):
    """Y = max over the window (padding never wins); Indices = the flat input index of the first
    maximum, row-major over (N, C, spatial) or column-major over spatial when storage_order=1."""
    x, kernel, win, shape = _pool_input(ctx)
    low = _lowest(x.dtype)

    def window(ix):
        rv = [K.ridx(k) for k in kernel]
        return win.values(ix, rv, low)[0], rv

    def y(ix):
        e, rv = window(ix)
        return K.reduce("max", e, tuple(rv))
    outs = [T(shape, x.dtype, y)]
    if len(ctx.node.outputs) > 1 and ctx.node.outputs[1]:
        outs.append(T(shape, "int64", lambda ix: _argmax_index(ix, window, win, int(ctx.attr("storage_order", 0)))))
    return outs


def _argmax_index(ix, window, win, storage_order):
    e, rv = window(ix)
    flat = K.reduce("argmax", e, tuple(rv))
    in_sp = win.in_sp
    nd = len(in_sp)
    coords = []
    for d in range(nd):
        inner = math.prod(win.kernel[d + 1:])
        r = K.binary("mod", K.binary("div", flat, K.const(inner, "int64")), K.const(win.kernel[d], "int64"))
        coords.append(win.coord(ix, d, r))
    spatial = K.const(0, "int64")
    if storage_order:
        for d in reversed(range(nd)):
            spatial = spatial * in_sp[d] + coords[d]
    else:
        for d in range(nd):
            spatial = spatial * in_sp[d] + coords[d]
    nc = ix[0] * win.x.shape[1] + ix[1]
    return nc * math.prod(in_sp) + spatial


@op("AveragePool")
def average_pool(ctx):
    """Mean over the window; the divisor counts the explicit padding when count_include_pad=1
    (never the extra positions ceil_mode adds)."""
    x, kernel, win, shape = _pool_input(ctx)
    include_pad = int(ctx.attr("count_include_pad", 0))
    acc = _acc_dtype(x.dtype)

    def y(ix):
        rv = [K.ridx(k) for k in kernel]
        v, _ = win.values(ix, rv, 0)
        total = K.reduce("sum", K.cast(v, acc), tuple(rv))
        return K.cast(K.binary("div", total, win.count(ix, acc, include_pad)), x.dtype)
    return [T(shape, x.dtype, y)]


def _lp(e, p, acc):
    a = K.unary("abs", K.cast(e, acc))
    return K.binary("mul", a, a) if p == 2 else K.binary("pow", a, K.const(p, acc))


def _lp_root(s, p, dtype):
    r = K.unary("sqrt", s) if p == 2 else K.binary("pow", s, K.const(1.0 / p, s.dtype))
    return K.cast(r, dtype)


@op("LpPool")
def lp_pool(ctx):
    """(sum over the window of |x|^p)^(1/p); padding contributes 0."""
    x, kernel, win, shape = _pool_input(ctx)
    p = int(ctx.attr("p", 2))
    acc = _acc_dtype(x.dtype)

    def y(ix):
        rv = [K.ridx(k) for k in kernel]
        v, _ = win.values(ix, rv, 0)
        return _lp_root(K.reduce("sum", _lp(v, p, acc), tuple(rv)), p, x.dtype)
    return [T(shape, x.dtype, y)]


def _global(ctx, op_name):
    x = ctx.input(0)
    axes = list(range(2, x.ndim))
    acc = _acc_dtype(x.dtype)
    if op_name == "max":
        return [tensor_reduce(x, axes, "max", keepdims=True)]
    if op_name == "avg":
        n = math.prod(x.shape[2:])
        s = tensor_reduce(x, axes, "sum", keepdims=True, body=lambda e: K.cast(e, acc))
        return [map_(lambda v: K.cast(K.binary("div", v, K.const(n, acc)), x.dtype), s)]
    p = int(ctx.attr("p", 2))
    s = tensor_reduce(x, axes, "sum", keepdims=True, body=lambda e: _lp(e, p, acc))
    return [map_(lambda v: _lp_root(v, p, x.dtype), s)]


@op("GlobalAveragePool")
def global_average_pool(ctx):
    return _global(ctx, "avg")


@op("GlobalMaxPool")
def global_max_pool(ctx):
    return _global(ctx, "max")


@op("GlobalLpPool")
def global_lp_pool(ctx):
    return _global(ctx, "lp")
