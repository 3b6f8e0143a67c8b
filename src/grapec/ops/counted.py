"""Data-dependent sizes by predication (issue 36, after Grape's predication of control and sizes).

An op such as NonZero or NonMaxSuppression selects a number of rows that only the data tells. Here
its output is allocated at a static upper bound (the *bound*: from the input sizes, an attribute, or
`--bound`), the rows it selects come first and padding after, and a device-side int64 scalar, the
*count*, says how many are valid. The whole model stays one graph launch with no host round trip.

A value with such an axis carries `Value.counts = {axis: count value name}`; its static shape holds
the bound there. Every lowering then sees an ordinary static tensor, and this module keeps the
padding from changing any valid result:
    - propagate: which of an op's output axes are counted, and by which count (an elementwise op's
      output is counted where its inputs are; a Transpose permutes the axes; a Gather by counted
      indices is counted along the indices' axes; a reduction over other axes keeps them). An op
      with no rule here that reads a counted value is refused by name, never run on padding;
    - guard: an op that would let padding reach a valid result (a sum, max or softmax over a counted
      axis, a NonZero of a counted tensor) reads its input masked past the count with the op's
      identity (0 for a sum, -inf for a max), one Where the fusion passes fold into its kernel.
At the model's edge the session trims each counted output to its count (runtime/session.py), so
callers see onnxruntime's shapes.
"""
from __future__ import annotations

import math

import numpy as np

from .. import dtypes
from ..errors import UnsupportedError
from ..ir import kernel as K
from ..ir.graph import Node
from ..ir.tensor import T, norm_axis
from .elementwise import ELEMENTWISE

# Reductions (and scans) that padding would change, with the identity the padding is masked to.
_REDUCE_FILL = {"ReduceSum": 0, "ReduceSumSquare": 0, "ReduceL1": 0, "ReduceL2": 0, "ReduceLogSum": 0,
                "ReduceProd": 1, "ReduceMax": "lowest", "ReduceMin": "highest", "ReduceLogSumExp": "lowest",
                "ArgMax": "lowest", "ArgMin": "highest"}
_SOFTMAX = {"Softmax", "LogSoftmax", "Hardmax"}
_SCATTERS = {"ScatterElements", "Scatter", "ScatterND"}
NOWHERE = 1 << 30   # an index past any axis here (int32 indices hold it too)


def counted_inputs(node: Node, graph) -> list:
    """[(input position, Value)] of the node's inputs that have a data-dependent axis."""
    out = []
    for i, name in enumerate(node.inputs):
        v = graph.lookup(name) if name else None
        if v is not None and getattr(v, "counts", None):
            out.append((i, v))
    return out


# --- guard: mask what padding would change ------------------------------------------------------

def guard(ctx) -> None:
    """Before the op's own lowering: replace each counted input whose padding the op would read into a
    valid result by a copy masked with the op's identity past the count (ctx.node is swapped for a copy
    that reads the masked values); refuse what cannot be masked."""
    node = ctx.node
    inputs = list(node.inputs)
    for i, v in counted_inputs(node, ctx.graph):
        axes = _guarded_axes(ctx, i, v)
        if not axes:
            continue
        fill = _fill(node.op, v.dtype, bool(ctx.attr("largest", 1)))
        masked = _masked(ctx, v, {a: v.counts[a] for a in axes}, fill)
        inputs[i] = masked
    if inputs != list(node.inputs):
        ctx.node = Node(node.op, inputs, list(node.outputs), node.name, node.attrs, node.subgraphs, node.domain,
                        list(node.origin))


def _guarded_axes(ctx, i: int, v) -> list:
    """The counted axes of input i that the op reduces over (and so must see masked)."""
    op, counted = ctx.node.op, sorted(v.counts)
    rank = len(v.shape)
    if op in _REDUCE_FILL:
        axes = _reduced_axes(ctx, rank)
        return [a for a in counted if a in axes]
    if op in _SOFTMAX or op == "TopK" and i == 0:
        axis = norm_axis(ctx.attr("axis", -1), rank)
        return [a for a in counted if a == axis]
    if op == "NonZero" or op == "RoiAlign" and i in (1, 2):   # RoiAlign: padding rois read the image at 0
        return counted
    if op in _SCATTERS and i == 1:   # padding indices point nowhere: their updates are written nowhere
        return counted
    if op in ("MatMul", "Gemm") and i in (0, 1):
        k_axis = _contracted_axis(ctx, i, rank)
        return [a for a in counted if a == k_axis]
    if op == "ReduceMean" and any(a in _reduced_axes(ctx, rank) for a in counted):
        _refuse(ctx, v, "a mean over a data-dependent axis (divide a ReduceSum by the count instead)")
    return []


def _reduced_axes(ctx, rank: int) -> set:
    if ctx.node.op in ("ArgMax", "ArgMin"):
        return {norm_axis(ctx.attr("axis", 0), rank)}
    axes = ctx.attr("axes")
    if axes is None and ctx.has(1):
        axes = [int(a) for a in np.asarray(ctx.const(1, "axes")).reshape(-1)]
    if not axes:
        return set() if ctx.attr("noop_with_empty_axes", 0) else set(range(rank))
    return {norm_axis(int(a), rank) for a in axes}


def _contracted_axis(ctx, i: int, rank: int) -> int:
    if ctx.node.op == "Gemm":
        trans = ctx.attr("transA" if i == 0 else "transB", 0)
        return (1 - trans) if i == 0 else trans
    return rank - 1 if i == 0 else max(rank - 2, 0)


def _fill(op: str, dt: str, largest: bool = True):
    if op in _SCATTERS:
        return NOWHERE
    fill = _REDUCE_FILL.get(op, "lowest" if op in _SOFTMAX or op == "TopK" and largest else
                            "highest" if op == "TopK" else 0)
    if fill in ("lowest", "highest"):
        if dtypes.is_float(dt):
            return -math.inf if fill == "lowest" else math.inf
        if dt == "bool":
            return fill == "highest"
        lo, hi = dtypes.int_range(dt)
        return lo if fill == "lowest" else hi
    return fill


def _masked(ctx, v, counts: dict, fill) -> str:
    """A new value: v where every counted axis's index is below its count, `fill` elsewhere."""
    x = ctx.tensor(v)
    limits = {a: ctx.tensor(ctx.graph.lookup(c)) for a, c in counts.items()}
    filler = K.const(fill, v.dtype)

    def fn(ix):
        keep = None
        for a, n in limits.items():
            below = K.binary("lt", ix[a], n.at(()))
            keep = below if keep is None else K.binary("and", keep, below)
        return K.where(keep, x.at(ix), filler)
    masked = ctx.realize(T(v.shape, v.dtype, fn), f"{v.name}_masked")
    ctx.graph.lookup(masked.source).counts = dict(v.counts)
    return masked.source


# --- propagate: which output axes are counted --------------------------------------------------

def propagate(ctx) -> None:
    """After the op's lowering bound its outputs: set each output Value's counts from its inputs'."""
    node, graph = ctx.node, ctx.graph
    counted = counted_inputs(node, graph)
    if not counted or (ctx.out_counts is not None and node.op in MASKS_ITS_INPUT) or node.op in ("If", "Loop") \
            or ctx.counts_handled:
        return   # (a TopK's rule below merges the count its lowering made with its input's)
    rule = _RULES.get(node.op)
    if rule is None and node.op in ELEMENTWISE:
        rule = _broadcast
    if rule is None:
        i, v = counted[0]
        _refuse(ctx, v, f"{node.op} on it")
    for j, out in enumerate(node.outputs):
        if not out:
            continue
        ov = graph.lookup(out)
        counts = rule(ctx, counted, j, ov)
        if counts:
            ov.counts = counts


def _refuse(ctx, v, what: str):
    axis = min(v.counts)
    raise UnsupportedError([f"node '{ctx.node.name}' ({ctx.node.op}): input '{v.name}' has a data-dependent size "
                            f"(dim {axis}, at most {v.shape[axis]}); {what} is not supported yet"])


def _broadcast(ctx, counted, j, out) -> dict:
    r = len(out.shape)
    counts = {}
    for _, v in counted:
        for a, c in v.counts.items():
            b = r - len(v.shape) + a
            if out.shape[b] == v.shape[a]:
                counts.setdefault(b, c)
    return counts


def _same(ctx, counted, j, out) -> dict:
    """Output j has input 0's axes (Softmax, CumSum, a TopK along another axis)."""
    counts = {}
    for i, v in counted:
        if i == 0:
            counts.update({a: c for a, c in v.counts.items() if a < len(out.shape) and out.shape[a] == v.shape[a]})
    return counts


def _transpose(ctx, counted, j, out) -> dict:
    _, v = counted[0]
    perm = ctx.attr("perm") or list(reversed(range(len(v.shape))))
    return {b: v.counts[a] for b, a in enumerate(perm) if a in v.counts}


def _regrouped(ctx, counted, j, out) -> dict:
    """Reshape, Flatten, Squeeze, Unsqueeze: a counted axis that survives whole, or that is the outermost
    of the axes merged into one (its valid rows are then the leading count x inner elements)."""
    i, v = counted[0]
    if i != 0:
        _refuse(ctx, v, "a shape computed from it")
    counts = {}
    for a, c in v.counts.items():
        b = _axis_at(out.shape, math.prod(v.shape[:a]))
        merged = [k for k in range(a + 1, len(v.shape) + 1) if b is not None and math.prod(v.shape[a:k]) == out.shape[b]]
        if not merged:
            _refuse(ctx, v, f"{ctx.node.op} to {list(out.shape)}, which splits its data-dependent dim")
        counts[b] = _scaled(ctx, c, math.prod(v.shape[a + 1:merged[0]]))
    return counts


def _axis_at(shape, before: int):
    """The axis b of shape with prod(shape[:b]) == before, skipping leading size-1 axes after it."""
    acc = 1
    for b, d in enumerate(shape):
        if acc == before and d != 1:
            return b
        acc *= d
    return None


def _derived(ctx, hint: str, counts: tuple, combine) -> str:
    """An int64 scalar computed from count values (combine: their scalar Exprs -> an Expr), made once per
    node: a rule asked again for another output (TopK's values and indices) reads the same one."""
    memo = ctx.__dict__.setdefault("_derived_counts", {})
    key = (hint, counts)
    if key not in memo:
        loads = [ctx.tensor(ctx.graph.lookup(c)) for c in counts]
        memo[key] = ctx.realize(T((), "int64", lambda ix: combine(*[n.at(()) for n in loads])), hint).source
    return memo[key]


def _scaled(ctx, count: str, factor: int) -> str:
    if factor == 1:
        return count
    return _derived(ctx, f"{count}_x{factor}", (count,), lambda n: n * K.const(factor, "int64"))


def _gather(ctx, counted, j, out) -> dict:
    counts = {}
    data, ind = ctx.graph.lookup(ctx.node.inputs[0]), ctx.graph.lookup(ctx.node.inputs[1])
    axis = norm_axis(ctx.attr("axis", 0), len(data.shape))
    for i, v in counted:
        for a, c in v.counts.items():
            if i == 0 and a != axis:
                counts[a if a < axis else a + len(ind.shape) - 1] = c
            elif i == 1:
                counts[axis + a] = c
    return counts


def _gather_elements(ctx, counted, j, out) -> dict:
    """The output has the indices' shape: their counts, and the data's on the axes not gathered along."""
    axis = norm_axis(ctx.attr("axis", 0), len(out.shape))
    counts = {a: c for i, v in counted for a, c in v.counts.items() if i == 1}
    for i, v in counted:
        if i == 0:
            counts.update({a: c for a, c in v.counts.items() if a != axis and a not in counts})
    return counts


def _gather_nd(ctx, counted, j, out) -> dict:
    counts = {}
    for i, v in counted:
        if i == 1:
            counts.update({a: c for a, c in v.counts.items() if a < len(v.shape) - 1})
        else:
            _refuse(ctx, v, "GatherND from it")
    return counts


def _reduced(ctx, counted, j, out) -> dict:
    """A reduction keeps the counted axes it does not reduce (shifted where keepdims is 0)."""
    _, v = counted[0]
    axes = _reduced_axes(ctx, len(v.shape))
    keep = ctx.attr("keepdims", 1)
    counts = {}
    for a, c in v.counts.items():
        if a in axes:
            continue
        counts[a if keep else a - sum(1 for r in axes if r < a)] = c
    return counts


def _slice(ctx, counted, j, out) -> dict:
    """A Slice that leaves a counted axis whole keeps its count; one that keeps its first E positions
    (start 0, step 1: `keep[:post_nms_top_n]`) counts min(count, E); any other cut of it is refused."""
    i, v = counted[0]
    if i != 0:
        _refuse(ctx, v, "a Slice bounded by it")
    counts = dict(out.counts or {})   # a run-time end's count, from the lowering
    for a, c in v.counts.items():
        start, step = _slice_of(ctx, a, len(v.shape))
        if start != 0 or step != 1:
            _refuse(ctx, v, f"a Slice of its data-dependent dim from {start} by {step}")
        mine = c if out.shape[a] == v.shape[a] else _at_most(ctx, c, out.shape[a])
        counts[a] = _smaller(ctx, counts[a], mine) if a in counts else mine
    return counts


def _slice_of(ctx, axis: int, rank: int) -> tuple:
    """(start, step) of the Slice along axis; (0, 1) where it leaves the axis alone."""
    axes = ctx.const(3, "axes") if ctx.has(3) else None
    axes = list(range(rank)) if axes is None else [norm_axis(int(a), rank) for a in np.asarray(axes).reshape(-1)]
    if axis not in axes:
        return 0, 1
    k = axes.index(axis)
    start = int(np.asarray(ctx.const(1, "starts")).reshape(-1)[k])
    step = int(np.asarray(ctx.const(4, "steps")).reshape(-1)[k]) if ctx.has(4) else 1
    return start, step


def _at_most(ctx, count: str, limit: int) -> str:
    return _derived(ctx, f"{count}_max{limit}", (count,), lambda n: K.binary("min", n, K.const(limit, "int64")))


def _concat(ctx, counted, j, out) -> dict:
    """Counts off the axis carry over; along it the lowering made the sum (concat_counted)."""
    counts = dict(out.counts or {})
    for _, v in counted:
        for a, c in v.counts.items():
            counts.setdefault(a, c)
    return counts


def concat_counted(ctx, axis: int) -> T:
    """Concat along a data-dependent axis: the pieces' valid rows back to back (torchvision's per-class
    detections), then padding. The output is the sum of the bounds long and counts the sum of the
    counts; an output row finds its piece by the running sum of the counts before it."""
    pieces = []
    for name in ctx.node.inputs:
        v = ctx.graph.lookup(name) if name else None
        if v is None or v.shape[axis] == 0:
            continue
        count = (v.counts or {}).get(axis)
        n = ctx.tensor(ctx.graph.lookup(count)) if count else None
        pieces.append((ctx.tensor(v), n, v.shape[axis]))
    shape = list(pieces[0][0].shape)
    shape[axis] = sum(bound for _, _, bound in pieces)
    zero = K.const(0, "int64")

    def length(n, bound):
        return n.at(()) if n is not None else K.const(bound, "int64")

    def fn(ix):
        i, start, e = ix[axis], zero, K.const(0, pieces[0][0].dtype)
        reads = []
        for t, n, bound in pieces:
            end = start + length(n, bound)
            src = list(ix)
            src[axis] = K.binary("min", K.binary("max", i - start, zero), K.const(bound - 1, "int64"))
            reads.append((K.binary("and", K.binary("ge", i, start), K.binary("lt", i, end)), t.at(tuple(src))))
            start = end
        for inside, value in reversed(reads):
            e = K.where(inside, value, e)
        return e
    total = T((), "int64", lambda ix: _sum([length(n, bound) for _, n, bound in pieces]))
    ctx.out_counts = {0: {axis: ctx.realize(total, "concat_count").source}}
    return T(tuple(shape), pieces[0][0].dtype, fn)


def _sum(xs):
    total = xs[0]
    for x in xs[1:]:
        total = total + x
    return total


def _split(ctx, counted, j, out) -> dict:
    _, v = counted[0]
    axis = norm_axis(ctx.attr("axis", 0), len(v.shape))
    if axis in v.counts:
        _refuse(ctx, v, "Split along its data-dependent dim")
    return dict(v.counts)


def _expand(ctx, counted, j, out) -> dict:
    i, v = counted[0]
    if i != 0:
        _refuse(ctx, v, "a shape computed from it")
    return _broadcast(ctx, [(0, v)], j, out)


def _data_counts(ctx, counted) -> dict:
    """A scatter's output is its data: the data's counts (the indices' padding was sent nowhere by guard)."""
    return {a: c for i, v in counted if i == 0 for a, c in v.counts.items()}


def _rois(ctx, counted) -> dict:
    """RoiAlign: an output row per roi; counted rois give counted rows (guard zeroed the padding rois)."""
    counts = {}
    for i, v in counted:
        if i == 0 or set(v.counts) != {0}:
            _refuse(ctx, v, "RoiAlign over it as its image")
        counts.setdefault(0, v.counts[0])
    return counts


def _pad(ctx, counted, j, out) -> dict:
    """Padding added at the end of a counted axis keeps its count (the valid rows stay first)."""
    i, v = counted[0]
    if i != 0:
        _refuse(ctx, v, "a Pad sized by it")
    pads = [int(p) for p in np.asarray(ctx.const(1, "pads")).reshape(-1)] if ctx.has(1) else list(ctx.attr("pads"))
    axes = [norm_axis(int(a), len(v.shape)) for a in np.asarray(ctx.const(3, "axes")).reshape(-1)] if ctx.has(3) \
        else list(range(len(v.shape)))
    begins = dict(zip(axes, pads[:len(axes)]))
    for a in v.counts:
        if begins.get(a, 0) != 0 or ctx.attr("mode", "constant") not in ("constant", b"constant"):
            _refuse(ctx, v, "a Pad before its data-dependent dim's rows (or not with a constant)")
    return dict(v.counts)


def _topk(ctx, counted, j, out) -> dict:
    """Along another axis the counts carry over. Along the counted one (guard ranked the padding last),
    the output holds min(k, count) valid rows: k a constant, or the count its lowering made of a
    run-time k (torchvision's k = min(candidates, the number that passed a threshold))."""
    counts = dict(out.counts or {})
    for i, v in counted:
        if i != 0:
            continue
        axis = norm_axis(ctx.attr("axis", -1), len(v.shape))
        for a, c in v.counts.items():
            if a != axis:
                counts.setdefault(a, c)
            elif a in counts:
                counts[a] = _smaller(ctx, counts[a], c)
            else:
                counts[a] = _at_most(ctx, c, out.shape[a])
    return counts


def _smaller(ctx, a: str, b: str) -> str:
    return _derived(ctx, f"{a}_min", (a, b), lambda x, y: K.binary("min", x, y))


def _matmul(ctx, counted, j, out) -> dict:
    """The rows of A and the columns of B stay counted in the product (a counted K is masked by guard)."""
    a_rank, b_rank = (len(ctx.graph.lookup(ctx.node.inputs[k]).shape) for k in (0, 1))
    r = len(out.shape)
    counts = {}
    for i, v in counted:
        for a, c in v.counts.items():
            if i > 1:   # Gemm's C broadcasts onto the output
                counts.setdefault(r - len(v.shape) + a, c)
            elif a == _contracted_axis(ctx, i, len(v.shape)):
                continue
            elif ctx.node.op == "Gemm":
                counts[i] = c
            elif i == 0:
                counts[a if b_rank == 1 else r - a_rank + a] = c
            else:
                counts[r - 1 if a == b_rank - 1 else (a if a_rank == 1 else r - b_rank + a)] = c
    return counts


# Ops that compute each sample (axis 0) of their first input alone: valid rows in, valid rows out
# (Mask R-CNN's mask head convolves the detected rois).
PER_SAMPLE = {"Conv", "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LpPool",
              "BatchNormalization", "InstanceNormalization", "Resize", "Upsample"}


def _per_sample(ctx, counted, j, out) -> dict:
    """Counted samples of the first input stay counted; a count on another axis, or on a weight, or a
    Resize that scales the samples' axis, is refused."""
    for i, v in counted:
        if i != 0 or set(v.counts) != {0} or (j == 0 and out.shape[0] != v.shape[0]):
            _refuse(ctx, v, f"{ctx.node.op} over its data-dependent dim")
    return {0: counted[0][1].counts[0]} if j == 0 else {}


_RULES = {
    **{op: _per_sample for op in PER_SAMPLE},
    "Transpose": _transpose, "Pad": _pad, "Expand": _expand,
    "Reshape": _regrouped, "Flatten": _regrouped, "Squeeze": _regrouped, "Unsqueeze": _regrouped,
    "Slice": _slice, "Concat": _concat, "Split": _split,
    "Gather": _gather, "GatherElements": _gather_elements, "GatherND": _gather_nd,
    **{op: lambda ctx, counted, j, out: _data_counts(ctx, counted) for op in _SCATTERS},
    "RoiAlign": lambda ctx, counted, j, out: _rois(ctx, counted),
    "MatMul": _matmul, "Gemm": _matmul, "TopK": _topk,
    **{op: _reduced for op in _REDUCE_FILL}, "ReduceMean": _reduced,
    **{op: _same for op in (*_SOFTMAX, "CumSum", "CumProd")},
    # their values hold the counts themselves (ops/shape.py), and their shapes are static
    "Shape": lambda ctx, counted, j, out: {}, "Size": lambda ctx, counted, j, out: {},
}
# Ops that make counts of their own and read a counted input themselves (NonZero through guard's mask,
# NonMaxSuppression by never taking a box past the count).
MASKS_ITS_INPUT = {"NonZero", "NonMaxSuppression"}


__all__ = ["counted_inputs", "guard", "propagate"]
