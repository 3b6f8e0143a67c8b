"""strided_operands: let a GEMM read and write through strides instead of a copy kernel.

Attention splits heads with a transpose before its batched matmuls and merges them with another
after: kernels that only move bytes. cuBLASLt takes each operand with a leading dimension and one
batch stride, which is all these copies express. So:

  * a matmul operand made by a copy kernel (out[i] = in[offset + sum_a stride_a * i_a]: one load,
    no mask, affine index), directly or through reshapes (Views), is read straight from the copy's
    source, through a *view*;
  * a matmul output read only by a permuting copy kernel is written straight into that kernel's
    output, through a view, when the matmul has no C operand.

The copy kernel then has no reader left and is dropped. A view is stored in the step's attrs as
attrs["views"][slot] = [offset, batch_stride, ld, shape] (slot "0" = A, "1" = B, "out"), in
elements of the buffer the step names: the operand is the row-major matrix batch shape[-2:] whose
row r, column c of batch b sits at offset + b * batch_stride + r * ld + c. Both backends read it
(ir/library.py `view_array`, runtime/cuda/blas.py). Where a copy reads its operand transposed, the
view is of the stored matrix and trans_a / trans_b flips.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from ..ir import kernel as K
from ..ir.graph import Graph
from ..ir.interpret import run_kernel
from .fuse import drop_unused, is_gather

MAX_FIT_ELEMENTS = 1 << 22    # copies larger than this are not fitted (the offset table is built)


def strided_operands(g: Graph) -> Graph:
    producers = {o: n for n in g.nodes for o in n.outputs if o}
    readers: dict = {}
    for n in g.nodes:
        for i in set(n.inputs):
            readers.setdefault(i, []).append(n)
    keep = set(g.outputs)
    changed, absorbed, sourced = False, [], set()
    for node in g.nodes:
        if node.op != "Library" or node.attrs.get("op") != "matmul" or node.attrs.get("views"):
            continue
        views = {}
        for slot, flag in ((0, "trans_a"), (1, "trans_b")):
            p = producers.get(node.inputs[slot])
            while p is not None and p.op == "View":    # a reshape of the copy: same element order
                p = producers.get(p.inputs[0])
            if p is None or not K.is_kernel_node(p):
                continue
            v = _operand_view(p.attrs["kernel"], g.lookup(node.inputs[slot]).shape)
            if v is None:
                continue
            sourced.add(id(p))
            view, flipped = v
            views[str(slot)] = view
            node.inputs[slot] = p.inputs[0]
            if flipped:
                node.attrs[flag] = 1 - int(node.attrs.get(flag, 0))
        out = node.outputs[0]
        chain, users = [out], readers.get(out, [])
        while len(users) == 1 and users[0].op == "View":     # reshapes of the output: same bytes
            chain.append(users[0].outputs[0])
            users = readers.get(chain[-1], [])
        has_c = len(node.inputs) > 2 and node.inputs[2]
        if (not has_c and not keep & set(chain) and len(users) == 1 and K.is_kernel_node(users[0])
                and id(users[0]) not in sourced
                and tuple(users[0].attrs["kernel"].inputs[0][0]) == tuple(g.values[out].shape)):
            view = _output_view(users[0].attrs["kernel"])
            if view is not None:
                views["out"] = view
                node.outputs[0] = users[0].outputs[0]
                # the copy is gone: a later GEMM reading its output reads this one's, not the copy's source
                producers[node.outputs[0]] = node
                absorbed.append(users[0])
        if views:
            node.attrs = dict(node.attrs, views=views)
            changed = True
    if not changed:
        return g
    g.nodes = [n for n in g.nodes if not any(n is a for a in absorbed)]
    return drop_unused(g)


def copy_strides(kernel: K.Kernel, shape=None):
    """A kernel that copies elements of its one input, seen in `shape` (a reshape of its output,
    through View nodes) -> (offset, flat input stride per axis of shape), or None when the copy is
    not affine in those coordinates. An index written without div or mod (a head split, a transpose)
    is fitted from the index itself (_affine, _reshaped), exactly and at any size. Otherwise it is
    found numerically, up to MAX_FIT_ELEMENTS: the source offset of every element is evaluated and
    checked against offset + sum(stride * coordinate), so index math written with div/mod (a
    reshape's unravelling) counts as affine wherever it is; each such copy is evaluated once a
    compile (_copy_strides' cache: a transformer's layers repeat the same few)."""
    if not is_gather(kernel) or len(kernel.inputs) != 1 or kernel.body.dtype != kernel.dtype or kernel.size <= 0:
        return None
    out_shape, in_shape = tuple(kernel.shape), tuple(kernel.inputs[0][0])
    shape = out_shape if shape is None else tuple(shape)
    read = _affine(kernel.body, in_shape)
    if read is not None:
        found = _reshaped(out_shape, read, shape)
        if found is not _UNDECIDED:
            return found
    if kernel.size > MAX_FIT_ELEMENTS:
        return None
    return _copy_strides(kernel.body, out_shape, in_shape, shape)


_UNDECIDED = object()


def _affine(load: K.Expr, in_shape: tuple):
    """The flat source offset of a load whose index is written without div or mod (a head split, a
    transpose: what GPT-2's copies are) -> (offset, {output axis: stride}); None where it is not so
    written. Exact: the index is int64 sums of constants and constant multiples of the coordinates."""
    def terms(e):
        if e.dtype != "int64":
            return None
        if e.op == "const":
            return int(e.value), {}
        if e.op == "idx":
            return 0, {e.args[0]: 1}
        if e.op in ("add", "sub", "mul"):
            a, b = terms(e.args[0]), terms(e.args[1])
            if a is None or b is None:
                return None
            if e.op == "mul":
                if a[1] and b[1]:
                    return None   # a product of two coordinates
                (c, k), v = (a, b[0]) if not b[1] else (b, a[0])
                return c * v, {ax: m * v for ax, m in k.items()}
            sign = 1 if e.op == "add" else -1
            coef = dict(a[1])
            for ax, m in b[1].items():
                coef[ax] = coef.get(ax, 0) + sign * m
            return a[0] + sign * b[0], coef
        return None
    offset, coef = 0, {}
    for comp, st in zip(load.args[1], _row_major(in_shape)):
        t = terms(comp)
        if t is None:
            return None
        offset += t[0] * st
        for ax, m in t[1].items():
            coef[ax] = coef.get(ax, 0) + m * st
    return offset, coef


def _reshaped(out_shape: tuple, read: tuple, shape: tuple):
    """An affine read over the copy's output coordinates, seen in `shape` (a reshape of them) ->
    (offset, stride per axis of shape), None where it is not affine in shape's coordinates, or
    _UNDECIDED (left to the evaluation). Axes are grouped as a reshape groups them (equal products,
    axes of 1 aside); a group whose output axes are not nested strides (stride = next stride x next
    size) is affine in shape's coordinates only if it is split, not merged: merged into one axis it
    is not (its step at a wrap differs from its step inside), and merged into several is left to
    the evaluation."""
    offset, coef = read
    if math.prod(out_shape) != math.prod(shape):
        return _UNDECIDED
    strides = {a: coef.get(a, 0) for a, d in enumerate(out_shape) if d > 1}
    src = [a for a, d in enumerate(out_shape) if d > 1]
    dst = [a for a, d in enumerate(shape) if d > 1]
    out = [0] * len(shape)
    i = j = 0
    while i < len(src) or j < len(dst):
        group, into = [src[i]], [dst[j]]
        p, q = out_shape[src[i]], shape[dst[j]]
        i, j = i + 1, j + 1
        while p != q:
            if p < q:
                group.append(src[i])
                p, i = p * out_shape[src[i]], i + 1
            else:
                into.append(dst[j])
                q, j = q * shape[dst[j]], j + 1
        nested = all(strides[a] == strides[b] * out_shape[b] for a, b in zip(group, group[1:]))
        if not nested:
            return None if len(into) == 1 else _UNDECIDED
        step = strides[group[-1]]
        for b in reversed(into):
            out[b] = step
            step *= shape[b]
    return offset, tuple(out)


@functools.lru_cache(maxsize=256)
def _copy_strides(body, out_shape: tuple, in_shape: tuple, shape: tuple):
    flat = K.const(0, "int64")
    for comp, st in zip(body.args[1], _row_major(in_shape)):
        flat = flat + comp * st
    offsets = np.broadcast_to(run_kernel(K.Kernel(out_shape, "int64", flat, ()), []), out_shape)
    offsets = offsets.reshape(shape)
    origin = int(offsets.reshape(-1)[0])
    strides = []
    for a, d in enumerate(shape):
        unit = [0] * len(shape)
        unit[a] = 1 if d > 1 else 0
        strides.append(int(offsets[tuple(unit)]) - origin if d > 1 else 0)
    fitted = origin + sum(np.arange(d, dtype=np.int64).reshape([-1 if b == a else 1 for b in range(len(shape))]) * st
                          for a, (d, st) in enumerate(zip(shape, strides)))
    if not np.array_equal(offsets, np.broadcast_to(fitted, shape)):
        return None
    return origin, tuple(strides)   # a tuple: the cache's answer is shared


def _operand_view(kernel: K.Kernel, shape):
    """The copy kernel seen as an operand of `shape` -> (view, whether the stored matrix is the
    transpose of the operand), or None."""
    cs = copy_strides(kernel, shape)
    if cs is None or len(shape) < 2:
        return None
    offset, strides = cs[0], list(cs[1])
    shape = list(shape)
    flipped = strides[-1] != 1 and (strides[-2] == 1 or shape[-2] == 1) and shape[-1] != 1
    if flipped:
        shape[-2], shape[-1] = shape[-1], shape[-2]
        strides[-2], strides[-1] = strides[-1], strides[-2]
    view = _view(offset, shape, strides)
    return None if view is None else (view, flipped)


def _output_view(kernel: K.Kernel):
    """A kernel that permutes its input's axes -> the view that writes the input's elements straight
    to their places in the kernel's output."""
    cs = copy_strides(kernel)
    in_shape = list(kernel.inputs[0][0])
    if cs is None or cs[0] != 0 or kernel.size != math.prod(in_shape) or len(in_shape) < 2:
        return None
    out_rm, in_rm = _row_major(kernel.shape), _row_major(in_shape)
    dest = [0] * len(in_shape)    # per input axis, its stride in the kernel's output
    seen = set()
    for a, (d, s) in enumerate(zip(kernel.shape, cs[1])):
        if d == 1:
            continue
        j = next((j for j in range(len(in_shape)) if in_shape[j] == d and in_rm[j] == s and j not in seen), None)
        if j is None:
            return None
        seen.add(j)
        dest[j] = out_rm[a]
    if any(in_shape[j] != 1 and j not in seen for j in range(len(in_shape))):
        return None
    return _view(0, in_shape, dest)


def _view(offset: int, shape: list, strides: list):
    """[offset, batch_stride, ld, shape] for a row-major operand with unit column stride, or None."""
    rows, cols = shape[-2], shape[-1]
    if cols > 1 and strides[-1] != 1:
        return None
    ld = strides[-2] if rows > 1 else cols
    if ld < cols or offset < 0:
        return None
    batch = [(d, s) for d, s in zip(shape[:-2], strides[:-2]) if d > 1]
    for (d0, s0), (d1, s1) in zip(batch, batch[1:]):
        if s0 != s1 * d1:
            return None   # cuBLASLt has one batch stride per operand
    batch_stride = batch[-1][1] if batch else 0
    return [offset, batch_stride, ld, list(shape)]


def _row_major(shape) -> list:
    out, s = [], 1
    for d in reversed(list(shape)):
        out.append(s)
        s *= d
    return out[::-1]
