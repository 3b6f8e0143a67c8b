"""Compute-bound ops as Library nodes (matmul, conv), plus pooling and the other NN ops.

MatMul/Gemm lower to one `matmul` Library node (transposes, alpha, beta*C folded in, as cuBLASLt
takes them); Conv to one `conv` node with explicit pads (auto_pad resolved here).
"""
from __future__ import annotations

from ..ir import kernel as K
from ..ir.tensor import broadcast_shapes, cast, expand, map_, reshape
from . import op


def matmul_shape(a_shape, b_shape):
    """numpy.matmul semantics, 1-D operands promoted and the added dims removed afterwards."""
    a2 = (1,) + tuple(a_shape) if len(a_shape) == 1 else tuple(a_shape)
    b2 = tuple(b_shape) + (1,) if len(b_shape) == 1 else tuple(b_shape)
    if a2[-1] != b2[-2]:
        raise ValueError(f"inner dims differ: {list(a_shape)} @ {list(b_shape)}")
    batch = broadcast_shapes(a2[:-2], b2[:-2], what="MatMul batch dims")
    return a2, b2, batch + (a2[-2], b2[-1])


@op("MatMul")
def matmul(ctx):
    a, b = ctx.input(0), ctx.input(1)
    a2, b2, out = matmul_shape(a.shape, b.shape)
    y = ctx.library("matmul", [reshape(a, a2), reshape(b, b2)], {}, out, a.dtype)
    final = list(out)
    if len(b.shape) == 1:
        final.pop(-1)
    if len(a.shape) == 1:
        final.pop(-2 if len(b.shape) != 1 else -1)
    return [reshape(y, final)]


@op("Gemm")
def gemm(ctx):
    a, b, c = ctx.input(0), ctx.input(1), ctx.input(2)
    ta, tb = ctx.attr("transA", 0), ctx.attr("transB", 0)
    m = a.shape[1] if ta else a.shape[0]
    n = b.shape[0] if tb else b.shape[1]
    attrs = {"trans_a": int(ta), "trans_b": int(tb), "alpha": float(ctx.attr("alpha", 1.0)),
             "beta": float(ctx.attr("beta", 1.0))}
    ins = [a, b]
    if c is not None and attrs["beta"] != 0.0:
        ins.append(expand(c, (m, n)) if c.shape != (m, n) else c)
    return [ctx.library("matmul", ins, attrs, (m, n), a.dtype)]
