"""The kernel-IR interpreter: evaluate kernel IR with numpy, vectorised over the whole index space
(float16 in float32 registers). Constant folding in the compiler and the CPU backend both use it.

Every subexpression evaluates to an array of the current *rank*: the output's dims first, then one
trailing axis per enclosing reduction variable; an axis an expression does not depend on has size 1
and broadcasts. A `reduce` appends axes for its variables, evaluates its body at the larger rank and
reduces those trailing axes away. Scalar semantics follow C (integer div/mod truncate toward zero),
so this interpreter and the CUDA rendering agree.
"""
from __future__ import annotations

import math

import numpy as np

from .. import dtypes
from ..errors import BundleError
from .alu import ALU, apply_op
from .kernel import Expr, Kernel, walk


def _compute_dtype(dt: str) -> np.dtype:
    """16-, 8- and 4-bit floats are computed in float32 and rounded when stored, as the CUDA code
    does; 4- and 2-bit integers in 8 bits."""
    return dtypes.np_dtype(dtypes.accumulation(dt))


_ENCODED_NP = {dtypes.np_dtype(d): _compute_dtype(d) for d in dtypes.ENCODED}


def _widen(val: np.ndarray) -> np.ndarray:
    wide = _ENCODED_NP.get(val.dtype)
    return val if wide is None else val.astype(wide)


def reduction_identity(op, dt: np.dtype):
    """The value a sum/prod/max/min reduction starts from: no element loses to it but its equal."""
    if op == "sum":
        return 0
    if op == "prod":
        return 1
    if dt.kind == "f":
        return -np.inf if op == "max" else np.inf
    if dt.kind == "b":
        return op == "min"
    info = np.iinfo(dt)
    return info.min if op == "max" else info.max


class _Evaluator:
    """Evaluates a kernel over whole arrays, or over the slice [start, stop) of one output axis
    (rows: (axis, start, stop))."""

    def __init__(self, kernel: Kernel, inputs: list, rows: tuple | None = None):
        self.kernel = kernel
        self.inputs = inputs
        self.rank0 = len(kernel.shape)
        self.rows = rows
        self.cache: dict = {}

    def span(self, axis: int, n: int) -> tuple:
        """The part of output axis `axis` (of size n) this evaluation covers."""
        return self.rows[1:] if self.rows is not None and axis == self.rows[0] else (0, n)

    def axis_array(self, n: int, axis: int, rank: int):
        shape = [1] * rank
        start, stop = self.span(axis, n) if axis < self.rank0 else (0, n)
        shape[axis] = stop - start
        return np.arange(start, stop, dtype=np.int64).reshape(shape)

    def ev(self, e: Expr, rvars: tuple):
        key = (e, rvars)
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        rank = self.rank0 + len(rvars)
        dt = _compute_dtype(e.dtype)
        op = e.op
        if op == "const":
            r = np.array(e.value, dt)
        elif op == "idx":
            r = self.axis_array(self.kernel.shape[e.args[0]], e.args[0], rank)
        elif op == "ridx":
            r = self.axis_array(e.args[1], self.rank0 + rvars.index(e), rank)
        elif op == "load":
            r = self.load(e, rvars, rank)
        elif op == "cast":
            with np.errstate(all="ignore"):
                x = self.ev(e.args[0], rvars)
                if dt.kind in "iu" and x.dtype.kind == "f":
                    x = np.trunc(np.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0))
                # to an encoded type: round (or wrap) now, as the stored value will be
                r = x.astype(dtypes.np_dtype(e.dtype)).astype(dt) if dtypes.is_encoded(e.dtype) else x.astype(dt)
        elif op == "reduce":
            r = self.reduce(e, rvars, rank)
        else:
            vals = [self.ev(a, rvars) for a in e.args]
            with np.errstate(all="ignore"):
                r = np.asarray(apply_op(op, vals))
            if r.dtype != dt:
                r = r.astype(dt)
        if r.ndim != rank:
            r = r.reshape(r.shape + (1,) * (rank - r.ndim)) if r.ndim else r.reshape((1,) * rank)
        self.cache[key] = r
        return r

    def load(self, e, rvars, rank):
        slot, index, mask, other = e.args
        buf = self.inputs[slot]
        if not index:
            val = _widen(np.asarray(buf).reshape(()))
            return np.broadcast_to(val, (1,) * rank) if mask is None else np.where(
                self.ev(mask, rvars), val, self.ev(other, rvars))
        if mask is None:
            plain = self.plain_view(buf, index, rvars, rank)
            if plain is not None:
                return _widen(plain)
        idxs = [self.ev(i, rvars) for i in index]
        if mask is not None:
            idxs = [np.clip(i, 0, max(d - 1, 0)) for i, d in zip(idxs, buf.shape)]
        try:
            val = _widen(buf[tuple(idxs)])
        except IndexError:   # grapec's loads stay inside (masked ones are clamped): the kernel was edited
            raise BundleError(f"a kernel reads input {slot} outside its shape {list(buf.shape)}: a malformed bundle") from None
        if mask is not None:
            if buf.size == 0:
                return np.broadcast_to(self.ev(other, rvars), val.shape)
            val = np.where(self.ev(mask, rvars), val, self.ev(other, rvars))
        return val

    def plain_view(self, buf, index, rvars, rank):
        """buf[index] where every index is a loop variable of its own axis (a weight read as it is
        stored, or transposed) or a constant inside the buffer (a batch of 1: lowering writes 0): a
        view of buf with its dims moved to those axes, instead of a gather that copies the whole
        tensor. None where the read is not of that form."""
        if len(index) != buf.ndim:
            return None
        fixed = [(d, int(e.value)) for d, e in enumerate(index) if e.op == "const"]
        if fixed:
            if any(not 0 <= c < buf.shape[d] for d, c in fixed):
                return None
            at = dict(fixed)
            buf = buf[tuple(at.get(d, slice(None)) for d in range(buf.ndim))]
            index = [e for e in index if e.op != "const"]
        axes = []
        for d, e in enumerate(index):
            if e.op == "idx":
                axis = e.args[0]
                start, stop = self.span(axis, self.kernel.shape[axis])
            elif e.op == "ridx" and e in rvars:
                axis, start, stop = self.rank0 + rvars.index(e), 0, e.args[1]
            else:
                return None
            if stop > buf.shape[d]:
                return None
            axes.append((axis, start, stop))
        if len({a for a, _, _ in axes}) != len(axes):
            return None
        view = buf[tuple(slice(lo, hi) for _, lo, hi in axes)]
        order = sorted(range(len(axes)), key=lambda d: axes[d][0])
        shape = [1] * rank
        for d in order:
            shape[axes[d][0]] = axes[d][2] - axes[d][1]
        return view.transpose(order).reshape(shape)

    def reduce(self, e, rvars, rank):
        rop, body, new = e.args
        inner = rvars + tuple(new)
        if rop == "sum" and body.op == "mul" and len(new) == 1 and new[0].args[1] > 0:
            dot = self.dot(body, inner, rank, new[0].args[1])
            if dot is not None:
                return dot
        b = self.ev(body, inner)
        sizes = tuple(r.args[1] for r in new)
        b = np.broadcast_to(b, b.shape[:rank] + sizes)
        axes = tuple(range(rank, rank + len(new)))
        dt = b.dtype
        if b.size == 0 or 0 in sizes:
            init = 0 if rop.startswith("arg") else reduction_identity(rop, dt)
            return np.full(b.shape[:rank], init, np.int64 if rop.startswith("arg") else dt)
        if rop == "sum":
            return np.sum(b, axis=axes, dtype=dt)
        if rop == "prod":
            return np.prod(b, axis=axes, dtype=dt)
        if rop == "max":
            return np.max(b, axis=axes)
        if rop == "min":
            return np.min(b, axis=axes)
        flat = b.reshape(b.shape[:rank] + (-1,))
        if rop in ("argmax", "argmin"):
            f = np.argmax if rop == "argmax" else np.argmin
            return f(flat, axis=-1).astype(np.int64)
        f = np.argmax if rop == "argmax_last" else np.argmin
        n = flat.shape[-1]
        return (n - 1 - f(flat[..., ::-1], axis=-1)).astype(np.int64)


    def dot(self, body, inner, rank, n):
        """sum over one variable of x * y (a gemv's or a small matmul's dot products) as one dot product
        per output, not the product materialized and then summed: GPT-2's fp32 calibration spent most
        of its time so. Written as a stack of (1 x n) @ (n x 1) matmuls, not np.vecdot or einsum: the
        same bits under numpy 1.26 (the Triton serving venv) and 2.x, so a served bundle answers as the
        local one does (vecdot is numpy 2 only; einsum sums in another order in each)."""
        x, y = (self.ev(a, inner) for a in body.args)
        if x.dtype != y.dtype or x.dtype.kind != "f" or x.ndim != rank + 1 or y.ndim != rank + 1:
            return None
        outer = np.broadcast_shapes(x.shape[:rank], y.shape[:rank])
        x, y = np.broadcast_to(x, outer + (n,)), np.broadcast_to(y, outer + (n,))
        return np.matmul(x[..., None, :], y[..., :, None])[..., 0, 0]


# A reduction is evaluated over whole arrays (output elements x reduced elements): beyond this many,
# it goes in slices of the first output axis longer than 1, so a kernel-IR matmul does not materialise
# M*N*K (nor a group norm's statistics, recomputed for each element, batch x channels x H x W x group).
CHUNK_ELEMENTS = 1 << 24


def run_kernel(kernel: Kernel, inputs: list, out: np.ndarray | None = None) -> np.ndarray:
    """Evaluate `kernel` on numpy `inputs` (one per slot); write into `out` when given."""
    if not isinstance(kernel, Kernel):   # the other kinds (ir/kinds.py) carry numpy semantics of their own
        return kernel.run(inputs, out)
    if out is None:
        out = np.empty(kernel.shape, dtypes.np_dtype(kernel.dtype))
    if kernel.size == 0:
        out[...] = 0
        return out
    volume = kernel.size * max([math.prod(r.args[1] for r in e.args[2]) for e in walk(kernel.body) if e.op == "reduce"],
                               default=1)
    axis = next((a for a, d in enumerate(kernel.shape) if d > 1), 0)
    rows = kernel.shape[axis] if kernel.shape else 1
    step = max(1, rows * CHUNK_ELEMENTS // volume) if volume > CHUNK_ELEMENTS else rows
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        ev = _Evaluator(kernel, inputs, (axis, start, stop) if step < rows else None)
        part = ev.ev(kernel.body, ())
        with np.errstate(over="ignore", invalid="ignore"):   # a store to float8 that overflows is NaN or inf by definition
            _store(out, part, kernel.shape, (axis, start, stop) if step < rows else None)
    return out


def _store(out: np.ndarray, part: np.ndarray, shape: tuple, rows: tuple | None):
    if rows is not None:
        axis, start, stop = rows
        at = (slice(None),) * axis + (slice(start, stop),)
        out[at] = np.broadcast_to(part, tuple(shape[:axis]) + (stop - start,) + tuple(shape[axis + 1:]))
    else:
        out[...] = np.broadcast_to(part, shape)


def eval_at_points(exprs, points: np.ndarray) -> list | None:
    """Index expressions (indices, constants and arithmetic) at each row of points ([P, rank] int64): an array of
    P values per expression, each what folding the expression at that point's constants gives (the same numpy
    operations); None where one reads memory or reduces. One pass for all points: composing a copy into an
    operand asks a few dozen points of every attention of every size a range compiles."""
    values: dict = {}
    for e in walk_all(exprs):
        if e.op == "idx":
            r = points[:, e.args[0]]
        elif e.op == "const":
            r = np.full(len(points), e.value, dtypes.np_dtype(e.dtype))
        elif e.op == "cast":
            with np.errstate(all="ignore"):
                r = values[e.args[0]].astype(dtypes.np_dtype(e.dtype))
        elif e.op in ALU:
            with np.errstate(all="ignore"):
                r = np.asarray(apply_op(e.op, [values[a] for a in e.args])).astype(dtypes.np_dtype(e.dtype))
        else:
            return None
        values[e] = r
    return [values[e] for e in exprs]


def walk_all(exprs) -> list:
    """Every distinct subexpression of exprs, children before parents."""
    seen, out = set(), []
    for x in exprs:
        for e in walk(x):
            if e not in seen:
                seen.add(e)
                out.append(e)
    return out


def loads_of(kernel: Kernel) -> set:
    """Slots the kernel actually reads."""
    return {e.args[0] for e in walk(kernel.body) if e.op == "load"}


def run_node(node, read, write, out_shape):
    """Execute one lowered node. read(name) -> array, write(name, array), out_shape(name) -> shape."""
    from .library import run_library
    if node.op == "Kernel":
        k = node.attrs["kernel"]
        write(node.outputs[0], run_kernel(k, [read(n) for n in node.inputs]))
    elif node.op == "Library":
        write(node.outputs[0], run_library(node.attrs, [read(n) if n else None for n in node.inputs]))
    elif node.op == "View":
        write(node.outputs[0], read(node.inputs[0]).reshape(out_shape(node.outputs[0])))
    else:  # If/Loop regions are never folded; plans run them (runtime/walker.py)
        raise ValueError(f"cannot execute node kind {node.op}")


def eval_nodes(nodes: list, graph, consts: dict) -> dict:
    """Run lowered nodes over a dict of arrays (constant folding); returns the dict, extended."""
    env = dict(consts)

    def read(name):
        if name in env:
            return env[name]
        v = graph.lookup(name)
        if v is None or v.const is None:
            raise KeyError(name)
        return v.const

    def write(name, arr):
        env[name] = arr

    def shape(name):
        return graph.lookup(name).shape

    for n in nodes:
        run_node(n, read, write, shape)
    return env
