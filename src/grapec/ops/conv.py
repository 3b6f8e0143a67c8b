"""Convolutions as Library nodes: Conv as one channels-last `conv` node (cuDNN on the GPU) or as an
im2col gather + `matmul`; ConvTranspose as a `matmul` + col2im (ir/library.py has their semantics)."""
from __future__ import annotations

import math

import numpy as np

from .. import dtypes
from ..ir import kernel as K
from ..ir.tensor import T, map_, reshape, transpose, unravel
from . import op
from .window import _and, _ints, _masked_at, _window_params


@op("Conv")
def conv(ctx):
    x, w, b = ctx.input(0), ctx.input(1), ctx.input(2)
    nd = x.ndim - 2
    if nd < 1:
        ctx.fail(f"input of rank {x.ndim}: Conv needs N, C and at least one spatial dim")
    kernel = list(w.shape[2:])
    strides, dil, pads, ext = _window_params(ctx, x.shape[2:], kernel)
    group = int(ctx.attr("group", 1))
    if x.shape[1] != w.shape[1] * group:
        ctx.fail(f"{x.shape[1]} input channels do not match weight {list(w.shape)} with group={group}")
    out_sp = [(x.shape[2 + i] + pads[i] + pads[i + nd] - ext[i]) // strides[i] + 1 for i in range(nd)]
    grouped_taps = math.prod(kernel) if 1 < group < x.shape[1] else 0
    if conv_path(ctx, x.dtype, nd, grouped_taps, x.shape[1]) == "cudnn":
        return [conv_channels_last(ctx, x, w, b, strides, dil, pads, group, out_sp)]
    return [conv_as_gemm(ctx, x, w, b, strides, dil, pads, group, out_sp)]


CONV_PATHS = ("auto", "cudnn", "gemm")
CHANNELS_LAST_TYPES = ("float32", "float16", "bfloat16")
GROUPED_TAPS_GEMM = 32


def conv_path(ctx, dtype: str, nd: int, grouped_taps: int = 0, in_channels: int = 0) -> str:
    """"cudnn": one `conv` library node in channels-last layout (cuDNN on the GPU), or "gemm": the
    im2col gather + matmul. The compile option `conv` (CONV_PATHS) picks; auto takes cuDNN for every
    1-D and 2-D floating-point convolution: on an H100 it ran each of ResNet-50's convolutions faster
    than the gather + GEMM at batch 1, 8 and 32 (benchmarks/conv_layouts.py). Except a grouped
    (not depthwise) one of GROUPED_TAPS_GEMM taps or more (grouped_taps: the kernel's taps, 0 when
    not grouped): Wav2Vec2's positional convolution (768 channels in 16 groups, 128 taps, 49 steps)
    took 1.40 ms through cuDNN on an H100, fp16, and the whole model 0.57 ms the GEMM way. And one of a
    single input channel (raw audio, a grayscale image): its GEMM is K = taps deep, and the GEMM path
    writes NCHW, which the GroupNorm that audio front ends put after it reads along its rows; read
    channels-last, Wav2Vec2's took 46 us where 6 were estimated (H100, fp16, 1 s of audio)."""
    choice = ctx.options.get("conv", "auto")
    if choice == "gemm":
        return "gemm"
    why = f"{dtype} data" if dtype not in CHANNELS_LAST_TYPES else f"{nd}-D" if nd > 2 else None
    if why is None and choice == "auto" and grouped_taps >= GROUPED_TAPS_GEMM:
        why = f"grouped, {grouped_taps} taps"
    elif why is None and choice == "auto" and in_channels == 1:
        why = "one input channel"
    if why is None:
        return "cudnn"
    notes = ctx.options.get("notes")
    note = (f"Conv ({why}): an im2col gather + GEMM each, not the channels-last conv (1-D and 2-D, float32/16, "
            f"bfloat16; grouped ones under {GROUPED_TAPS_GEMM} taps; more than one input channel)")
    if notes is not None and note not in notes:
        notes.append(note)
    return "gemm"


def conv_channels_last(ctx, x, w, b, strides, dil, pads, group, out_sp):
    """Conv as the `conv` library node (ir/library.py) on channels-last views: x is read as
    [N, H, W, C] and the output written [N, OH, OW, K], then seen as NCHW again. The transposes are
    index remaps, so the kernel before (a ReLU, the previous block's add) writes channels-last
    directly and the one after reads it (passes/fuse.py). A constant weight is stored [K, R, S, C/g]."""
    n, m = x.shape[0], w.shape[0]
    one_d = len(out_sp) == 1
    if one_d:   # a 1-D convolution is a 2-D one of height 1
        x = reshape(x, (n, x.shape[1], 1, x.shape[2]))
        w_shape = (m, w.shape[1], 1, w.shape[2])
        strides, dil, pads, out_sp = [1, strides[0]], [1, dil[0]], [0, pads[0], 0, pads[1]], [1, out_sp[0]]
    else:
        w_shape = tuple(w.shape)
    weight = ctx.value(1).const
    if weight is not None:
        wt = ctx.constant(np.ascontiguousarray(np.asarray(weight).reshape(w_shape).transpose(0, 2, 3, 1)), "weight_krsc")
    else:
        wt = transpose(reshape(w, w_shape), (0, 2, 3, 1))
    attrs = {"strides": list(strides), "dilations": list(dil), "pads": list(pads), "group": group}
    y = ctx.library("conv", [transpose(x, (0, 2, 3, 1)), wt, b], attrs, (n, *out_sp, m), x.dtype)
    y = transpose(y, (0, 3, 1, 2))
    return reshape(y, (n, m, out_sp[1])) if one_d else y


def conv_as_gemm(ctx, x, w, b, strides, dil, pads, group, out_sp, gemm=None):
    """Conv as one batched GEMM over groups: W[g, M/g, C/g*K] @ col[g, C/g*K, N*OHW], where col
    is the im2col gather (a kernel with masked loads for the padding; skipped for a 1x1, stride-1,
    unpadded conv of one image, where col is x itself). The output layout [g, M/g, N*OHW] is
    NCHW for one image; otherwise a kernel reorders it, fused with the bias add. gemm(w, col) -> T
    replaces the library GEMM (integer convolutions: a kernel-IR reduction)."""
    n, c = x.shape[:2]
    m, kernel = w.shape[0], list(w.shape[2:])
    nd = len(kernel)
    kk, ohw = math.prod(kernel), math.prod(out_sp)
    cg, mg = c // group, m // group
    direct = n == 1 and all(k == 1 for k in kernel) and all(s == 1 for s in strides) and not any(pads)
    if direct:
        col = reshape(x, (group, cg, ohw))
    else:
        in_sp = x.shape[2:]

        def col_at(ix):
            g, r, q = ix
            ci, kidx = r // kk, r % kk
            img, p = q // ohw, q % ohw
            koff = unravel(kidx, kernel)
            ooff = unravel(p, out_sp)
            pos = [ooff[i] * strides[i] + koff[i] * dil[i] - pads[i] for i in range(nd)]
            valid = None
            for i in range(nd):
                if pads[i] or pads[i + nd] or (out_sp[i] - 1) * strides[i] + (kernel[i] - 1) * dil[i] >= in_sp[i]:
                    inside = _and(K.binary("ge", pos[i], K.const(0, "int64")), K.binary("lt", pos[i], K.const(in_sp[i], "int64")))
                    valid = inside if valid is None else _and(valid, inside)
            return _masked_at(x, (img, g * cg + ci, *pos), valid, K.const(0, x.dtype))
        col = T((group, cg * kk, n * ohw), x.dtype, col_at)
    w3 = reshape(w, (group, mg, cg * kk))
    y = gemm(w3, col) if gemm else ctx.library("matmul", [w3, col], {}, (group, mg, n * ohw), x.dtype)
    if n == 1:
        out = reshape(y, (1, m, *out_sp))
    else:
        out = transpose(reshape(y, (group, mg, n, *out_sp)), (2, 0, 1, *range(3, 3 + nd)))
        out = reshape(out, (n, m, *out_sp))
    if b is not None:
        out = map_(lambda v, bias: K.binary("add", v, bias), out, reshape(b, (1, m) + (1,) * nd))
    return out


@op("ConvTranspose")
def conv_transpose(ctx):
    """The adjoint of Conv. With output_shape (or auto_pad SAME_*: output = input * stride) the
    pads are derived from the total padding, the odd one at the end for SAME_UPPER and at the
    beginning otherwise (as onnx.reference and onnxruntime do)."""
    x, w, b = ctx.input(0), ctx.input(1), ctx.input(2)
    nd = x.ndim - 2
    in_sp = x.shape[2:]
    kernel = list(w.shape[2:])
    group = int(ctx.attr("group", 1))
    strides = _ints(ctx.attr("strides"), nd, 1)
    dil = _ints(ctx.attr("dilations"), nd, 1)
    outpad = _ints(ctx.attr("output_padding"), nd, 0)
    ext = [(kernel[i] - 1) * dil[i] + 1 for i in range(nd)]
    full = [strides[i] * (in_sp[i] - 1) + outpad[i] + ext[i] for i in range(nd)]
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    out_shape = ctx.attr("output_shape")
    if out_shape is None and ctx.attr("pads") is None and auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out_shape = [in_sp[i] * strides[i] for i in range(nd)]
    if out_shape is not None:
        out_shape = [int(d) for d in out_shape][-nd:]
        pads = [0] * (2 * nd)
        for i in range(nd):
            total = full[i] - out_shape[i]
            small = total // 2
            pads[i] = small if auto_pad == "SAME_UPPER" else total - small
            pads[i + nd] = total - pads[i]
    else:
        pads = _ints(ctx.attr("pads"), 2 * nd, 0) if auto_pad != "VALID" else [0] * (2 * nd)
    for i in range(nd):
        if pads[i + nd] < 0:  # output longer than the full result: zeros at the end
            outpad[i] -= pads[i + nd]
            pads[i + nd] = 0
        if pads[i] < 0:
            ctx.fail(f"output_shape {out_shape} needs negative begin padding")
    full = [strides[i] * (in_sp[i] - 1) + outpad[i] + ext[i] for i in range(nd)]
    out_sp = [full[i] - pads[i] - pads[i + nd] for i in range(nd)]
    if x.shape[1] != w.shape[0] or w.shape[0] % group:
        ctx.fail(f"{x.shape[1]} input channels do not match weight {list(w.shape)} with group={group}")
    return [conv_transpose_as_gemm(ctx, x, w, b, strides, dil, pads, group, out_sp)]


def conv_transpose_as_gemm(ctx, x, w, b, strides, dil, pads, group, out_sp):
    """ConvTranspose as one batched GEMM and a col2im gather (the GEMM of Conv's backward pass):
        col[g, m*K + k, n*IHW + i] = sum_c w[g*cg + c, m, k] * x[n, g*cg + c, i]     (w read transposed)
        y[n, g*mg + m, o] = sum over taps k of col[g, m*K + k, n*IHW + i]
    where input position i = (o + pad - k*dil) / stride along each spatial dim, a tap counting only
    where that divides exactly and lands inside the input. The tap sum is a kernel-IR reduction, in
    float32 for float16 data, with the bias added in the same kernel."""
    n, c = x.shape[:2]
    mg, kernel = w.shape[1], list(w.shape[2:])
    nd, in_sp = len(kernel), list(x.shape[2:])
    kk, ihw = math.prod(kernel), math.prod(in_sp)
    cg = c // group
    if n == 1:
        xg = reshape(x, (group, cg, ihw))
    else:
        xg = reshape(transpose(reshape(x, (n, group, cg, ihw)), (1, 2, 0, 3)), (group, cg, n * ihw))
    col = ctx.library("matmul", [reshape(w, (group, cg, mg * kk)), xg], {"trans_a": 1},
                      (group, mg * kk, n * ihw), x.dtype)
    acc = dtypes.accumulation(x.dtype)

    def out_at(ix):
        img, ch, o = ix[0], ix[1], ix[2:]
        g, m = ch // mg, ch % mg
        tap = K.ridx(kk)
        koff = unravel(tap, kernel)
        pos, valid = [], None
        for i in range(nd):
            t = o[i] + K.const(pads[i], "int64") - koff[i] * dil[i]
            p = t // strides[i] if strides[i] > 1 else t
            inside = _and(K.binary("ge", t, K.const(0, "int64")), K.binary("lt", p, K.const(in_sp[i], "int64")))
            if strides[i] > 1:
                inside = _and(inside, K.binary("eq", t % strides[i], K.const(0, "int64")))
            valid = _and(valid, inside)
            pos.append(p)
        flat = pos[0]
        for i in range(1, nd):
            flat = flat * in_sp[i] + pos[i]
        v = _masked_at(col, (g, m * kk + tap, img * ihw + flat), valid, K.const(0, x.dtype))
        total = K.reduce("sum", K.cast(v, acc), (tap,))
        if b is not None:
            total = K.binary("add", total, K.cast(b.at((ch,)), acc))
        return K.cast(total, x.dtype)
    return T((n, mg * group, *out_sp), x.dtype, out_at)
