"""What the index-remapping ops share (movement.py, gather.py, resize.py, sample.py): integer
constants, compile-time integer lists from inputs or attributes, index range tests and clamps,
masked reads, and compile-time tables as lazy loads.
"""
from __future__ import annotations

import math

import numpy as np

from .. import dtypes
from ..ir import kernel as K
from ..ir.tensor import T, affine, norm_axis

I64 = "int64"


def int_const(v) -> K.Expr:
    return K.const(v, I64)


def all_of(a: K.Expr, b: K.Expr) -> K.Expr:
    return K.binary("and", a, b)


def ints(a) -> list:
    return [int(v) for v in np.asarray(a).reshape(-1)]


def ints_of(ctx, i: int, attr: str, what: str | None = None) -> list | None:
    """Integer list from constant input i if present, else from attribute `attr` (older opsets)."""
    if ctx.has(i):
        return ints(ctx.const(i, what or attr))
    v = ctx.attr(attr)
    return None if v is None else ints(v)


def axes_of(ctx, i: int, rank: int, attr: str = "axes") -> list | None:
    axes = ints_of(ctx, i, attr, "axes")
    return None if axes is None else [norm_axis(a, rank) for a in axes]


def in_range(i: K.Expr, n: int) -> K.Expr:
    return all_of(K.binary("ge", i, int_const(0)), K.binary("lt", i, int_const(n)))


def clamp(i: K.Expr, n: int) -> K.Expr:
    return K.binary("min", K.binary("max", i, int_const(0)), int_const(max(n - 1, 0)))


def wrap_negative(i: K.Expr, n: int) -> K.Expr:
    """A runtime index in [-n, n) made non-negative (ONNX's negative indices count from the end)."""
    i = K.cast(i, I64)
    return K.where(K.binary("lt", i, int_const(0)), i + n, i)


def masked_read(t: T, ix, valid: K.Expr, other: K.Expr) -> K.Expr:
    """t[ix] where `valid`, else `other`. Where not valid, ix may be out of range: a plain load gets
    the mask (no read happens), anything else is evaluated at a clamped index and selected away."""
    e = t.at(ix)
    if e.op == "load" and e.args[2] is None:
        slot, index, _, _ = e.args
        return K.load(slot, index, e.dtype, mask=valid, other=other)
    inside = t.at([clamp(i, d) for i, d in zip(ix, t.shape)])
    return K.where(valid, inside, other)


def const_tensor(ctx, arr: np.ndarray, hint: str) -> T:
    """A lazy load of a compile-time table (becomes a weight of the plan)."""
    v = ctx.graph.add_value(hint, dtypes.from_numpy(arr.dtype), arr.shape, const=np.array(arr, order="C"))
    return ctx.tensor(v)


def take_const(ctx, t: T, axis: int, sel: np.ndarray) -> T:
    """out[.., k, ..] = t[.., sel[k], ..] for a compile-time index list (affine runs need no table)."""
    sel = np.asarray(sel, np.int64).reshape(-1)
    n = len(sel)
    step = int(sel[1] - sel[0]) if n > 1 else 1
    if n == 0 or np.array_equal(sel, sel[0] + step * np.arange(n)):
        return affine(t, axis, int(sel[0]) if n else 0, step, n)
    table = const_tensor(ctx, sel, "take")
    shape = list(t.shape)
    shape[axis] = n

    def fn(ix):
        ix = list(ix)
        ix[axis] = table.at((ix[axis],))
        return t.at(ix)
    return T(shape, t.dtype, fn)


def scalar_of(t: T) -> K.Expr:
    return t.at((int_const(0),) * t.ndim)


def lowest(dtype: str):
    if dtypes.is_float(dtype):
        return -math.inf
    if dtype == "bool":
        return False
    return int(np.iinfo(dtypes.np_dtype(dtype)).min)


def highest(dtype: str):
    if dtypes.is_float(dtype):
        return math.inf
    if dtype == "bool":
        return True
    return int(np.iinfo(dtypes.np_dtype(dtype)).max)
