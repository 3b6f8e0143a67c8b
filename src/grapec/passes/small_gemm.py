"""small_gemms: a matmul of a few rows against a constant weight becomes a SmallGemmKernel, with the
kernel that produced its A (a LayerNorm) as its prologue and its cuBLASLt epilogue (bias,
activation, residual) as its epilogue (ir/small_gemm.py says why).

Runs after fusion and fused attention, so A's producer is one fused kernel and the epilogue is
already folded into the matmul's attributes. Conditions (anything else stays with cuBLASLt):
  * fp16/bf16, no transposed A, no strided operand (views) but an A read in row-major order from its
    buffer's start, a constant 2-D weight;
  * M (the rows of A, batch dims flattened) at most 16 (with a prologue) or, for sm_90+, at most 128
    (the split form, A read as it lies), K a multiple of 8;
  * a weight stored [K, N] is transposed into a copy, so its only reader must be this matmul.
The producer becomes the prologue when this matmul (through Views) is its only reader, it is not a
graph output, it is a kernel-IR kernel of A's dtype and shape, its reductions are all row
reductions over at most K elements (each block recomputes the rows, so they must be cheap), and
A's rows fit in shared memory (codegen/small_gemm.py).
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from ..ir import kernel as K
from ..ir.graph import Graph, Node, view_chain, view_source
from ..cost.device import DeviceProfile
from ..cost.model import price_small_gemm
from ..ir.small_gemm import KIND as SMALL_GEMM, PackedWeight, SmallGemmKernel
from ..codegen.launch import row_reductions, extent
from ..codegen.small_gemm import MAX_ROWS, SMEM_BYTES, fits_split, fits_staged_split, small_gemm_tiling, staged_bytes

DTYPES = ("float16", "bfloat16")
# A SmallGemmKernel against passes/gemv.py's gemv kernel, measured on an H200, one MatMul alone, node gap
# included (benchmarks/results/2026-11-27-h200-gemv-vs-small-gemm): the gemv is faster only at one row against
# a large weight -- 12 MiB (3072x2048) 4.10 vs 4.34 us, 32 MiB (8192x2048) 7.15 vs 9.98, Llama's 501 MiB LM
# head 116 vs 120 -- and slower at every weight up to 8 MiB (GPT-2's 3.4 MiB QKV 3.15 vs 1.77 us, 4.5 MiB FC
# 4.09 vs 1.81) and at 2-4 rows (16384x2048 at 2 rows: 31.6 vs 17.2).
GEMV_OVER_SMALL_GEMM_BYTES = 10 << 20
# Half weights from this size take the staged split form at 2-16 rows where A is read as it lies. Llama-1B fp16
# (H200, benchmarks/results/2026-11-29-h200-s62 call 2): batch 4 1.629 -> 1.344 ms/token, batch 16 2.228 -> 1.782.
# Below it, A read again for every 8 columns is a few KB, and a cluster kernel cannot join a grid stitch.
STAGED_SPLIT_MIN_BYTES = 1 << 20


def takes(dtype: str, depth: int) -> bool:
    """Can a matmul of this type and depth K be a SmallGemmKernel (rows and weight aside)? Half types,
    and K a whole number of 16-byte vectors (A's and W's rows are read as such)."""
    return dtype in DTYPES and depth % 8 == 0


def small_gemms(g: Graph, profile: DeviceProfile | None = None, split: bool = False) -> Graph:
    """profile: price each candidate against its alternatives (cost/model.py price_small_gemm) and
    keep the cheapest; without one (or one with no small_gemm coefficients) every candidate is taken.
    split: the targets have sm_90's thread-block clusters, so GEMMs of MAX_ROWS+1 .. MAX_SPLIT_ROWS rows
    are candidates too (the split form), where the profile prices them (never unpriced)."""
    source = view_source(g)
    producers = g.producers()
    consumers = g.consumers()
    removed: set = set()
    out = []
    for node in g.nodes:
        if node.op == "Library" and node.attrs.get("op") == "matmul":
            made = _as_small_gemm(g, node, source, producers, consumers, profile, split)
            if made is not None:
                kernel_node, dropped = made
                removed.update(id(n) for n in dropped)
                out.append(kernel_node)
                continue
        out.append(node)
    g.nodes = [n for n in out if id(n) not in removed]
    return g


def _as_small_gemm(g: Graph, node: Node, source, producers, consumers, profile, split: bool):
    attrs = node.attrs
    views = attrs.get("views") or {}
    if attrs.get("trans_a") or set(views) - {"0"}:
        return None
    names = list(node.inputs) + [""] * (4 - len(node.inputs))
    a, b, c, bias = (g.lookup(n) if n else None for n in names)
    w = g.lookup(source(names[1]))
    y = g.lookup(node.outputs[0])
    unpack = _unpacking(g, node, names[1], producers, consumers)
    if (w is None or (w.const is None and unpack is None) or y.dtype not in DTYPES or a.dtype != y.dtype
            or b.dtype != y.dtype or len(b.shape) != 2):
        return None
    rows, cols = math.prod(y.shape[:-1]), y.shape[-1]
    depth = views["0"][3][-1] if views else a.shape[-1]
    if views and not plain_view(views["0"], rows, depth):
        return None
    priced = profile is not None and bool(profile.coefficients.get(SMALL_GEMM))
    clusters = split
    # the split form only where the cost model weighs it against cuBLASLt: on an H100 it lost at every shape
    # measured (benchmarks/results/2026-11-26-h100-split-gemm), so it is never taken unpriced
    split = split and priced
    if not takes(y.dtype, depth) or math.prod(a.shape) != rows * depth or not (1 <= rows <= MAX_ROWS or split and fits_split(rows, depth)):
        return None
    if unpack is not None:
        return _packed_small_gemm(g, node, names, y, rows, cols, depth, c, bias, unpack, source, producers, consumers,
                                  clusters)
    transposed = not attrs.get("trans_b")
    if transposed and (len(consumers.get(w.name, ())) > 1 or w.name in g.outputs):
        return None   # another reader wants the stored layout: keep one copy of the weight

    prologue, a_names, dropped = _prologue(g, names[0], rows, depth, source, producers, consumers)
    if prologue is None and _gemv_reads_faster(w, rows):
        return None
    extras, epilogue = _epilogue(g, attrs, y, rows, cols, c, bias, names)
    slot_of = lambda n: (tuple(g.lookup(n).shape), g.lookup(n).dtype)  # noqa: E731
    inputs = tuple(map(slot_of, a_names)) + (((cols, depth) if transposed else tuple(w.shape), y.dtype),) \
        + tuple(map(slot_of, extras))
    kernel = SmallGemmKernel(tuple(y.shape), y.dtype, inputs, rows, cols, depth, prologue, epilogue)
    if priced:
        plan = price_small_gemm(kernel, profile)[0][0]
        if plan == "cuBLASLt" or plan == "kernel" and _gemv_reads_faster(w, rows):
            return None
        if plan == "kernel" and prologue is not None:
            kernel = replace(kernel.without_prologue(), inputs=(slot_of(names[0]),) + inputs[len(a_names):])
            a_names, dropped = [names[0]], []
    if (kernel.prologue is None and rows >= 2 and clusters and w.const.nbytes >= STAGED_SPLIT_MIN_BYTES
            and fits_staged_split(rows, depth, packed=False)):
        # A read as it lies: the staged split form shares its rows among a block's 64 columns (the one-tile
        # form reads them again for every 8 columns; int4 at 16 rows ran 5x faster so, session 61)
        kernel = replace(kernel, split=True)
    w_name = w.name
    if transposed:   # only now that the kernel is taken: the copy of a large weight is not free
        weight = np.asarray(w.const).reshape(b.shape)
        w_name = g.add_value("small_gemm_weight", y.dtype, (cols, depth), np.ascontiguousarray(weight.T)).name
    slots = a_names + [w_name] + extras
    origin = [o for d in dropped for o in d.origin] + list(node.origin)
    return Node("Kernel", slots, list(node.outputs), name=node.name, attrs={"kernel": kernel},
                origin=list(dict.fromkeys(origin))), dropped


def _unpacking(g: Graph, node: Node, b_name: str, producers, consumers):
    """-> (the nodes that unpack B, PackedWeight, [codes, scales, zero points or None] as the kernel reads
    them) where B is a MatMulNBits weight unpacked into A's type for this matmul alone (ops/quant.py tags
    that kernel "packed_weight"), the matmul reading it as [N, K] (trans_b); else None."""
    chain = view_chain(b_name, producers)
    dq = producers.get(chain[-1].inputs[0] if chain else b_name)
    tag = dq.attrs.get("packed_weight") if dq is not None and dq.op == "Kernel" else None
    if tag is None or not node.attrs.get("trans_b") or any(
            len(consumers.get(v, ())) != 1 or v in g.outputs for v in [dq.outputs[0]] + [n.outputs[0] for n in chain]):
        return None
    values = [g.lookup(tag["codes"]), g.lookup(tag["scales"])] + ([g.lookup(tag["zero_points"])] if tag["zero_points"] else [])
    if any(v is None or v.const is None for v in values):
        return None
    n, depth = g.lookup(dq.outputs[0]).shape
    blocks = -(-depth // tag["block"])
    # MatMulNBits' own bytes: the same as the unpacking GEMV's (one row) read, so the bundle stores them once
    codes = np.ascontiguousarray(np.asarray(values[0].const).reshape(n, -1))
    scales = np.ascontiguousarray(np.asarray(values[1].const).reshape(n, blocks))
    zp = np.ascontiguousarray(np.asarray(values[2].const).reshape(n, -1)) if len(values) == 3 else None
    return [dq] + chain, PackedWeight(tag["bits"], tag["block"], zp is not None), [codes, scales, zp]


def _packed_small_gemm(g: Graph, node: Node, names: list, y, rows: int, cols: int, depth: int, c, bias, unpack,
                       source, producers, consumers, clusters: bool):
    """The small GEMM that unpacks a MatMulNBits weight's codes as it loads them: no [N, K] half weight written
    and read at every step (ops/quant.py's form past a few rows). Taken unpriced: the cost model has no price for
    the unpacking kernel it replaces, which moves four times the codes' bytes twice. Without a prologue, and
    where the targets have clusters, in the split form (codegen/small_gemm.py is_split): the one-tile form read
    A again for every 8 columns, and a Llama-1B int4 down projection at 16 rows took 62.9 us for 8 MiB of codes
    (H200, benchmarks/results/2026-11-29-h200-s61)."""
    if rows > MAX_ROWS:   # the split form takes no packed weight
        return None
    unpackers, packed, (codes, scales, zp) = unpack
    split = clusters and fits_staged_split(rows, depth, packed=True)
    if split and _one_tile_walks(rows, cols, depth, y.dtype, packed):
        # A's producer stays its own kernel, so that the split form reads A as it lies
        prologue, a_names, dropped = None, [names[0]], []
    else:
        prologue, a_names, dropped = _prologue(g, names[0], rows, depth, source, producers, consumers)
    extras, epilogue = _epilogue(g, node.attrs, y, rows, cols, c, bias, names)
    w_values = [g.add_value("small_gemm_codes", "uint8", codes.shape, codes),
                g.add_value("small_gemm_scales", y.dtype, scales.shape, scales)]
    if zp is not None:
        w_values.append(g.add_value("small_gemm_zero_points", "uint8", zp.shape, zp))
    slot_of = lambda n: (tuple(g.lookup(n).shape), g.lookup(n).dtype)  # noqa: E731
    inputs = tuple(map(slot_of, a_names)) + tuple((tuple(v.shape), v.dtype) for v in w_values) + tuple(map(slot_of, extras))
    kernel = SmallGemmKernel(tuple(y.shape), y.dtype, inputs, rows, cols, depth, prologue, epilogue, packed,
                             split and prologue is None)
    slots = a_names + [v.name for v in w_values] + extras
    dropped = dropped + unpackers
    origin = [o for d in dropped for o in d.origin] + list(node.origin)
    return Node("Kernel", slots, list(node.outputs), name=node.name, attrs={"kernel": kernel},
                origin=list(dict.fromkeys(origin))), dropped


def _one_tile_walks(rows: int, cols: int, depth: int, dtype: str, packed: PackedWeight) -> bool:
    """Does the one-tile form (the only one that takes a prologue) walk its column tiles in a grid loop? Each
    turn then waits on one tile's codes, too few bytes in flight: Llama-1B's int4 LM head (128256 columns)
    took 113 us at 4 rows with the final norm as its prologue, 1.2 TB/s (H200, session 61), and 67.4 us in the
    split form with the norm as a kernel before it (session 62, call 3: batch 4 1.166 -> 1.133 ms/token). Half
    weights keep their prologue: the same rule made Llama fp16 batch 4 slower (1.342 -> 1.483), its gate/up GEMM
    at 4 rows taking 26.7 us in the split form."""
    t = small_gemm_tiling(SmallGemmKernel((rows, cols), dtype, (), rows, cols, depth, None, None, packed))
    return t.block_tiles > t.grid


def _gemv_reads_faster(w, rows: int) -> bool:
    """One row against a weight `w` the gemv reads faster (GEMV_OVER_SMALL_GEMM_BYTES): without a prologue the
    matmul is left for passes/gemv.py gemvs_after_fusion."""
    return rows == 1 and w.const.nbytes >= GEMV_OVER_SMALL_GEMM_BYTES


def plain_view(view: list, rows: int, depth: int) -> bool:
    """A's view (passes/strided_operands.py: offset, batch stride, ld, shape) reads the first rows x depth
    elements of its buffer in row-major order, as the kernel reads A: the heads of one query's attention
    output merged (a transpose of a single row, which moves nothing)."""
    offset, batch_stride, ld, shape = view
    r, c = shape[-2], shape[-1]
    batch = math.prod(shape[:-2])
    return (offset == 0 and c == depth and batch * r == rows and (r == 1 or ld == c)
            and (batch == 1 or batch_stride == r * c))


def _prologue(g: Graph, a_name: str, rows: int, depth: int, source, producers, consumers):
    """-> (prologue Kernel or None, the slots that feed A, the nodes it replaces)."""
    if rows > MAX_ROWS or staged_bytes(rows, depth) > SMEM_BYTES:   # the split form reads A as it lies
        return None, [a_name], []
    src = source(a_name)
    prod = producers.get(src)
    chain = view_chain(a_name, producers)
    if prod is None or prod.op != "Kernel" or not isinstance(prod.attrs["kernel"], K.Kernel) or src in g.outputs:
        return None, [a_name], []
    k = prod.attrs["kernel"]
    a = g.lookup(a_name)
    if k.dtype != a.dtype or math.prod(k.shape) != rows * depth or k.shape[-1] != depth:
        return None, [a_name], []
    # nothing but the View chain to this matmul reads the producer's value, nor any value on the chain
    for name in [src] + [v.outputs[0] for v in chain]:
        users = consumers.get(name, ())
        if len(users) != 1 or name in g.outputs:
            return None, [a_name], []
    reductions = [e for e in K.walk(k.body) if e.op == "reduce"]
    row_level = row_reductions(k.body)
    if len(reductions) != len(row_level) or any(extent(r.args[2]) > depth for r in reductions):
        return None, [a_name], []
    last = len(k.shape) - 1
    if any(v.op == "idx" and v.args[0] == last for r in reductions for v in K.free_vars(r)):
        return None, [a_name], []   # a reduction per column: not a row's
    return k, list(prod.inputs), [prod] + chain


def _epilogue(g: Graph, attrs: dict, y, rows: int, cols: int, c, bias, names):
    """-> (extra slot names, epilogue Kernel over [rows, cols]): act(alpha * s + beta * c + bias)."""
    i, j = K.idx(0), K.idx(1)
    body = K.load(0, (i, j), "float32")
    alpha = float(attrs.get("alpha", 1.0))
    if alpha != 1.0:
        body = body * K.const(alpha, "float32")
    inputs, extras = [((rows, cols), "float32")], []
    if c is not None:
        beta = float(attrs.get("beta", 1.0))
        term = K.cast(K.load(len(inputs), (i, j), c.dtype), "float32")
        body = body + (term * K.const(beta, "float32") if beta != 1.0 else term)
        inputs.append(((rows, cols), c.dtype))
        extras.append(names[2])
    if bias is not None:
        body = body + K.cast(K.load(len(inputs), (j,), bias.dtype), "float32")
        inputs.append(((cols,), bias.dtype))
        extras.append(names[3])
    body = _activation(body, attrs.get("act") or "none")
    return extras, K.Kernel((rows, cols), y.dtype, K.cast(body, y.dtype), tuple(inputs))


def _activation(x: K.Expr, act: str) -> K.Expr:
    """ir/library.py's activations, in kernel IR (float32)."""
    f = "float32"
    if act == "none":
        return x
    if act == "relu":
        return K.binary("max", x, K.const(0.0, f))
    if act == "gelu":
        return K.const(0.5, f) * x * (K.const(1.0, f) + K.unary("erf", x * K.const(float(1 / np.sqrt(2)), f)))
    if act == "gelu_tanh":
        inner = K.const(float(np.sqrt(2 / np.pi)), f) * (x + K.const(0.044715, f) * x * x * x)
        return K.const(0.5, f) * x * (K.const(1.0, f) + K.unary("tanh", inner))
    raise ValueError(f"unknown activation {act}")
