"""Lazy tensors for writing op lowerings.

A `T` is a shape, a dtype and a function from an output index (a tuple of index `Expr`s) to the
scalar `Expr` of that element. Ops compose these functions (broadcast, transpose, slice, gather are
index remaps; elementwise ops wrap the scalar), and only `LowerCtx.realize` turns one into a kernel.
So an op's semantics read like its definition, and a chain of index remaps costs no memory traffic.

`source` is set while a T is still exactly the row-major contents of one graph value (a load of it,
possibly reshaped): such a T is aliased, never copied (Reshape, Flatten, Squeeze, Identity...).
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from .. import dtypes
from ..errors import ShapeError
from . import kernel as K


class T:
    __slots__ = ("shape", "dtype", "fn", "source")

    def __init__(self, shape, dtype: str, fn: Callable, source: str | None = None):
        self.shape = tuple(int(d) for d in shape)
        self.dtype = dtype
        self.fn = fn
        self.source = source

    def at(self, index) -> K.Expr:
        return self.fn(tuple(index))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def __repr__(self):
        return f"T{list(self.shape)}:{self.dtype}" + (f"<{self.source}>" if self.source else "")


def scalar(value, dtype: str) -> T:
    c = K.const(value, dtype)
    return T((), dtype, lambda ix: c)


def full(shape, value, dtype: str) -> T:
    c = K.const(value, dtype)
    return T(shape, dtype, lambda ix: c)


def from_array(arr: np.ndarray, slot_fn: Callable) -> T:
    """A constant: scalars inline into the expression, bigger arrays are loaded from a buffer."""
    dt = dtypes.from_numpy(arr.dtype)
    if arr.size == 1:
        c = K.const(arr.reshape(-1)[0].item(), dt)
        return T(arr.shape, dt, lambda ix: c)
    return slot_fn()


def index_vars(shape) -> tuple:
    """The output index of a kernel: size-1 dims are the constant 0, which simplifies index math."""
    return tuple(K.idx(a) if d != 1 else K.const(0, "int64") for a, d in enumerate(shape))


# --- shape helpers -------------------------------------------------------------------------------

def unravel(flat: K.Expr, dims) -> tuple:
    """Row-major coordinates of a flat index over dims (index Exprs)."""
    out = []
    for n, d in enumerate(reversed(list(dims))):
        out.append(flat % d if n < len(dims) - 1 else flat)
        flat = flat // d
    return tuple(reversed(out))


def broadcast_shapes(*shapes, what: str = "operands") -> tuple:
    try:
        return tuple(np.broadcast_shapes(*[tuple(s) for s in shapes]))
    except ValueError:
        raise ShapeError(f"{what}: shapes {' and '.join(str(list(s)) for s in shapes)} do not broadcast") from None


def broadcast_index(shape, ix) -> tuple:
    """Index an operand of `shape` at the trailing output coordinates ix (numpy broadcasting)."""
    ix = tuple(ix)[len(ix) - len(shape):]
    return tuple(K.const(0, "int64") if d == 1 else i for d, i in zip(shape, ix))


def norm_axis(axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < max(rank, 1):
        raise ShapeError(f"{what} {axis} out of range for rank {rank}")
    return axis % rank if rank else 0


# --- index remaps --------------------------------------------------------------------------------

def expand(t: T, shape) -> T:
    """Numpy broadcasting of t to `shape` (right-aligned, size-1 dims repeat)."""
    shape = tuple(shape)
    if t.shape == shape:
        return t
    off = len(shape) - t.ndim
    zero = K.const(0, "int64")
    src = t.shape

    def fn(ix):
        return t.at(tuple(zero if src[a] == 1 else ix[a + off] for a in range(len(src))))
    return T(shape, t.dtype, fn)


def reshape(t: T, shape) -> T:
    shape = tuple(int(d) for d in shape)
    if math.prod(shape) != t.size:
        raise ShapeError(f"cannot reshape {list(t.shape)} ({t.size} elements) to {list(shape)}")
    if shape == t.shape:
        return t
    groups = _reshape_groups(t.shape, shape)
    src = t.shape

    def fn(ix):
        res = [None] * len(src)
        for (i0, i1), (o0, o1) in groups:
            lin = K.const(0, "int64")
            for a in range(o0, o1):
                lin = lin * shape[a] + ix[a]
            for a in reversed(range(i0, i1)):
                if a == i0:
                    res[a] = lin
                else:
                    res[a] = lin % src[a]
                    lin = lin // src[a]
        return t.at(res)
    return T(shape, t.dtype, fn, source=t.source)


def _reshape_groups(src, dst):
    """Split both shapes into consecutive runs with equal products, so that index math stays local."""
    groups, i, o = [], 0, 0
    while i < len(src) or o < len(dst):
        i0, o0 = i, o
        ps = src[i] if i < len(src) else 1
        pd = dst[o] if o < len(dst) else 1
        i, o = min(i + 1, len(src)), min(o + 1, len(dst))
        while ps != pd:
            if ps < pd and i < len(src):
                ps *= src[i]
                i += 1
            elif o < len(dst):
                pd *= dst[o]
                o += 1
            else:
                break
        # absorb trailing size-1 dims on both sides into this group
        while i < len(src) and src[i] == 1 and (o >= len(dst) or dst[o] != 1):
            i += 1
        while o < len(dst) and dst[o] == 1 and (i >= len(src) or src[i] != 1):
            o += 1
        groups.append(((i0, i), (o0, o)))
        if i0 == i and o0 == o:
            break
    return groups


def transpose(t: T, perm) -> T:
    perm = tuple(perm)
    if perm == tuple(range(t.ndim)):
        return t
    inv = np.argsort(perm)

    def fn(ix):
        return t.at(tuple(ix[inv[a]] for a in range(t.ndim)))
    return T(tuple(t.shape[p] for p in perm), t.dtype, fn)


def affine(t: T, axis: int, start: int, step: int, length: int) -> T:
    """out[.., i, ..] = t[.., start + step*i, ..] along `axis`."""
    shape = list(t.shape)
    shape[axis] = length

    def fn(ix):
        ix = list(ix)
        ix[axis] = ix[axis] * step + start
        return t.at(ix)
    return T(shape, t.dtype, fn)


def map_(f: Callable, *ts: T, dtype: str | None = None) -> T:
    """Elementwise op with numpy broadcasting; f takes and returns scalar Exprs."""
    shape = broadcast_shapes(*[t.shape for t in ts])
    ex = [expand(t, shape) for t in ts]
    out_dt = dtype
    if out_dt is None:
        probe = f(*[K.const(1, t.dtype) for t in ts])
        out_dt = probe.dtype
    return T(shape, out_dt, lambda ix: f(*[t.at(ix) for t in ex]))


def cast(t: T, dtype: str) -> T:
    if t.dtype == dtype:
        return t
    return T(t.shape, dtype, lambda ix: K.cast(t.at(ix), dtype))


def reduce(t: T, axes, op: str, keepdims: bool, body: Callable | None = None) -> T:
    """Reduce t over `axes` with op (sum/prod/max/min/arg*). `body`, if given, maps each element
    before reducing (e.g. x*x for a sum of squares)."""
    axes = sorted({norm_axis(a, t.ndim) for a in axes})
    keep = [a for a in range(t.ndim) if a not in axes]
    shape = tuple(1 if a in axes else t.shape[a] for a in range(t.ndim)) if keepdims else \
        tuple(t.shape[a] for a in keep)

    def fn(ix):
        rv = {a: K.ridx(t.shape[a]) for a in axes}
        full_ix = []
        k = 0
        for a in range(t.ndim):
            if a in rv:
                full_ix.append(rv[a])
                if keepdims:
                    k += 1
            else:
                full_ix.append(ix[k])
                k += 1
        e = t.at(full_ix)
        if body is not None:
            e = body(e)
        return K.reduce(op, e, tuple(rv[a] for a in axes))
    probe_dt = "int64" if op.startswith("arg") else (body(K.const(1, t.dtype)).dtype if body else t.dtype)
    return T(shape, probe_dt, fn)


def guard_loads(e: K.Expr, cond: K.Expr) -> K.Expr:
    """e with every load masked by cond: where cond is false nothing is read (so a select between
    parts, as in concat, never reads out of bounds)."""
    def f(load):
        slot, index, mask, other = load.args
        return K.load(slot, index, load.dtype, cond if mask is None else K.binary("and", mask, cond), other)
    return substitute_loads(e, f)


def concat(ts: list, axis: int) -> T:
    """Concatenate along axis: a chain of selects on the axis coordinate, each part's loads masked
    to its own range."""
    ts = [t for t in ts if t.shape[axis] != 0] or ts[:1]
    if len(ts) == 1:
        return ts[0]
    shape = list(ts[0].shape)
    shape[axis] = sum(t.shape[axis] for t in ts)
    starts = np.cumsum([0] + [t.shape[axis] for t in ts]).tolist()

    def fn(ix):
        i = ix[axis]
        e = None
        for t, s in reversed(list(zip(ts, starts))):
            sub = list(ix)
            sub[axis] = i - s
            inside = K.binary("and", K.binary("ge", i, K.const(s, "int64")), K.binary("lt", i, K.const(s + t.shape[axis], "int64")))
            v = guard_loads(t.at(sub), inside)
            e = v if e is None else K.where(K.binary("lt", i, K.const(s + t.shape[axis], "int64")), v, e)
        return e
    return T(shape, ts[0].dtype, fn)


def substitute_loads(e: K.Expr, f: Callable) -> K.Expr:
    """Rebuild e with every load node replaced by f(load) (children first, shared nodes once)."""
    memo: dict = {}
    for node in K.walk(e):
        memo[node] = _rebuild(node, memo, f)
    return memo[e]


def _rebuild(node, memo, f):
    op = node.op
    if op in ("const", "idx", "ridx"):
        return node
    if op == "load":
        slot, index, mask, other = node.args
        new = K.Expr("load", (slot, tuple(memo[i] for i in index),
                              memo[mask] if mask is not None else None,
                              memo[other] if other is not None else None), node.dtype)
        return f(new)
    if op == "reduce":
        return K.reduce(node.args[0], memo[node.args[1]], tuple(memo[r] for r in node.args[2]))
    return K.Expr(op, tuple(memo[a] for a in node.args), node.dtype)
