"""Shape-producing ops: Shape, Size, Constant, ConstantOfShape, Range, EyeLike, OneHot, and the
data-dependent Unique when its input is a compile-time constant (NonZero: ops/selection.py).

Outputs that depend only on shapes and constant inputs are computed here with numpy (constant
folding: every value used comes from ctx.const or a shape); everything that reads runtime data is
a lazy tensor.
"""
from __future__ import annotations

import math

import numpy as np

from .. import dtypes
from ..errors import ShapeError
from ..ir import kernel as K
from ..ir.tensor import T, full, norm_axis
from . import op
from .selection import unique_runtime

I64 = "int64"


@op("Shape")
def shape_(ctx):
    """The input's dims [start:end] (Python slice semantics, opset 15+), as int64: a constant, or where
    a dim is data-dependent (ops/counted.py), a run-time tensor holding its count."""
    axes = list(range(len(ctx.shape(0))))[slice(ctx.attr("start", 0), ctx.attr("end"))]
    dims = [ctx.shape(0)[a] for a in axes]
    counts = ctx.value(0).counts or {}
    if not any(a in counts for a in axes):
        return [np.array(dims, np.int64)]
    elems = [_count(ctx, counts[a]) if a in counts else K.const(d, I64) for a, d in zip(axes, dims)]
    ctx.out_bounds[0] = (np.array([0 if a in counts else d for a, d in zip(axes, dims)], np.int64),
                         np.array(dims, np.int64))

    def fn(ix):
        e = elems[-1]
        for i in range(len(elems) - 2, -1, -1):
            e = K.where(K.binary("eq", ix[0], K.const(i, I64)), elems[i], e)
        return e
    return [T((len(dims),), I64, fn)]


@op("Size")
def size(ctx):
    """The element count: a constant, or the product of the counts and the static dims."""
    counts = ctx.value(0).counts or {}
    if not counts:
        return [np.array(math.prod(ctx.shape(0)), np.int64)]
    static = math.prod(d for a, d in enumerate(ctx.shape(0)) if a not in counts)
    total = K.const(static, I64)
    for c in counts.values():
        total = total * _count(ctx, c)
    ctx.out_bounds[0] = (np.array(0, np.int64), np.array(math.prod(ctx.shape(0)), np.int64))
    return [T((), I64, lambda ix: total)]


def _count(ctx, name: str) -> K.Expr:
    return ctx.tensor(ctx.graph.lookup(name)).at(())


@op("Constant")
def constant(ctx):
    """The one value_* attribute (value, value_float(s), value_int(s)) as an array."""
    attrs = ctx.node.attrs
    if "value" in attrs:
        return [np.asarray(attrs["value"])]
    if "value_float" in attrs:
        return [np.array(attrs["value_float"], np.float32)]
    if "value_floats" in attrs:
        return [np.array(attrs["value_floats"], np.float32)]
    if "value_int" in attrs:
        return [np.array(attrs["value_int"], np.int64)]
    if "value_ints" in attrs:
        return [np.array(attrs["value_ints"], np.int64)]
    ctx.fail(f"attribute(s) {sorted(attrs)} are not supported (strings, sparse tensors)")


@op("ConstantOfShape")
def constant_of_shape(ctx):
    """A tensor of the constant shape filled with `value` (a one-element tensor, default float 0)."""
    high, runtime = ctx.shape_param(0, "shape")
    shape = [int(d) for d in np.asarray(high).reshape(-1)]
    value = ctx.attr("value")
    if value is None:
        value = np.zeros(1, np.float32)
    value = np.asarray(value)
    for axis, count in runtime.items():   # a dim computed from a data-dependent size: at its bound, counted
        ctx.count_output(0, axis, count, shape[axis], ctx.size_source(0, "shape"))
    return [full(shape, value.reshape(-1)[0].item(), dtypes.from_numpy(value.dtype))]


@op("Range")
def range_(ctx):
    """start, start+delta, ... up to (excluding) limit. The length depends on the values, so all
    three must be constants, or the limit a value computed from a data-dependent size (its bounds,
    passes/bounds.py): then the output is as long as the upper bound allows, counted by the length
    the run's limit gives (torchvision's arange(n) over its detections)."""
    if ctx.value(1).const is None and ctx.value(1).bounds is not None and ctx.value(0).const is not None \
            and ctx.value(2).const is not None:
        return [_range_to_a_count(ctx)]
    start, limit, delta = (ctx.const(i, what, "the output length is data-dependent otherwise", boundable=i == 1).reshape(-1)[0]
                          for i, what in enumerate(("start", "limit", "delta")))
    if delta == 0:
        raise ShapeError(f"Range node '{ctx.node.name}': delta is 0")
    n = max(0, math.ceil((limit.item() - start.item()) / delta.item()))
    # a kernel, not a constant: a huge length must not fill host memory, and in a range of sizes
    # (--dynamic) a length that follows the size must not be a constant stored per size
    if n > RANGE_CONST_MAX_ELEMENTS or n * start.itemsize > ctx.options.get("sized_fold_limit", math.inf):
        dt = dtypes.from_numpy(start.dtype)
        return [T((n,), dt, lambda ix: K.const(start.item(), dt) + K.cast(ix[0], dt) * K.const(delta.item(), dt))]
    return [np.arange(start.item(), limit.item(), delta.item()).astype(start.dtype)]


def _range_to_a_count(ctx) -> T:
    start, delta = (np.asarray(ctx.const(i)).reshape(-1)[0].item() for i in (0, 2))
    if delta <= 0:
        ctx.fail("a limit computed from a data-dependent size needs a positive delta")
    high = np.asarray(ctx.value(1).bounds[1]).reshape(-1)[0].item()
    n = max(0, math.ceil((high - start) / delta))
    dt = ctx.dtype(0)
    limit = ctx.input(1)
    span = lambda: K.cast(limit.at(tuple(K.const(0, I64) for _ in limit.shape)), "float64") - K.const(float(start), "float64")  # noqa: E731
    length = T((), I64, lambda ix: K.binary("max", K.const(0, I64), K.cast(K.unary("ceil", K.binary(
        "div", span(), K.const(float(delta), "float64"))), I64)))
    ctx.count_output(0, 0, length, n, ctx.size_source(1, "limit"))
    return T((n,), dt, lambda ix: K.const(start, dt) + K.cast(ix[0], dt) * K.const(delta, dt))


RANGE_CONST_MAX_ELEMENTS = 1 << 20   # 8 MiB of int64: position ids of every practical length stay constants (their range is checked)


@op("grapec:Bound")
def bound(ctx):
    """--bound NAME=N (passes/bounds.py apply_user_bounds): NAME's elements clipped to [0, N]. Its bounds,
    0 to N, let the sizes it sets be allocated at N and counted at run time (LowerCtx.shape_param); the
    clip keeps a run whose NAME went past N inside those buffers, and the session refuses its outputs."""
    dt, n = ctx.dtype(0), ctx.attr("bound")
    if dt not in ("int64", "int32"):
        ctx.fail(f"--bound {ctx.node.inputs[0]}={n}: a bound is for an integer tensor that sets sizes; "
                 f"'{ctx.node.inputs[0]}' is {dt}")
    shape = ctx.shape(0)
    ctx.out_bounds[0] = (np.zeros(shape, dtypes.np_dtype(dt)), np.full(shape, n, dtypes.np_dtype(dt)))
    x = ctx.input(0)
    return [T(x.shape, dt, lambda ix: K.binary("min", K.binary("max", x.at(ix), K.const(0, dt)), K.const(n, dt)))]


@op("EyeLike")
def eye_like(ctx):
    """Ones on the k-th diagonal of a 2-D tensor shaped like the input, zeros elsewhere."""
    shape = ctx.shape(0)
    to = ctx.attr("dtype")
    dt = dtypes.from_onnx(to) if to is not None else ctx.dtype(0)
    k = ctx.attr("k", 0)

    def fn(ix):
        on = K.binary("eq", ix[1] - ix[0], K.const(k, I64))
        return K.where(on, K.const(1, dt), K.const(0, dt))
    return [T(shape, dt, fn)]


@op("OneHot")
def one_hot(ctx):
    """out[.., d, ..] (d inserted at `axis`) = on if indices[..] (negatives + depth) == d else off."""
    ind, values = ctx.input(0), ctx.input(2)
    depth = int(np.asarray(ctx.const(1, "depth")).reshape(-1)[0])
    axis = norm_axis(ctx.attr("axis", -1), ind.ndim + 1)
    shape = ind.shape[:axis] + (depth,) + ind.shape[axis:]
    zero = K.const(0, I64)
    off, on = values.at((zero,)), values.at((K.const(1, I64),))

    def fn(ix):
        i = ind.at(ix[:axis] + ix[axis + 1:])
        i = K.where(K.binary("lt", i, K.const(0, i.dtype)), K.binary("add", i, K.const(depth, i.dtype)), i)
        return K.where(K.binary("eq", i, K.cast(ix[axis], i.dtype)), on, off)
    return [T(shape, values.dtype, fn)]


@op("Unique")
def unique(ctx):
    """Unique values (sorted, or in order of first occurrence), first indices, inverse indices and
    counts: folded for a constant input; on run-time data, ops/selection.py unique_runtime."""
    if ctx.value(0).const is None:
        return unique_runtime(ctx)
    x = ctx.const(0)
    axis = ctx.attr("axis")
    if axis is None:
        y, first, inverse, counts = np.unique(x.reshape(-1), True, True, True)
        taken = x.reshape(-1)
    else:
        axis = norm_axis(axis, x.ndim)
        y, first, inverse, counts = np.unique(x, True, True, True, axis=axis)
        taken = x
    inverse = inverse.reshape(-1)
    if not ctx.attr("sorted", 1):
        order = np.argsort(first)
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        first, counts, inverse = first[order], counts[order], rank[inverse]
        y = np.take(taken, first, axis=0 if axis is None else axis)
    as64 = lambda a: np.asarray(a, np.int64)  # noqa: E731
    return [y, as64(first), as64(inverse), as64(counts)]
