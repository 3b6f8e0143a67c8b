"""Library-node semantics in numpy: the compute-bound work that the GPU hands to cuBLASLt. Constant
folding and the CPU backend run these; they are the reference the GPU path is checked against.

Each takes the node's attrs and its input arrays and returns the output array. The attrs are the
plan's contract with both backends, so they are documented here:

matmul(a, b, [c], [bias]):  act(alpha * op(a) @ op(b) + beta * c + bias), act none|relu|gelu|gelu_tanh;
                    op() transposes the last two dims when trans_a / trans_b; batch dims broadcast;
                    c has the output's shape (a residual), bias is a vector over the last dim (these
                    are cuBLASLt's C operand and BIAS epilogue; passes/epilogue.py fuses them in);
                    out_dtype "float32" (only with half a and b, no c, no bias): the result in float32.
conv(x, w, [bias]):   act(conv(x, w) + bias) in channels-last layout (cuDNN's NHWC on the GPU):
                    x [N, H, W, C], w [K, R, S, C/group], bias [K], out [N, OH, OW, K]; attrs
                    strides (2), dilations (2), pads (top, left, bottom, right), group, act none|relu.
                    One-dimensional convolutions come as H = R = 1 (ops/conv.py).
sdpa(q, k, v, [bias]): scaled dot-product attention, what cuDNN's SDPA computes (runtime/cuda/dnn.py):
                    per batch b and head h, softmax(scale * q kᵀ + bias) v, in float32, with the
                    probabilities rounded to the element type before the second product (flash
                    attention's contract, as ir/attention.py's kernel; a row masked everywhere
                    gives NaN). attrs: dims [B, H, S, T, D, DV]; scale; q, k, v, out: [offset,
                    [batch, head, row, column strides]] in elements into their buffers (q [B,H,S,D],
                    k [B,H,T,D], v [B,H,T,DV], out [B,H,S,DV]; passes/sdpa.py reads them out of
                    the fused projections and writes merged heads); bias (with a 4th operand):
                    [offset, [B|1, H|1, S, T], strides]; causal: key j hidden from query i where
                    j > i + T - S (cuDNN's causal band, bottom-right aligned); out_shape: the
                    output buffer, which the out view covers.
topk_values(x) / topk_indices(x): the k largest (largest=1) or smallest elements along `axis`,
                    sorted, ties to the lower index; indices are int64.
(Integer convolutions are im2col kernels + a kernel-IR reduction: ops/conv.py, ops/quant.py.)
"""
from __future__ import annotations

import math

import numpy as np

from .. import dtypes
from .alu import erf


def _act(y, act: str):
    if act in ("", "none", None):
        return y
    if act == "relu":
        return np.maximum(y, 0)
    if act == "gelu":
        return (0.5 * y * (1 + erf(y / np.sqrt(2).astype(y.dtype)))).astype(y.dtype)
    if act == "gelu_tanh":
        inner = np.sqrt(2 / np.pi).astype(y.dtype) * (y + np.asarray(0.044715, y.dtype) * y * y * y)
        return (0.5 * y * (1 + np.tanh(inner))).astype(y.dtype)
    raise ValueError(f"unknown activation {act}")


def _acc_dtype(dt):
    # fp16 inputs accumulate in fp32, like cuBLASLt's CUBLAS_COMPUTE_32F.
    return np.float32 if dt in (np.float16, dtypes.np_dtype("bfloat16")) else dt


def matmul(attrs, a, b, c=None, bias=None):
    out_dt = dtypes.np_dtype(attrs["out_dtype"]) if attrs.get("out_dtype") else a.dtype
    acc = _acc_dtype(a.dtype)
    a = a.astype(acc, copy=False)
    b = b.astype(acc, copy=False)
    if attrs.get("trans_a"):
        a = np.swapaxes(a, -1, -2)
    if attrs.get("trans_b"):
        b = np.swapaxes(b, -1, -2)
    y = np.matmul(a, b)
    alpha = attrs.get("alpha", 1.0)
    if alpha != 1.0:
        y = y * np.asarray(alpha, acc)
    if c is not None:
        beta = attrs.get("beta", 1.0)
        y = y + (c.astype(acc) * np.asarray(beta, acc) if beta != 1.0 else c.astype(acc))
    if bias is not None:
        y = y + bias.astype(acc)
    return _act(y, attrs.get("act", "")).astype(out_dt, copy=False)


def conv(attrs, x, w, bias=None, residual=None):
    out_dt = x.dtype
    acc = _acc_dtype(x.dtype)
    (sh, sw), (dh, dw), (pt, pl, pb, pr) = attrs["strides"], attrs["dilations"], attrs["pads"]
    group = attrs.get("group", 1)
    xp = np.pad(x.astype(acc), ((0, 0), (pt, pb), (pl, pr), (0, 0)))
    n, hp, wp, c = xp.shape
    k, r, s, cg = w.shape
    oh, ow = (hp - (r - 1) * dh - 1) // sh + 1, (wp - (s - 1) * dw - 1) // sw + 1
    st = xp.strides
    win = np.lib.stride_tricks.as_strided(xp, (n, oh, ow, r, s, c), (st[0], st[1] * sh, st[2] * sw, st[1] * dh, st[2] * dw, st[3]))
    wa = w.astype(acc)
    if group == 1:
        y = np.tensordot(win, wa, axes=([3, 4, 5], [1, 2, 3]))
    elif cg == 1:   # depthwise: one tap at a time over all channels (einsum copied the strided windows: 25 of a PicoDet's 86 s of calibration)
        mult = wa.reshape(group, k // group, r, s)
        y = np.zeros((n, oh, ow, group, k // group), acc)
        for i in range(r):
            for j in range(s):
                y += win[:, :, :, i, j, :, None] * mult[:, :, i, j]
        y = y.reshape(n, oh, ow, k)
    else:
        y = np.einsum("nhwrsgc,gkrsc->nhwgk", win.reshape(n, oh, ow, r, s, group, cg),
                      wa.reshape(group, k // group, r, s, cg), optimize=True).reshape(n, oh, ow, k)
    if bias is not None:
        y = y + bias.astype(acc)
    if residual is not None:   # [N, OH, OW, K], added before the activation (a ResNet block's shortcut)
        y = y + residual.astype(acc)
    return _act(y, attrs.get("act", "")).astype(out_dt, copy=False)


def sdpa(attrs, q, k, v, bias=None):
    bsz, heads, s, t, d, dv = attrs["dims"]
    dt = q.dtype

    def operand(buf, key, rows, cols):
        offset, strides = attrs[key]
        return strided(buf, offset, (bsz, heads, rows, cols), strides)
    qs = operand(q, "q", s, d).astype(np.float32)
    ks = operand(k, "k", t, d).astype(np.float32)
    vs = operand(v, "v", t, dv).astype(np.float32)
    x = (qs @ np.swapaxes(ks, -1, -2)) * np.float32(attrs.get("scale", 1.0))
    if bias is not None:
        offset, dims, strides = attrs["bias"]
        x = x + strided(bias, offset, dims, strides).astype(np.float32)
    if attrs.get("causal"):
        x = np.where(causal_band(s, t), x, np.float32(-np.inf))
    o = flash_softmax_product(x, vs, dt)
    out = np.zeros(attrs["out_shape"], dt)
    offset, strides = attrs["out"]
    strided(out, offset, (bsz, heads, s, dv), strides)[...] = o.astype(dt)
    return out


def causal_band(s: int, t: int) -> np.ndarray:
    """[S, T] bool: the keys query i sees under a causal mask aligned to the last key (j <= i + T - S)."""
    return np.arange(t)[None, :] <= np.arange(s)[:, None] + (t - s)


def flash_softmax_product(x: np.ndarray, v: np.ndarray, dtype) -> np.ndarray:
    """softmax(x) @ v over the last axis as flash attention computes it (float32 scores and v): the
    probabilities rounded to `dtype` before the product, divided by their unrounded sum after; a row
    masked everywhere gives 0 / 0 = NaN, as ONNX's Softmax of all -inf does."""
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        m = x.max(axis=-1, keepdims=True)
        p = np.exp(x - np.where(m == -np.inf, np.float32(0), m))
        return (p.astype(dtype).astype(np.float32) @ v) / p.sum(axis=-1, keepdims=True)


def topk(attrs, x, want: str):
    """want = 'values' | 'indices'. attrs: axis, k, largest, sorted."""
    axis, k = attrs["axis"], attrs["k"]
    key = -x if attrs.get("largest", 1) else x
    if x.dtype.kind == "u" and attrs.get("largest", 1):
        key = np.iinfo(x.dtype).max - x
    idx = np.argsort(key, axis=axis, kind="stable")
    idx = np.take(idx, np.arange(k), axis=axis)
    return idx.astype(np.int64) if want == "indices" else np.take_along_axis(x, idx, axis=axis)


LIBRARY = {
    "matmul": matmul,
    "conv": conv,
    "sdpa": sdpa,
    "topk_values": lambda attrs, x: topk(attrs, x, "values"),
    "topk_indices": lambda attrs, x: topk(attrs, x, "indices"),
}


def view_strides(view: list) -> tuple:
    """A view [offset, batch_stride, ld, shape] (passes/strided_operands.py) -> (offset, shape, element
    strides per dim): row r, column c of batch b at offset + b * batch_stride + r * ld + c."""
    offset, batch_stride, ld, shape = view
    strides = [0] * len(shape)
    strides[-1], strides[-2] = 1, ld
    s = batch_stride
    for i in range(len(shape) - 3, -1, -1):   # the batch dims, innermost first
        if shape[i] > 1:
            strides[i] = s
            s *= shape[i]
    return offset, tuple(shape), strides


def strided(buf: np.ndarray, offset: int, shape, strides) -> np.ndarray:
    """The elements of buf at offset + sum(index * stride), strides in elements, as an array view."""
    flat = buf.reshape(-1)
    return np.lib.stride_tricks.as_strided(flat[offset:], tuple(shape), [x * flat.itemsize for x in strides])


def view_array(buf: np.ndarray, view: list) -> np.ndarray:
    """A matmul operand seen through a view (view_strides)."""
    return strided(buf, *view_strides(view))


def run_library_into(attrs: dict, operands: list, out: np.ndarray):
    """Run a library node into its output buffer `out`, its operands (None where absent) and its
    output seen through the node's views (attrs["views"]: passes/strided_operands.py), as the CPU
    backend's step and the graph evaluator both run one."""
    views = attrs.get("views") or {}
    args = [None if a is None else view_array(a, views[str(i)]) if str(i) in views else a
            for i, a in enumerate(operands)]
    (view_array(out, views["out"]) if "out" in views else out)[...] = run_library(attrs, args)


def run_library(attrs: dict, arrays: list) -> np.ndarray:
    fn = LIBRARY.get(attrs["op"])
    if fn is None:
        raise ValueError(f"unknown library op {attrs['op']}")
    return fn({k: v for k, v in attrs.items() if k != "op"}, *arrays)


def flops(attrs: dict, in_shapes: list, out_shape) -> int:
    """Multiply-adds x2 of a library node, for reports and the cost model."""
    op = attrs["op"]
    if op == "matmul":
        ka = in_shapes[0][-2] if attrs.get("trans_a") else in_shapes[0][-1]
        return 2 * math.prod(out_shape) * ka
    if op == "conv":   # out [N, OH, OW, K], w [K, R, S, C/group]
        return 2 * math.prod(out_shape) * math.prod(in_shapes[1][1:])
    if op == "sdpa":
        bsz, heads, s, t, d, dv = attrs["dims"]
        return 2 * bsz * heads * s * t * (d + dv)
    return 0
