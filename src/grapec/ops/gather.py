"""Data-dependent reads and writes: Gather*, Compress, Scatter*. Runtime indices are normalized
with `where` (ONNX's negative indices count from the end) and every read that may fall outside
its tensor is masked (indexing.masked_read); Scatter* reduce over the updates that target each
element.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import IndexRangeError
from ..ir import kernel as K
from ..ir.tensor import T, norm_axis, reshape
from . import op
from .selection import compress_runtime
from .indexing import all_of, highest, in_range, int_const, lowest, masked_read, take_const, wrap_negative


@op("Compress")
def compress(ctx):
    """Keep the slices along `axis` (or of the flattened input) where the condition holds: a constant
    condition picks them at compile time, a run-time one sizes the axis by its count (ops/selection.py)."""
    x = ctx.input(0)
    axis = ctx.attr("axis")
    if axis is None:
        x, axis = reshape(x, (x.size,)), 0
    axis = norm_axis(axis, x.ndim)
    if ctx.value(1).const is None:
        return [compress_runtime(ctx, x, axis)]
    cond = np.asarray(ctx.const(1, "condition")).reshape(-1).astype(bool)
    sel = np.nonzero(cond[:x.shape[axis]])[0]
    return [take_const(ctx, x, axis, sel)]


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
        i = wrap_negative(ind.at(ix[axis:axis + q]), dim)
        return masked_read(x, ix[:axis] + (i,) + ix[axis + q:], in_range(i, dim), K.const(0, x.dtype))
    return [T(shape, x.dtype, fn)]


@op("GatherElements")
def gather_elements(ctx):
    """out[i] = x[i with i[axis] replaced by ind[i]]; out has the indices' shape."""
    x, ind = ctx.input(0), ctx.input(1)
    axis = norm_axis(ctx.attr("axis", 0), x.ndim)
    dim = x.shape[axis]
    _check_const_indices(ctx, None, [dim])

    def fn(ix):
        i = wrap_negative(ind.at(ix), dim)
        src = list(ix)
        src[axis] = i
        return masked_read(x, src, in_range(i, dim), K.const(0, x.dtype))
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
            i = wrap_negative(ind.at(ix[:lead] + (int_const(c),)), x.shape[b + c])
            coords.append(i)
            valid = all_of(valid, in_range(i, x.shape[b + c]))
        return masked_read(x, ix[:b] + tuple(coords) + ix[lead:], valid, K.const(0, x.dtype))
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
        return K.binary("max", old, K.reduce("max", K.where(hit, upd, K.const(lowest(dt), dt)), r))
    if reduction == "min":
        return K.binary("min", old, K.reduce("min", K.where(hit, upd, K.const(highest(dt), dt)), r))
    raise ValueError(f"unknown reduction {reduction!r}")


def _last_hit(hit: K.Expr, pos: K.Expr, r: tuple) -> K.Expr:
    """The largest position (in update order) whose hit is true, or -1."""
    return K.reduce("max", K.where(hit, pos, int_const(-1)), r)


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
                inside = all_of(inside, K.binary("lt", ix[d], int_const(ind.shape[d])))
                j[d] = K.binary("min", ix[d], int_const(ind.shape[d] - 1))
        hit = all_of(inside, K.binary("eq", wrap_negative(ind.at(j), dim), ix[axis]))
        old = x.at(ix)
        if reduction != "none":
            return _combine(reduction, old, hit, upd.at(j), (r,))
        last = _last_hit(hit, r, (r,))
        j[axis] = K.binary("max", last, int_const(0))
        return K.where(K.binary("ge", last, int_const(0)), upd.at(j), old)
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
    """ind[j, :k] addresses x[ind[j], ...]; upd[j, ...] is written (or combined) there. A combining
    reduction reduces each output element over all update rows j. Without one, the update row that
    lands on each addressed slice (the last of equal indices) is found once per slice, then each
    element reads it: torchvision's `result[level_rows] = roi_align(...)` writes slices of 12K elements."""
    x, ind, upd = ctx.input(0), ctx.input(1), ctx.input(2)
    reduction = ctx.attr("reduction", "none")
    k = ind.shape[-1]
    rows = math.prod(ind.shape[:-1])
    ind2 = reshape(ind, (rows, k))
    upd2 = reshape(upd, (rows,) + x.shape[k:])

    def hit_at(ix, r):
        hit = K.const(True, "bool")
        for c in range(k):
            hit = all_of(hit, K.binary("eq", wrap_negative(ind2.at((r, int_const(c))), x.shape[c]), ix[c]))
        return hit

    if reduction != "none":
        def combined(ix):
            r = K.ridx(rows)
            return _combine(reduction, x.at(ix), hit_at(ix, r), upd2.at((r,) + tuple(ix[k:])), (r,))
        return [T(x.shape, x.dtype, combined)]
    if math.prod(x.shape[k:]) > 1:
        def row_of(ix):
            r = K.ridx(rows)
            return _last_hit(hit_at(ix, r), r, (r,))
        landing = ctx.realize(T(x.shape[:k], "int64", row_of), "scatter_rows")
        last_of = lambda ix: landing.at(tuple(ix[:k]))  # noqa: E731
    else:
        def last_of(ix):
            r = K.ridx(rows)
            return _last_hit(hit_at(ix, r), r, (r,))

    def fn(ix):
        last = last_of(ix)
        new = upd2.at((K.binary("max", last, int_const(0)),) + tuple(ix[k:]))
        return K.where(K.binary("ge", last, int_const(0)), new, x.at(ix))
    return [T(x.shape, x.dtype, fn)]


# --- padding and cropping --------------------------------------------------------------------------
