"""Quantization: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear (kernel IR, elementwise
with per-tensor, per-axis or blocked scales), and the integer matmul/conv family (int32 kernel-IR
reductions, on both backends) with QLinearMatMul's and QLinearConv's requantization.

    QuantizeLinear         y = saturate(rint(x / scale) + zero_point)      (ties to even)
    DequantizeLinear       y = (x - zero_point) * scale
    DynamicQuantizeLinear  scale = (max(0, max x) - min(0, min x)) / 255,
                           zero_point = rint(clip(-min(0, min x) / scale, 0, 255)), y as QuantizeLinear (uint8)
    MatMulNBits            y = A @ W^T (+ bias), W[n, k] = (q[n, k] - zp[n, k // block]) * scale[n, k // block]
                           (onnxruntime's com.microsoft op: q packed `bits` to a byte, low bits first)
    GatherBlockQuantized   y[i.., k] = (q[idx[i..], k] - zp[idx, k // block]) * scale[idx, k // block] (the same packing)
"""
from __future__ import annotations

import math

from .. import dtypes
from ..ir import kernel as K
from ..ir.tensor import T, broadcast_index, cast, map_, norm_axis, reshape
from ..ir.tensor import reduce as tensor_reduce
from . import op
from .elementwise import SATURATING
from .elementwise import saturate as saturate_float
from .conv import conv_as_gemm
from .nn import demote_matmul_result, matmul_shape
from .window import _window_params

F32 = "float32"
QUANTIZED = ("uint8", "int8", "uint16", "int16", "int32", "uint32", "int4", "uint4", "int2", "uint2",
             "float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz", "float4e2m1")


def _param_at(p: T, x_shape: tuple, axis: int, block: int):
    """ix of x -> the scale/zero-point element for it: one for the tensor, one per index along axis,
    or (block_size > 0) one per block of `block` indices along axis."""
    if p.ndim == 0 or (p.size == 1 and not block):
        return lambda ix: p.at((0,) * p.ndim)
    axis = norm_axis(axis, len(x_shape))
    if block:
        return lambda ix: p.at(tuple(i // block if a == axis else i for a, i in enumerate(ix)))
    return lambda ix: p.at((ix[axis],))


def _quantize(v: K.Expr, zp: K.Expr | None, out_dt: str, saturate: bool = True) -> K.Expr:
    """Into out_dt, v in float32. Integers: saturate(rint(v) + zp). Floats (float8, float4): the
    cast's own round-to-nearest-even of v + zp, saturated unless `saturate` is off."""
    if dtypes.is_float(out_dt):
        q = v if zp is None else K.binary("add", v, K.cast(zp, F32))
        return K.cast(saturate_float(q, out_dt) if saturate and out_dt in SATURATING else q, out_dt)
    lo, hi = dtypes.int_range(out_dt)
    q = K.unary("round", v)
    if zp is not None:
        q = K.binary("add", q, K.cast(zp, F32))
    q = K.binary("min", K.binary("max", q, K.const(float(lo), F32)), K.const(float(hi), F32))
    return K.cast(q, out_dt)


def _axis_block(ctx, x: T):
    return int(ctx.attr("axis", 1)), int(ctx.attr("block_size", 0))


@op("QuantizeLinear")
def quantize_linear(ctx):
    x, scale, zp = ctx.input(0), ctx.input(1), ctx.input(2)
    out_dt = zp.dtype if zp is not None else (dtypes.from_onnx(ctx.attr("output_dtype")) if ctx.attr("output_dtype")
                                              else "uint8")
    if out_dt not in QUANTIZED:
        ctx.fail(f"quantizing to {out_dt} is not supported ({', '.join(QUANTIZED)})")
    axis, block = _axis_block(ctx, x)
    s_at = _param_at(scale, x.shape, axis, block)
    z_at = _param_at(zp, x.shape, axis, block) if zp is not None else None

    def fn(ix):
        v = K.binary("div", K.cast(x.at(ix), F32), K.cast(s_at(ix), F32))
        return _quantize(v, z_at(ix) if z_at else None, out_dt, bool(ctx.attr("saturate", 1)))
    return [T(x.shape, out_dt, fn)]


@op("DequantizeLinear")
def dequantize_linear(ctx):
    x, scale, zp = ctx.input(0), ctx.input(1), ctx.input(2)
    out_dt = dtypes.from_onnx(ctx.attr("output_dtype")) if ctx.attr("output_dtype") else scale.dtype
    axis, block = _axis_block(ctx, x)
    s_at = _param_at(scale, x.shape, axis, block)
    z_at = _param_at(zp, x.shape, axis, block) if zp is not None else None

    def fn(ix):
        v = K.cast(x.at(ix), F32)
        if z_at:
            v = K.binary("sub", v, K.cast(z_at(ix), F32))
        return K.cast(K.binary("mul", v, K.cast(s_at(ix), F32)), out_dt)
    return [T(x.shape, out_dt, fn)]


@op("DynamicQuantizeLinear")
def dynamic_quantize_linear(ctx):
    x = ctx.input(0)
    axes = list(range(x.ndim))
    zero = K.const(0.0, F32)
    lo = ctx.realize(tensor_reduce(cast(x, F32), axes, "min", False), "qmin")
    hi = ctx.realize(tensor_reduce(cast(x, F32), axes, "max", False), "qmax")
    scale = ctx.realize(map_(lambda a, b: K.binary("div", K.binary("sub", K.binary("max", b, zero), K.binary("min", a, zero)),
                                                   K.const(255.0, F32)), lo, hi), "scale")

    def zero_point(a, s):
        z = K.binary("sub", zero, K.binary("div", K.binary("min", a, zero), s))
        z = K.binary("min", K.binary("max", z, zero), K.const(255.0, F32))
        return K.cast(K.unary("round", z), "uint8")
    zp = ctx.realize(map_(zero_point, lo, scale, dtype="uint8"), "zero_point")
    y = T(x.shape, "uint8", lambda ix: _quantize(K.binary("div", K.cast(x.at(ix), F32), scale.at(())), zp.at(()), "uint8"))
    return [y, scale, zp]


def _zero_point_shift(t, zp, axis_len_shape):
    """t - zero_point in int32; zp is a scalar or a per-row/per-channel vector reshaped by the caller."""
    t32 = cast(t, "int32")
    if zp is None:
        return t32
    return map_(lambda a, z: K.binary("sub", a, z), t32, cast(reshape(zp, axis_len_shape), "int32"))


@op("MatMulInteger")
def matmul_integer(ctx):
    """(A - a_zero_point) @ (B - b_zero_point) in int32; a_zero_point may be per row of A (shape
    [M]), b_zero_point per column of B (shape [N])."""
    a, b = ctx.input(0), ctx.input(1)
    az, bz = ctx.input(2), ctx.input(3)
    a32 = _zero_point_shift(a, az, (az.size, 1) if az is not None and az.size > 1 else ())
    b32 = _zero_point_shift(b, bz, (bz.size,) if bz is not None and bz.size > 1 else ())
    return [integer_matmul(a32, b32, a.shape, b.shape)]


@op("QLinearMatMul")
def qlinear_matmul(ctx):
    """saturate(rint((A - a_zp) @ (B - b_zp) * (a_scale * b_scale / y_scale)) + y_zp), the integer
    matmul a Library node, the requantization one kernel (in float64, like the reference)."""
    a, a_s, a_z, b, b_s, b_z, y_s, y_z = (ctx.input(i) for i in range(8))
    row = lambda t: (t.size, 1) if t is not None and t.size > 1 else ()  # noqa: E731
    col = lambda t: (t.size,) if t is not None and t.size > 1 else ()  # noqa: E731
    a32, b32 = _zero_point_shift(a, a_z, row(a_z)), _zero_point_shift(b, b_z, col(b_z))
    if len(a.shape) == 1 or len(b.shape) == 1:
        ctx.fail("1-D operands are not supported")
    acc = integer_matmul(a32, b32, a.shape, b.shape)
    return [_requantize(acc, reshape(a_s, row(a_s)), reshape(b_s, col(b_s)), y_s, y_z, a.dtype)]


def integer_matmul(a32: T, b32: T, a_shape, b_shape) -> T:
    """numpy.matmul of int32 operands as a kernel-IR reduction, sum_k a[.., m, k] * b[.., k, n].
    cuBLASLt has no int32 x int32 GEMM, and a kernel runs on both backends and fuses with the
    zero-point shifts before it and the requantization after it."""
    a2, b2, out = matmul_shape(a_shape, b_shape)
    a, b = reshape(a32, a2), reshape(b32, b2)
    depth = a2[-1]

    def at(ix):
        r = K.ridx(depth)
        batch = ix[:-2]
        a_ix = broadcast_index(a2[:-2], batch) + (ix[-2], r)
        b_ix = broadcast_index(b2[:-2], batch) + (r, ix[-1])
        return K.reduce("sum", K.binary("mul", a.at(a_ix), b.at(b_ix)), (r,))
    return demote_matmul_result(T(out, "int32", at), a_shape, b_shape)


def _requantize(acc: T, a_s: T, b_s: T, y_s: T, y_z: T | None, in_dt: str) -> T:
    """saturate(rint(acc * (a_s * b_s / y_s)) + y_z), in float64 like the reference; a_s and b_s
    already shaped to broadcast against acc."""
    factor = map_(lambda x, y, z: K.cast(K.binary("div", K.binary("mul", x, y), z), "float64"),
                  a_s, b_s, reshape(y_s, ()))
    out_dt = y_z.dtype if y_z is not None else in_dt
    lo, hi = dtypes.int_range(out_dt)

    def requantize(c, f, *zp):
        v = K.binary("mul", K.cast(c, "float64"), f)
        if zp:
            v = K.binary("add", v, K.cast(zp[0], "float64"))
        v = K.binary("min", K.binary("max", K.unary("round", v), K.const(lo, "float64")), K.const(hi, "float64"))
        return K.cast(v, out_dt)
    return map_(requantize, acc, factor, *([reshape(y_z, ())] if y_z is not None else []))


@op("ConvInteger")
def conv_integer(ctx):
    """Conv of (x - x_zero_point) and (w - w_zero_point) in int32; w_zero_point may be per output
    channel."""
    return [_conv_int32(ctx, ctx.input(0), ctx.input(1), ctx.input(2), ctx.input(3))]


@op("QLinearConv")
def qlinear_conv(ctx):
    """requantize(ConvInteger(x, w) + bias): x_scale, w_scale (per output channel or one) and
    y_scale as in QLinearMatMul; the int32 bias is added before requantizing."""
    x, x_s, x_z, w, w_s, w_z, y_s, y_z = (ctx.input(i) for i in range(8))
    acc = _conv_int32(ctx, x, w, x_z, w_z)
    nd = x.ndim - 2
    if ctx.has(8):
        acc = map_(lambda a, b: K.binary("add", a, b), acc, reshape(cast(ctx.input(8), "int32"), (acc.shape[1],) + (1,) * nd))
    per_channel = (w_s.size,) + (1,) * nd if w_s.size > 1 else ()
    return [_requantize(acc, reshape(x_s, ()), reshape(w_s, per_channel), y_s, y_z, x.dtype)]


def _conv_int32(ctx, x, w, xz, wz) -> T:
    """The int32 convolution as Conv's im2col + GEMM, the GEMM an integer_matmul kernel."""
    nd = x.ndim - 2
    x32 = _zero_point_shift(x, xz, ())
    w32 = _zero_point_shift(w, wz, (wz.size,) + (1,) * (nd + 1) if wz is not None and wz.size > 1 else ())
    kernel = list(w.shape[2:])
    strides, dil, pads, ext = _window_params(ctx, x.shape[2:], kernel)
    group = int(ctx.attr("group", 1))
    out_sp = [(x.shape[2 + i] + pads[i] + pads[i + nd] - ext[i]) // strides[i] + 1 for i in range(nd)]
    return conv_as_gemm(ctx, x32, w32, None, strides, dil, pads, group, out_sp,
                        gemm=lambda wm, col: integer_matmul(wm, col, wm.shape, col.shape))




NBITS = (2, 4, 8)
NBITS_KERNEL_ROWS = 4   # up to this many rows, one kernel unpacks the codes as it reduces (a decode step)
PACKED_GEMM_ROWS = 16   # codegen/small_gemm.py MAX_ROWS: from 2 rows to this many, a small GEMM may unpack them


@op("com.microsoft:MatMulNBits")
def matmul_nbits(ctx):
    """onnxruntime's weight-only quantized MatMul (its quantizer's and model builder's int4/int8
    format). B is uint8 [N, blocks, block_size * bits / 8]: the K codes of output column n, `bits`
    each, packed into bytes low bits first, in blocks of block_size along K (the last block padded).
    Code q of block j stands for (q - zp[n, j]) * scale[n, j]. scales: [N * blocks] or [N, blocks].
    zero_points: absent (2^(bits-1)), uint8 packed like the codes with each row padded to whole bytes
    ([N * ceil(blocks * bits / 8)]), or floats like scales. bias: [N].
    The codes stay packed in the bundle. One row (and up to NBITS_KERNEL_ROWS where no small GEMM takes the
    weight): one kernel unpacks them as it reduces over K, in float32. More rows unpack the weight into A's type
    and multiply by GEMM; from 2 to PACKED_GEMM_ROWS rows of fp16 with 4-bit codes that GEMM is a small GEMM
    that unpacks the codes as it loads them (passes/small_gemm.py), with no unpacked weight in memory."""
    k_dim, n_dim = int(ctx.attr("K")), int(ctx.attr("N"))
    bits, block = int(ctx.attr("bits", 4)), int(ctx.attr("block_size"))
    if bits not in NBITS:
        ctx.fail(f"bits={bits} is not supported (supported: {', '.join(map(str, NBITS))})")
    _check_block(ctx, block)
    if ctx.has(4):
        ctx.fail("g_idx (input 4, act-order GPTQ) is not supported; re-export without it")
    a, b, scales = ctx.input(0), ctx.input(1), ctx.input(2)
    blocks = -(-k_dim // block)
    if a.shape[-1] != k_dim or tuple(b.shape) != (n_dim, blocks, block * bits // 8):
        ctx.fail(f"A is {list(a.shape)} and B {list(b.shape)}; K={k_dim}, N={n_dim}, bits={bits}, block_size={block} "
                 f"expect A [..., {k_dim}] and B [{n_dim}, {blocks}, {block * bits // 8}]")
    if scales.size != n_dim * blocks:
        ctx.fail(f"scales has {scales.size} elements; N x blocks = {n_dim * blocks}")
    scale = reshape(scales, (n_dim, blocks))
    codes = reshape(b, (n_dim, blocks * block * bits // 8))
    if ctx.value(1).const is not None:
        # constant [N, bytes] and [N, blocks] tables: a code's byte then sits at k // codes-per-byte and
        # its scale at k // block of the reduction variable itself, which codegen reads a vector step
        # at a time beside A's row (codegen/cuda.py divided_loads); through B's own [N, blocks, bytes]
        # shape each code's address was recomputed from its index and its byte loaded alone
        codes = ctx.constant(ctx.const(1).reshape(n_dim, -1), "nbits_codes")
        if scales.ndim == 1 and ctx.value(2).const is not None:
            scale = ctx.constant(ctx.const(2).reshape(n_dim, blocks), "nbits_scales")
    weight = _block_dequant(ctx, codes, scale, ctx.input(3), bits, block, n_dim, blocks)
    lead = tuple(a.shape[:-1])
    rows = math.prod(lead)
    packed = _packed_weight(ctx, bits, block, a.dtype) if 1 < rows <= PACKED_GEMM_ROWS and k_dim % 8 == 0 else None
    if rows > NBITS_KERNEL_ROWS or packed is not None:
        # many rows (a prompt, a batch of decode steps): the weight unpacked once into [N, K] of A's
        # type, then a GEMM (cuBLASLt on the GPU), as onnxruntime's CUDA kernel does past a few rows;
        # the reduction kernel below would unpack every code once per row
        w_nk = ctx.realize(T((n_dim, k_dim), a.dtype, lambda ix: K.cast(weight(ix[0], ix[1]), a.dtype)), "dequantized")
        if packed is not None:   # a few rows: passes/small_gemm.py unpacks the codes inside a small GEMM instead
            ctx.emitted[-1].attrs["packed_weight"] = packed
        y = ctx.library("matmul", [reshape(a, (rows, k_dim)), w_nk], {"trans_a": 0, "trans_b": 1}, (rows, n_dim), a.dtype)
        y = reshape(y, lead + (n_dim,))
    else:
        def fn(ix):
            n, k = ix[-1], K.ridx(k_dim)
            w = weight(n, k)
            x = K.cast(a.at(tuple(ix[:-1]) + (k,)), F32)
            return K.cast(K.reduce("sum", K.binary("mul", x, w), (k,)), a.dtype)
        y = T(lead + (n_dim,), a.dtype, fn)
    if ctx.has(5):
        bias = ctx.input(5)
        y = map_(lambda v, c: K.cast(K.binary("add", K.cast(v, F32), K.cast(c, F32)), a.dtype), y,
                 reshape(bias, (1,) * len(lead) + (n_dim,)))
    return [y]


def _packed_weight(ctx, bits: int, block: int, dtype: str) -> dict | None:
    """What a small GEMM needs to unpack this MatMulNBits' weight in its kernel (ir/small_gemm.py
    PackedWeight): constant 4-bit codes, constant scales of A's type (fp16: the kernel forms 1024 + code
    as a half), constant uint8 zero points or none; else None."""
    consts = [ctx.value(1).const, ctx.value(2).const]
    zp = ctx.value(3) if ctx.has(3) else None
    if bits != 4 or dtype != "float16" or any(c is None for c in consts) or ctx.value(2).dtype != dtype \
            or (zp is not None and (zp.const is None or zp.dtype != "uint8")):
        return None
    return {"bits": bits, "block": block, "codes": ctx.node.inputs[1], "scales": ctx.node.inputs[2],
            "zero_points": zp.name if zp is not None else ""}


def _code(packed: T, row, i, bits: int) -> K.Expr:
    """The i-th `bits`-bit code of `row` of packed ([rows, bytes] uint8, low bits first), as int32."""
    per_byte = 8 // bits
    byte = K.cast(packed.at((row, i // per_byte)), "int32")
    return K.binary("bitand", K.binary("shr", byte, K.cast((i % per_byte) * bits, "int32")), K.const((1 << bits) - 1, "int32"))


def _check_block(ctx, block: int):
    """onnxruntime's block-quantized ops (MatMulNBits, GatherBlockQuantized) take blocks of a power of
    two of at least 16, as their spec says; the unpacking kernels assume whole bytes per block."""
    if block < 16 or block & (block - 1):
        ctx.fail(f"block_size={block} is not supported: blocks are a power of two of at least 16 "
                 "(onnxruntime's contrib op spec; its quantizer and model builder write 16 to 256)")


def _block_dequant(ctx, codes: T, scale: T, zp: T | None, bits: int, block: int, rows: int, blocks: int):
    """(row, i) -> float32 (code - zero point) * scale of code i of `row`, for block-quantized rows:
    scale [rows, blocks]; zp absent (2^(bits-1)), uint8 packed like the codes (each row padded to
    whole bytes) or floats [rows * blocks]."""
    of_code = _dequantizer(ctx, scale, zp, bits, rows, blocks)
    return lambda r, i: of_code(r, _code(codes, r, i, bits), i // block)


def _dequantizer(ctx, scale: T, zp: T | None, bits: int, rows: int, blocks: int):
    """(row, code (int32), block j) -> float32 (code - zero point) * scale; zp as _block_dequant's."""
    if zp is None:
        zero = lambda r, j: K.const(float(1 << (bits - 1)), F32)  # noqa: E731
    elif zp.dtype == "uint8":
        row_bytes = -(-blocks * bits // 8)
        if zp.size != rows * row_bytes:
            ctx.fail(f"zero_points (uint8) has {zp.size} elements; rows x ceil(blocks x bits / 8) = {rows * row_bytes}")
        packed_zp = reshape(zp, (rows, row_bytes))
        zero = lambda r, j: K.cast(_code(packed_zp, r, j, bits), F32)  # noqa: E731
    else:
        if zp.size != rows * blocks:
            ctx.fail(f"zero_points has {zp.size} elements; rows x blocks = {rows * blocks}")
        zpf = reshape(zp, (rows, blocks))
        zero = lambda r, j: K.cast(zpf.at((r, j)), F32)  # noqa: E731
    return lambda r, code, j: K.binary("mul", K.binary("sub", K.cast(code, F32), zero(r, j)), K.cast(scale.at((r, j)), F32))


@op("com.microsoft:GatherBlockQuantized")
def gather_block_quantized(ctx):
    """Rows of a block-quantized table (onnxruntime-genai's int4 embeddings): data uint8 [N, K * bits / 8]
    packed as MatMulNBits packs, gathered along axis 0 by indices and unpacked along axis 1 in blocks of
    block_size; scales [N, blocks], zero_points as MatMulNBits'. Out: indices.shape + [K], scales' type."""
    data, idx, scales = ctx.input(0), ctx.input(1), ctx.input(2)
    bits, block = int(ctx.attr("bits", 4)), int(ctx.attr("block_size", 128))
    gather_axis, quantize_axis = int(ctx.attr("gather_axis", 0)), int(ctx.attr("quantize_axis", 1))
    if data.dtype != "uint8" or data.ndim != 2 or gather_axis != 0 or quantize_axis not in (1, -1):
        ctx.fail(f"data {data.dtype}{list(data.shape)} gathered on axis {gather_axis}, quantized on axis {quantize_axis}: "
                 "only a uint8 table [N, packed K] gathered on axis 0 and quantized on axis 1 is supported")
    if bits not in NBITS:
        ctx.fail(f"bits={bits} is not supported (supported: {', '.join(map(str, NBITS))})")
    _check_block(ctx, block)
    rows, k_dim = data.shape[0], data.shape[1] * 8 // bits
    blocks = -(-k_dim // block)
    if scales.size != rows * blocks:
        ctx.fail(f"scales has {scales.size} elements; N x blocks = {rows * blocks}")
    value = _block_dequant(ctx, data, reshape(scales, (rows, blocks)), ctx.input(3), bits, block, rows, blocks)
    zero_i64 = K.const(0, "int64")

    def fn(ix):
        r = K.cast(idx.at(tuple(ix[:-1])), "int64")
        r = K.where(K.binary("lt", r, zero_i64), K.binary("add", r, K.const(rows, "int64")), r)   # negative: from the end
        return K.cast(value(r, ix[-1]), scales.dtype)
    return [T(tuple(idx.shape) + (k_dim,), scales.dtype, fn)]
