"""Ops whose output length the data decides: NonZero, NonMaxSuppression, and Compress on a run-time
condition. Each output is allocated at a bound that the input sizes give, the selected rows first,
and comes with a count (ops/counted.py says how that travels; ir/selection.py holds the kernels).
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import ShapeError
from ..ir import kernel as K
from ..ir.graph import Node
from .. import dtypes
from ..ir.selection import (NMS_MASK_BYTES, NMS_MASK_MAX_WORDS, NMS_MAX_BOXES, ROWS_READ, TOPK_SELECT_MAX_K, NmsKernel, NmsMaskKernel,
                            NonZeroKernel, TopKKernel, nms_bound)
from ..ir.tensor import T, cast, map_, norm_axis, reduce, reshape, transpose
from . import op

I64 = "int64"


# Flags past this many are compacted by a block per segment of NONZERO_SEGMENT, each from the column the
# flags before it give (compact): one block over RetinaNet's 8.19M scores took 5 ms on an H100.
NONZERO_SPLIT_MIN = 1 << 18
NONZERO_SEGMENT = 1 << 14
NONZERO_MAX_SEGMENTS = 4096   # the offsets are an exclusive sum over the segments' counts: squared work


def compact(ctx, flags: T, hint: str) -> tuple:
    """(coordinates, count) of the true elements of a bool T: a load of [rank, numel] int64, row-major
    order and -1 after the last, and the count as an int64 scalar T."""
    numel = math.prod(flags.shape)
    shape = (max(flags.ndim, 1), numel)
    buffer = ctx.buffer(flags, f"{hint}_flags")
    if numel < NONZERO_SPLIT_MIN:
        kernel, ins = NonZeroKernel(shape, ((tuple(flags.shape), "bool"),)), [buffer]
        count = reduce(cast(flags, I64), range(flags.ndim), "sum", keepdims=False)
    else:
        segment = NONZERO_SEGMENT * -(-numel // (NONZERO_SEGMENT * NONZERO_MAX_SEGMENTS))
        offsets = _segment_offsets(ctx, reshape(ctx.tensor(ctx.graph.lookup(buffer)), (numel,)), segment)
        kernel = NonZeroKernel(shape, ((tuple(flags.shape), "bool"), (offsets.shape, I64)), segment=segment)
        ins = [buffer, offsets.source]
        count = T((), I64, lambda ix: offsets.at((K.const(offsets.shape[0] - 1, I64),)))
    out = ctx.new_value(hint, kernel.shape, I64)
    ctx.emit(Node("Kernel", ins, [out.name], name=ctx.node.name, attrs={"kernel": kernel}))
    return ctx.tensor(out), count


def _segment_offsets(ctx, flat: T, segment: int) -> T:
    """[segments + 1]: how many flags are set before each segment of `flat`, then in all."""
    numel = flat.shape[0]
    segments = -(-numel // segment)

    def counted(ix):
        r = K.ridx(segment)
        j = ix[0] * K.const(segment, I64) + r
        inside = K.binary("lt", j, K.const(numel, I64))
        at = K.where(inside, j, K.const(0, I64))
        return K.reduce("sum", K.where(inside, K.cast(flat.at((at,)), I64), K.const(0, I64)), (r,))
    counts = ctx.realize(T((segments,), I64, counted), "nonzero_segment_counts")

    def before(ix):
        r = K.ridx(segments)
        return K.reduce("sum", K.where(K.binary("lt", r, ix[0]), counts.at((r,)), K.const(0, I64)), (r,))
    return ctx.realize(T((segments + 1,), I64, before), "nonzero_offsets")


# A row this long, with few kept, is ranked in two stages (_two_stage_ranked): a TopK kernel ranks a row
# in one block, and RetinaNet's first level is 8.19M scores.
TOPK_SPLIT_MIN_DIM = 1 << 15


def ranked(ctx, x: T, axis: int, k_arg: str, bound: int, largest: bool) -> T:
    """A load of the indices of the best `bound` (at most k, a one-element int64 value read at run time)
    along `axis`: best first, equal keys by lower index, NaN last, -1 past k (ir/selection.py TopKKernel)."""
    key_dtype = x.dtype if x.dtype in ("float64", "uint64") else "float32" if dtypes.is_float(x.dtype) else "int64"
    keys = cast(x, key_dtype)
    dim = x.shape[axis]
    if dim >= TOPK_SPLIT_MIN_DIM and dim >= 8 * bound and bound <= TOPK_SELECT_MAX_K:
        return _two_stage_ranked(ctx, keys, axis, k_arg, bound, largest)
    return _topk_kernel(ctx, keys, axis, k_arg, bound, largest)


def _topk_kernel(ctx, keys: T, axis: int, k_arg: str, bound: int, largest: bool) -> T:
    shape = list(keys.shape)
    shape[axis] = bound
    kernel = TopKKernel(tuple(shape), ((tuple(keys.shape), keys.dtype), ((1,), I64)), axis, largest)
    picked = ctx.new_value("topk_indices", kernel.shape, I64)
    ctx.emit(Node("Kernel", [ctx.buffer(keys, "topk_keys"), k_arg], [picked.name],
                  name=ctx.node.name, attrs={"kernel": kernel}))
    return ctx.tensor(picked)


def _two_stage_ranked(ctx, keys: T, axis: int, k_arg: str, bound: int, largest: bool) -> T:
    """ranked() of a long row in two TopK kernels that each run a block per row: the row cut into
    segments of about sqrt(row x bound) (the last padded with keys that rank after every real one),
    the best `bound` of each segment, then the best of those candidates. Candidates lie in segment
    order and, within one, by rank, so equal keys still rank by their index in the row."""
    dim, rest, dt = keys.shape[axis], keys.shape[axis + 1:], keys.dtype
    seg = max(bound, math.isqrt(dim * bound))
    segs = -(-dim // seg)
    worst = (float("nan") if dt in ("float32", "float64") else
             (0 if dt == "uint64" else np.iinfo(np.int64).min) if largest else
             (np.iinfo(np.uint64).max if dt == "uint64" else np.iinfo(np.int64).max))
    i64 = lambda v: K.const(int(v), I64)  # noqa: E731

    def padded(ix):
        j = ix[axis] * i64(seg) + ix[axis + 1]
        inside = K.binary("lt", j, i64(dim))
        at = K.where(inside, j, i64(0))
        return K.where(inside, keys.at(ix[:axis] + (at,) + ix[axis + 2:]), K.const(worst, dt))
    segmented = T(keys.shape[:axis] + (segs, seg) + rest, dt, padded)
    every = ctx.graph.add_value("topk_k", I64, (1,), np.array([bound], np.int64)).name
    local = _topk_kernel(ctx, segmented, axis + 1, every, bound, largest)   # each segment keeps all of its bound

    def place(ix, c):   # candidate c -> (segment, its element in the segment), indexed like `segmented`
        s, r = K.binary("div", c, i64(bound)), K.binary("mod", c, i64(bound))
        return ix[:axis] + (s, local.at(ix[:axis] + (s, r) + ix[axis + 1:])) + ix[axis + 1:]
    candidates = T(keys.shape[:axis] + (segs * bound,) + rest, dt, lambda ix: segmented.at(place(ix, ix[axis])))
    best = _topk_kernel(ctx, candidates, axis, k_arg, bound, largest)

    def index(ix):
        c = best.at(ix)
        valid = K.binary("ge", c, i64(0))
        where = place(ix, K.where(valid, c, i64(0)))
        return K.where(valid, where[axis] * i64(seg) + where[axis + 1], i64(-1))
    return ctx.tensor(ctx.graph.lookup(ctx.buffer(T(best.shape, I64, index), "topk_indices")))


def _not_zero(x: T) -> T:
    return map_(lambda e: K.binary("ne", e, K.const(0, e.dtype)), x)


@op("NonZero")
def nonzero(ctx):
    """Coordinates of the non-zero elements, [rank, count], row-major order. A constant input folds;
    on run-time data the output is [rank, numel] (the bound), the coordinates first and -1 after."""
    if ctx.value(0).const is not None:
        x = ctx.const(0)
        return [np.array(np.nonzero(x if x.ndim else x.reshape(1)), np.int64).reshape(max(x.ndim, 1), -1)]
    coords, count = compact(ctx, _not_zero(ctx.input(0)), "nonzero")
    ctx.count_output(0, 1, count, coords.shape[1], f"the {coords.shape[1]} elements of its input")
    return [coords]


def compress_runtime(ctx, x: T, axis: int) -> T:
    """Compress by a run-time condition: the slices along `axis` where it holds, the first first; the
    output is the whole axis long (the bound), the slices past the count repeat the last one."""
    cond = ctx.input(1)
    if cond.ndim != 1:
        raise ShapeError(f"node '{ctx.node.name}' (Compress): the condition must be 1-D, got shape {list(cond.shape)}")
    length = min(cond.shape[0], x.shape[axis])
    holds = T((length,), "bool", lambda ix: K.binary("ne", cond.at(ix), K.const(0, cond.dtype)))
    picks, count = compact(ctx, holds, "compress")
    shape = x.shape[:axis] + (length,) + x.shape[axis + 1:]

    def fn(ix):
        at = picks.at((K.const(0, I64), ix[axis]))
        at = K.where(K.binary("lt", at, K.const(0, I64)), K.const(0, I64), at)
        return x.at(ix[:axis] + (at,) + ix[axis + 1:])
    ctx.count_output(0, axis, count, length, f"the condition's {length} entries")
    return T(shape, x.dtype, fn)


@op("NonMaxSuppression")
def non_max_suppression(ctx):
    """[selected, 3] rows (batch, class, box), per batch and class in selection order, as onnxruntime's
    kernel selects them (ir/selection.py states the rule). At most batches x classes x the boxes (or
    max_output_boxes_per_class, when it is a constant) rows: the bound; a count says how many."""
    boxes, scores = ctx.value(0), ctx.value(1)
    if len(boxes.shape) != 3 or boxes.shape[2] != 4 or len(scores.shape) != 3 \
            or scores.shape[0] != boxes.shape[0] or scores.shape[2] != boxes.shape[1]:
        raise ShapeError(f"node '{ctx.node.name}' (NonMaxSuppression): boxes must be [batches, boxes, 4] and "
                         f"scores [batches, classes, boxes]; got {list(boxes.shape)} and {list(scores.shape)}")
    batches, n, classes = boxes.shape[0], boxes.shape[1], scores.shape[1]
    if n > NMS_MAX_BOXES:
        ctx.fail(f"{n} boxes a batch; at most {NMS_MAX_BOXES} are taken (ranking them is a row's length squared)")
    max_out = _scalar_const(ctx, 2, 0)
    per_class = n if max_out is None else min(max(int(max_out), 0), n)
    read = ctx.attr(ROWS_READ)   # only the first rows are read (passes/rows_read.py): no class needs more
    per_class = per_class if read is None else min(per_class, read)
    if per_class == 0 or batches * classes == 0:
        return [np.zeros((0, 3), np.int64)]
    args = [ctx.buffer(cast(ctx.input(0), "float32"), "nms_boxes"), ctx.buffer(cast(ctx.input(1), "float32"), "nms_scores"),
            _scalar_arg(ctx, 2, I64, 0), _scalar_arg(ctx, 3, "float32", 0.0), _scalar_arg(ctx, 4, "float32", 0.0),
            _valid_boxes(ctx, n)]
    whole = ctx.graph.add_value("nms_n", I64, (1,), np.array([n], np.int64)).name
    args.append(ranked(ctx, ctx.tensor(ctx.graph.lookup(args[1])), 2, whole, n, largest=True).source)
    center = int(ctx.attr("center_point_box", 0))
    words = -(-n // 64)
    masked = batches * classes * n * words * 8 <= NMS_MASK_BYTES and words <= NMS_MASK_MAX_WORDS
    if masked:   # every IoU at once over the whole GPU; the walk then reads it (codegen/selection.py)
        mask = NmsMaskKernel((batches * classes, n, words), tuple((ctx.graph.lookup(a).shape, ctx.graph.lookup(a).dtype)
                                                                 for a in (args[0], args[6], args[3])), center)
        mask_v = ctx.new_value("nms_mask", mask.shape, "uint64")
        ctx.emit(Node("Kernel", [args[0], args[6], args[3]], [mask_v.name], name=ctx.node.name, attrs={"kernel": mask}))
        args.append(mask_v.name)
    kernel = NmsKernel((batches, classes, per_class), tuple((ctx.graph.lookup(a).shape, ctx.graph.lookup(a).dtype)
                                                            for a in args),
                       center, ctx.has(4), masked)
    sel_v = ctx.new_value("nms_selected", kernel.shape, I64)
    ctx.emit(Node("Kernel", args, [sel_v.name], name=ctx.node.name, attrs={"kernel": kernel}))
    sel = ctx.tensor(sel_v)
    flags = T(kernel.shape, "bool", lambda ix: K.binary("ge", sel.at(ix), K.const(0, I64)))
    coords, count = compact(ctx, flags, "nms_rows")
    bound = nms_bound(batches, classes, n, per_class)

    def fn(ix):
        at = [coords.at((K.const(a, I64), ix[0])) for a in range(3)]
        at = [K.where(K.binary("lt", c, K.const(0, I64)), K.const(0, I64), c) for c in at]
        return K.where(K.binary("eq", ix[1], K.const(2, I64)), sel.at(tuple(at)),
                       K.where(K.binary("eq", ix[1], K.const(0, I64)), at[0], at[1]))
    why = ("the rows read after it" if read is not None and per_class == read < n else
           "max_output_boxes_per_class" if max_out is not None and per_class < n else "the boxes")
    ctx.count_output(0, 0, count, bound, f"batches x classes x {why} ({batches} x {classes} x {per_class})")
    return [T((bound, 3), I64, fn)]


def _valid_boxes(ctx, n: int) -> str:
    """How many boxes are real: n, or where the boxes' axis is data-dependent (torchvision's candidates
    after a threshold), its count; the padding past it is never a candidate."""
    counts = [c for i, axis in ((0, 1), (1, 2)) if ctx.has(i) for a, c in (ctx.value(i).counts or {}).items() if a == axis]
    others = [a for i, axis in ((0, 1), (1, 2)) for a in (ctx.value(i).counts or {}) if a != axis]
    if others:
        ctx.fail(f"the batch or class axis of its boxes or scores is data-dependent (dim {others[0]}); "
                 "only the boxes' axis may be")
    if not counts:
        return ctx.graph.add_value("nms_valid", I64, (), np.array(n, np.int64)).name
    valid = ctx.tensor(ctx.graph.lookup(counts[0]))
    for c in counts[1:]:
        other = ctx.tensor(ctx.graph.lookup(c))
        valid = T((), I64, lambda ix, a=valid, b=other: K.binary("min", a.at(()), b.at(())))
    return valid.source if valid.source is not None else ctx.realize(valid, "nms_valid").source


def _scalar_const(ctx, i: int, default):
    """Input i's value if known at compile time (its default when absent), None if it is run-time data."""
    if not ctx.has(i):
        return default
    v = ctx.value(i)
    return None if v.const is None else np.asarray(v.const).reshape(-1)[0].item()


def _scalar_arg(ctx, i: int, dtype: str, default) -> str:
    """The name of a one-element buffer holding input i (or its default), of `dtype`."""
    if ctx.has(i):
        v = ctx.value(i)
        if v.dtype == dtype and math.prod(v.shape) == 1:
            return v.name
        return ctx.buffer(cast(reshape(ctx.input(i), ()), dtype), f"nms_arg{i}")
    return ctx.graph.add_value(f"nms_arg{i}", dtype, (), np.array(default, dtype)).name


def unique_runtime(ctx) -> list:
    """Unique of run-time data (flattened; `sorted` 1 or 0): the values, their first indices, each
    element's inverse index and the counts. The elements are ranked (equal values by position, so a
    run's first element is its first occurrence) and the runs' starts compacted; the three per-value
    outputs are the input long (the bound), counted by the number of runs. An element's inverse index
    counts the distinct values ranked before its own (smaller, or first seen earlier when unsorted):
    a sum over the bound, masked past the count."""
    if ctx.attr("axis") is not None:
        return _unique_slices(ctx)
    x = ctx.input(0)
    n = math.prod(x.shape)
    if n == 0:
        empty = np.zeros(0, np.int64)
        return [np.zeros(0, dtypes.np_dtype(x.dtype)), empty, empty, empty]
    flat = reshape(x, (n,))
    whole = ctx.graph.add_value("unique_n", I64, (1,), np.array([n], np.int64)).name
    order = ranked(ctx, flat, 0, whole, n, largest=False)
    zero, one, end = K.const(0, I64), K.const(1, I64), K.const(n, I64)

    def clamp(i):   # an index of [0, n): padding (-1) and one past the end read a real element
        return K.binary("min", K.binary("max", i, zero), K.const(n - 1, I64))

    def sorted_at(j):
        return flat.at((order.at((clamp(j),)),))
    starts = T((n,), "bool", lambda ix: K.binary("or", K.binary("eq", ix[0], zero),
                                                 K.binary("ne", sorted_at(ix[0]), sorted_at(ix[0] - one))))
    runs, count = compact(ctx, starts, "unique_runs")
    count = ctx.realize(count, "unique_count")
    valid = lambda u: K.binary("lt", u, count.at(()))  # noqa: E731

    def run_start(u):   # where run u starts in the ranked order; n from the count on
        return K.where(valid(u), runs.at((zero, clamp(u))), end)
    first = ctx.realize(T((n,), I64, lambda ix: K.where(valid(ix[0]), order.at((clamp(run_start(ix[0])),)), end)),
                        "unique_first")
    sizes = T((n,), I64, lambda ix: K.where(valid(ix[0]), run_start(ix[0] + one) - run_start(ix[0]), zero))
    sorted_ = bool(ctx.attr("sorted", 1))
    if not sorted_:   # the values in order of their first occurrence: rank the runs by it (padding is n: last)
        by_first = ranked(ctx, first, 0, whole, n, largest=False)
        held = ctx.realize(sizes, "unique_sizes")
        sizes = T((n,), I64, lambda ix: held.at((clamp(by_first.at(ix)),)))
        first = ctx.realize(T((n,), I64, lambda ix: first.at((clamp(by_first.at(ix)),))), "unique_first_ordered")
    values = ctx.realize(T((n,), x.dtype, lambda ix: flat.at((clamp(first.at(ix)),))), "unique_values")

    def inverse(ix):
        v = K.ridx(n)
        if sorted_:
            before = K.binary("lt", values.at((v,)), flat.at(ix))
        else:
            r = K.ridx(n)
            seen = K.reduce("min", K.where(K.binary("eq", flat.at((r,)), flat.at(ix)), r, end), (r,))
            before = K.binary("lt", first.at((v,)), seen)
        return K.reduce("sum", K.cast(K.binary("and", valid(v), before), I64), (v,))
    for j in (0, 1, 3):
        ctx.count_output(j, 0, count, n, f"the {n} elements of its input")
    return [values, first, T((n,), I64, inverse), sizes]


def _unique_slices(ctx) -> list:
    """Unique along an axis: the distinct slices, compared in order of their elements (numpy's
    lexicographic order). Pairwise tables of the n slices (equal, and ranked before: the first element
    where they differ is smaller), then each slice's standing from them: whether it is its slice's first
    occurrence, and how many distinct slices rank before it (sorted) or appear before it (unsorted).
    Work n^2 x the slice's size: meant for the small tables Unique is applied to along an axis."""
    x = ctx.input(0)
    axis = norm_axis(int(ctx.attr("axis")), x.ndim)
    n = x.shape[axis]
    moved = transpose(x, [axis] + [a for a in range(x.ndim) if a != axis])
    m = math.prod(moved.shape[1:])
    if n == 0 or m == 0:
        ctx.fail("Unique along an empty axis of run-time data")
    rows = reshape(moved, (n, m))
    zero, none = K.const(0, I64), K.const(n, I64)

    def first_difference(i, j):   # the first column where rows i and j differ; m where none does
        p = K.ridx(m)
        return K.reduce("min", K.where(K.binary("ne", rows.at((i, p)), rows.at((j, p))), p, K.const(m, I64)), (p,))
    same = ctx.realize(T((n, n), "bool", lambda ix: K.binary("eq", first_difference(ix[0], ix[1]), K.const(m, I64))),
                       "unique_same")

    def before(ix):   # row ix[0] ranks before row ix[1]
        d = K.binary("min", first_difference(ix[0], ix[1]), K.const(m - 1, I64))
        return K.binary("and", K.unary("not", same.at(ix)), K.binary("lt", rows.at((ix[0], d)), rows.at((ix[1], d))))
    less = ctx.realize(T((n, n), "bool", before), "unique_less")

    def count(cond):   # an int64 sum over a fresh row variable j of cond(j)
        j = K.ridx(n)
        return K.reduce("sum", K.cast(cond(j), I64), (j,))
    first = ctx.realize(T((n,), "bool", lambda ix: K.binary("eq", count(
        lambda j: K.binary("and", K.binary("lt", j, ix[0]), same.at((j, ix[0])))), zero)), "unique_is_first")
    sorted_ = bool(ctx.attr("sorted", 1))
    # each slice's standing: the distinct slices ranked before it (sorted), or first seen before it
    standing_of = ctx.realize(T((n,), I64, lambda ix: count(
        lambda j: K.binary("and", first.at((j,)), less.at((j, ix[0])) if sorted_ else K.binary("lt", j, _first_of(same, ix[0], n))))),
        "unique_standing")
    total = ctx.realize(T((), I64, lambda ix: count(lambda j: first.at((j,)))), "unique_count")

    def chosen(u):   # the first occurrence standing u-th; n past the count
        i = K.ridx(n)
        return K.reduce("min", K.where(K.binary("and", first.at((i,)), K.binary("eq", standing_of.at((i,)), u)), i, none), (i,))
    picks = ctx.realize(T((n,), I64, lambda ix: chosen(ix[0])), "unique_first")
    at = lambda u: K.binary("min", picks.at((u,)), K.const(n - 1, I64))  # noqa: E731
    values = T(moved.shape, x.dtype, lambda ix: moved.at((at(ix[0]),) + tuple(ix[1:])))
    back = [a for a in range(1, x.ndim)]
    perm = back[:axis] + [0] + back[axis:]
    y = transpose(values, perm)
    inverse = T((n,), I64, lambda ix: standing_of.at((_first_of(same, ix[0], n),)))
    sizes = T((n,), I64, lambda ix: K.where(K.binary("lt", ix[0], total.at(())),
                                             count(lambda j: same.at((j, at(ix[0])))), zero))
    for j, ax in ((0, axis), (1, 0), (3, 0)):
        ctx.count_output(j, ax, total, n, f"the {n} slices along axis {axis}")
    return [y, picks, inverse, sizes]


def _first_of(same: T, i, n: int):
    """The first row equal to row i."""
    j = K.ridx(n)
    return K.reduce("min", K.where(same.at((j, i)), j, K.const(n, I64)), (j,))


__all__ = ["compact", "compress_runtime", "ranked", "unique_runtime"]
