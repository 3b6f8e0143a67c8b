"""Kernels whose output length depends on the data (issue 36): the rows they select are written first,
then padding, into a buffer sized for the most they can select (the *bound*). The padding is -1, so
a count of selected rows is a plain reduction (sum of `row >= 0`: ops/counted.py) and a selected
index is always a valid one for Gather (-1 is the last element) even in the padding.

    nonzero   NonZeroKernel   the coordinates of the non-zero elements of x, row-major order:
                              out [rank, numel] int64, column j the j-th non-zero's coordinates
    nms       NmsKernel       greedy non-max suppression per (batch, class), onnxruntime's rule:
                              out [batches, classes, bound] int64, the box indices selected, in order
    topk      TopKKernel      the indices of the k largest (or smallest) along an axis, best first,
                              equal values by lower index, NaN last; k read at run time, at most the
                              bound K: out [.., K, ..] int64, -1 past k

NonMaxSuppression, as onnxruntime's CPU kernel computes it (and as both backends here do):
    - candidates: every box, or with a score threshold input only those with score > threshold;
    - repeatedly take the best remaining candidate (highest score; among equal scores the lowest box
      index -- onnxruntime's heap leaves that order unspecified, this is the rule both backends keep);
      it is selected unless it overlaps a box already selected for its class by IoU > iou_threshold;
    - stop at max_output_boxes_per_class selections (0: none; negative: as 0);
    - IoU in float32: corners [y1, x1, y2, x2] in either order (center_point_box 0) or
      [x_center, y_center, width, height] (1); empty intersections and boxes of no area never suppress.
Suppressing every remaining candidate that overlaps a box as soon as it is selected is the same
rule (IoU is symmetric, and every later candidate is checked against it), and is how the GPU runs it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .kernel import inputs_from_json, inputs_to_json

PAD = -1
# Boxes a batch: more would make the ranking before NMS (a row's length squared) too slow to be useful.
NMS_MAX_BOXES = 1 << 20
# The overlap mask (NmsMaskKernel) is made where it takes at most this much memory (the arena holds it):
# the whole GPU then computes every IoU at once, and the walk is cheap; else the walk checks each
# candidate against what it kept (one block per class).
NMS_MASK_BYTES = 256 << 20
NMS_MASK_MAX_WORDS = 4096   # the walk keeps a removed bit per candidate in shared memory


@dataclass(frozen=True)
class NonZeroKernel:
    shape: tuple       # (rank, numel): rank max(x.ndim, 1)
    inputs: tuple      # ((x.shape, x.dtype),), and with segments ((segments + 1,), int64): where each starts
    dtype: str = "int64"
    segment: int = 0   # flags a block compacts, from the column its offset gives; 0: one block, all of them

    kind = "nonzero"

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def to_json(self) -> dict:
        d = {"kind": self.kind, "shape": list(self.shape), "dtype": self.dtype, "inputs": inputs_to_json(self.inputs)}
        return {**d, "segment": self.segment} if self.segment else d

    @staticmethod
    def from_json(d: dict) -> "NonZeroKernel":
        return NonZeroKernel(tuple(d["shape"]), inputs_from_json(d["inputs"]), segment=int(d.get("segment", 0)))

    def run(self, inputs: list, out: np.ndarray | None = None) -> np.ndarray:
        shape, dt = self.inputs[0]
        x = np.asarray(inputs[0]).reshape(shape)
        coords = np.nonzero(x.reshape(1) if x.ndim == 0 else x)
        out = np.full(self.shape, PAD, np.int64) if out is None else out
        out.reshape(self.shape)[...] = PAD
        n = len(coords[0])
        for a, c in enumerate(coords):
            out.reshape(self.shape)[a, :n] = c
        return out


@dataclass(frozen=True)
class NmsKernel:
    shape: tuple       # (batches, classes, bound): bound = min(N, max_output_boxes_per_class if constant)
    inputs: tuple      # boxes [B, N, 4], scores [B, C, N] float32; max_out int64 [], iou float32 [], score float32 [],
                       # valid int64 []: boxes from this index on are padding (a data-dependent N), never candidates;
                       # order int64 [B, C, N]: each class's boxes by score, best first (the GPU's walk; numpy
                       # needs no order); and, when a mask was made (NmsMaskKernel), that mask
    center_point_box: int
    score_threshold: bool   # whether the score threshold input was given (without it every box is a candidate)
    masked: bool = False    # the GPU walks the overlap mask (an 8th input) instead of checking the kept boxes
    dtype: str = "int64"

    kind = "nms"

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def boxes(self) -> int:
        return self.inputs[0][0][1]

    def to_json(self) -> dict:
        return {"kind": self.kind, "shape": list(self.shape), "dtype": self.dtype, "inputs": inputs_to_json(self.inputs),
                "center_point_box": self.center_point_box, "score_threshold": self.score_threshold,
                "masked": self.masked}

    @staticmethod
    def from_json(d: dict) -> "NmsKernel":
        return NmsKernel(tuple(d["shape"]), inputs_from_json(d["inputs"]), int(d["center_point_box"]),
                         bool(d["score_threshold"]), bool(d.get("masked", False)))

    def run(self, inputs: list, out: np.ndarray | None = None) -> np.ndarray:
        b_, c_, bound = self.shape
        boxes = np.asarray(inputs[0], np.float32).reshape(self.inputs[0][0])
        scores = np.asarray(inputs[1], np.float32).reshape(self.inputs[1][0])
        max_out = min(max(int(np.asarray(inputs[2]).reshape(-1)[0]), 0), bound)
        iou = np.float32(np.asarray(inputs[3]).reshape(-1)[0])
        threshold = np.float32(np.asarray(inputs[4]).reshape(-1)[0])
        valid = int(np.asarray(inputs[5]).reshape(-1)[0])
        res = np.full(self.shape, PAD, np.int64) if out is None else out.reshape(self.shape)
        res[...] = PAD
        for b in range(b_):
            lo, hi = _corners(boxes[b], self.center_point_box)
            area = (hi[:, 0] - lo[:, 0]) * (hi[:, 1] - lo[:, 1])
            for c in range(c_):
                s = scores[b, c]
                alive = s > threshold if self.score_threshold else np.ones(len(s), bool)
                alive[valid:] = False
                for n in range(max_out):
                    live = np.flatnonzero(alive)
                    if not len(live):
                        break
                    best = live[np.argmax(s[live])]    # argmax keeps the first of equal maxima
                    res[b, c, n] = best
                    alive[best] = False
                    alive[live] &= ~_overlaps(lo, hi, area, best, live, iou)
        return res if out is None else out


# A NonMaxSuppression node's attribute: the rows of its output the model reads (passes/rows_read.py).
ROWS_READ = "grapec_rows_read"
TOPK_SELECT_MAX_K = 2048   # kept keys ranked in shared memory by the GPU's select (codegen/selection.py), 24 KiB


@dataclass(frozen=True)
class TopKKernel:
    shape: tuple       # the input's shape with the axis's length replaced by the bound K
    inputs: tuple      # ((x.shape, key dtype: float32 | float64 | int64 | uint64), (k's shape, int64))
    axis: int
    largest: bool
    dtype: str = "int64"

    kind = "topk"

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def to_json(self) -> dict:
        return {"kind": self.kind, "shape": list(self.shape), "dtype": self.dtype, "inputs": inputs_to_json(self.inputs),
                "axis": self.axis, "largest": self.largest}

    @staticmethod
    def from_json(d: dict) -> "TopKKernel":
        return TopKKernel(tuple(d["shape"]), inputs_from_json(d["inputs"]), int(d["axis"]), bool(d["largest"]))

    def run(self, inputs: list, out: np.ndarray | None = None) -> np.ndarray:
        x = np.asarray(inputs[0]).reshape(self.inputs[0][0])
        bound = self.shape[self.axis]
        k = min(max(int(np.asarray(inputs[1]).reshape(-1)[0]), 0), bound)
        nan = np.isnan(x) if x.dtype.kind == "f" else np.zeros(x.shape, bool)
        key = np.where(nan, 0, x)
        if self.largest:   # descending; ~ reverses integers without -x's overflow at the smallest int64
            key = -key if key.dtype.kind == "f" else np.invert(key)
        position = np.arange(x.shape[self.axis]).reshape([-1 if a == self.axis else 1 for a in range(x.ndim)])
        order = np.lexsort((np.broadcast_to(position, x.shape), key, nan), axis=self.axis) if x.size \
            else np.zeros(x.shape, np.int64)
        res = np.full(self.shape, PAD, np.int64) if out is None else out.reshape(self.shape)
        res[...] = PAD
        picked = np.take(order, np.arange(k), axis=self.axis)
        res[tuple(slice(0, k) if a == self.axis else slice(None) for a in range(x.ndim))] = picked
        return res if out is None else out


def _corners(boxes: np.ndarray, center: int) -> tuple:
    """[N, 4] -> (lo, hi), each [N, 2] (x, y) in float32, as onnxruntime's SuppressByIOU derives them."""
    if center:
        half = boxes[:, 2:4] / np.float32(2)
        return boxes[:, 0:2] - half, boxes[:, 0:2] + half
    xy = boxes[:, [1, 0, 3, 2]]
    return np.minimum(xy[:, 0:2], xy[:, 2:4]), np.maximum(xy[:, 0:2], xy[:, 2:4])


def _overlaps(lo, hi, area, i: int, js: np.ndarray, iou: np.float32) -> np.ndarray:
    """IoU(box i, boxes js) > iou, float32 step by step (the GPU rounds each step the same way)."""
    ilo, ihi = np.maximum(lo[js], lo[i]), np.minimum(hi[js], hi[i])
    w, h = ihi[:, 0] - ilo[:, 0], ihi[:, 1] - ilo[:, 1]
    inter = w * h
    union = (area[i] + area[js]) - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = inter / union
    ok = (w > 0) & (h > 0) & (inter > 0) & (area[i] > 0) & (area[js] > 0) & (union > 0)
    return ok & (ratio > iou)


@dataclass(frozen=True)
class NmsMaskKernel:
    """Which later candidates each candidate would suppress, for the GPU's NMS walk (codegen/selection.py):
    out[bc, r, w] bit b is set where c = 64 w + b > r and IoU(box order[r], box order[c]) > iou, the
    candidates in each (batch, class)'s score order. Only the words w >= r // 64 are read (and written)."""
    shape: tuple       # (batches x classes, N, ceil(N / 64)) uint64
    inputs: tuple      # boxes [B, N, 4] float32, order [B, C, N] int64, iou float32 []
    center_point_box: int
    dtype: str = "uint64"

    kind = "nms_mask"

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def to_json(self) -> dict:
        return {"kind": self.kind, "shape": list(self.shape), "dtype": self.dtype, "inputs": inputs_to_json(self.inputs),
                "center_point_box": self.center_point_box}

    @staticmethod
    def from_json(d: dict) -> "NmsMaskKernel":
        return NmsMaskKernel(tuple(d["shape"]), inputs_from_json(d["inputs"]), int(d["center_point_box"]))

    def run(self, inputs: list, out: np.ndarray | None = None) -> np.ndarray:
        boxes = np.asarray(inputs[0], np.float32).reshape(self.inputs[0][0])
        order = np.asarray(inputs[1]).reshape(self.inputs[1][0])
        iou = np.float32(np.asarray(inputs[2]).reshape(-1)[0])
        bcs, n, words = self.shape
        classes = order.shape[1]
        res = np.zeros(self.shape, np.uint64) if out is None else out.reshape(self.shape)
        res[...] = 0
        weights = np.uint64(1) << np.arange(64, dtype=np.uint64)
        for bc in range(bcs):
            b = bc // classes
            lo, hi = _corners(boxes[b], self.center_point_box)
            area = (hi[:, 0] - lo[:, 0]) * (hi[:, 1] - lo[:, 1])
            rank = order[b, bc % classes]
            lo, hi, area = lo[rank], hi[rank], area[rank]   # in score order
            for r0 in range(0, n, 256):   # a block of rows at a time: every pair's IoU, vectorized
                rows = np.arange(r0, min(n, r0 + 256))
                hit = _pairwise_overlaps(lo, hi, area, rows, iou) & (np.arange(n)[None, :] > rows[:, None])
                padded = np.zeros((len(rows), words * 64), bool)
                padded[:, :n] = hit
                res[bc, rows] = (padded.reshape(len(rows), words, 64) * weights).sum(axis=2, dtype=np.uint64)
        return res if out is None else out


def _pairwise_overlaps(lo, hi, area, rows, iou) -> np.ndarray:
    """[len(rows), N]: IoU(box row, box c) > iou, as _overlaps computes it (row the selected box)."""
    ilo = np.maximum(lo[rows][:, None, :], lo[None, :, :])
    ihi = np.minimum(hi[rows][:, None, :], hi[None, :, :])
    w, h = ihi[..., 0] - ilo[..., 0], ihi[..., 1] - ilo[..., 1]
    inter = w * h
    a1, a2 = area[rows][:, None], area[None, :]
    union = (a1 + a2) - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = inter / union
    return (w > 0) & (h > 0) & (inter > 0) & (a1 > 0) & (a2 > 0) & (union > 0) & (ratio > iou)


def nms_bound(batches: int, classes: int, boxes: int, max_out: int | None) -> int:
    """Rows NonMaxSuppression can select: per (batch, class) at most the boxes, or max_out if known."""
    per_class = boxes if max_out is None else min(max(max_out, 0), boxes)
    return batches * classes * per_class


COUNT_MARK = "::count"


def count_output_name(output: str, axis: int) -> str:
    """The graph output that holds how many positions of `output`'s axis are valid."""
    return f"{output}{COUNT_MARK}{axis}"


def counted_output(name: str) -> tuple | None:
    """count_output_name's inverse: (output, axis), or None for any other name."""
    head, mark, axis = name.rpartition(COUNT_MARK)
    return (head, int(axis)) if mark and axis.isdigit() else None


def output_counts(names) -> dict:
    """{output: [(axis, its count output)]} of a bundle's output names (the model's and their counts)."""
    counts: dict = {}
    for name in names:
        c = counted_output(name)
        if c:
            counts.setdefault(c[0], []).append((c[1], name))
    return counts


BOUND_MARK = "::bound"


def bound_output_name(value: str) -> str:
    """The graph output that holds the run's value of `value`, bounded by --bound (passes/bounds.py)."""
    return f"{value}{BOUND_MARK}"


def bound_output(name: str) -> str | None:
    """bound_output_name's inverse: the bounded value, or None for any other name."""
    head, mark, tail = name.rpartition(BOUND_MARK)
    return head if mark and not tail else None


CHECK_MARK = "::equals"


def check_output_name(node: str, size: int) -> str:
    """The graph output holding a size that node `node` needs to be exactly `size` at run time (a
    Reshape of data-dependent rows into a fixed shape: ONNX's own rule, checked as onnxruntime does)."""
    return f"{node}{CHECK_MARK}{size}"


def checked_output(name: str) -> tuple | None:
    """check_output_name's inverse: (node, size), or None for any other name."""
    head, mark, size = name.rpartition(CHECK_MARK)
    return (head, int(size)) if mark and size.isdigit() else None


def hidden_output(name: str) -> bool:
    """A bundle output the session reads for itself (a count, a bounded value, a checked size), not the
    model's own."""
    return counted_output(name) is not None or bound_output(name) is not None or checked_output(name) is not None


__all__ = ["CHECK_MARK", "check_output_name", "checked_output", "ROWS_READ", "TOPK_SELECT_MAX_K", "BOUND_MARK", "COUNT_MARK", "bound_output", "bound_output_name", "hidden_output", "NMS_MAX_BOXES", "NMS_MASK_BYTES", "NMS_MASK_MAX_WORDS", "NmsKernel", "NmsMaskKernel", "NonZeroKernel", "TopKKernel", "PAD", "count_output_name", "counted_output", "nms_bound",
           "output_counts"]
