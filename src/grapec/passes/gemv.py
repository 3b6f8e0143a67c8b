"""gemv: a matmul with a few rows against a weight matrix becomes a kernel, not a library call.

At batch 1 a decode step's GEMMs have M = 1: each reads its weight matrix once and does two flops per
byte. cuBLASLt's small-M kernels reach about a quarter of the DRAM bandwidth on such shapes (GPT-2's
768 x 2304 projection takes 4.5 us on an H100, where reading its 3.5 MB takes 1.3), and every call is
a child graph of its own. As a kernel-IR reduction the product is

    out[.., m, n] = sum_k A[.., m, k] * W'[n, k]        (accumulated in fp32 for fp16)

with W' the weight stored K-contiguous (transposed at compile time when the model stores it [K, N]),
so that codegen's warp mode (codegen/launch.py) gives each output a warp that reads its row of W'
in coalesced strides. Being a kernel, the product also fuses: the bias add, the activation and the
residual add that follow it become its epilogue, and a consumer that slices it (a Q/K/V split) reads
it directly.
"""
from __future__ import annotations

import math

import numpy as np

from .. import dtypes
from ..ir import kernel as K
from ..ir.derived import derived
from ..ir.graph import Graph, Node, view_source
from ..ir.tensor import broadcast_index
from .small_gemm import GEMV_OVER_SMALL_GEMM_BYTES, takes as small_gemm_takes

GEMV_MAX_ROWS = 4       # output rows (M times batch) up to which a matmul against a weight is a gemv
# A warp per output reads the weight row once per row of A: from L2 for a weight that stays there
# between the rows' reads, from DRAM for one that does not. On an H200, a Llama-1B decode step (MLP
# weights of 32-64 MiB, an LM head of 501 MiB) ran at batch 2 2.13 ms/token with the gemv and 3.71
# without, at batch 4 3.38 with it and 1.52 without (benchmarks/results/2026-11-26-h200-llm). A weight
# this large takes the gemv up to LARGE_WEIGHT_ROWS rows only; the bound is L2 (50-60 MiB) over the
# other traffic's share, not measured itself. (That was before fp16/bf16 few-row matmuls went to the
# small GEMM, below: the bound now holds for float32, and for half at one row.)
LARGE_WEIGHT_BYTES = 16 << 20
LARGE_WEIGHT_ROWS = 2
GEMV_MIN_DEPTH = 64     # shorter dot products stay with the library (a warp would idle)
GEMV_DTYPES = ("float16", "bfloat16", "float32")
# In fp16/bf16 a few-row matmul is a SmallGemmKernel (passes/small_gemm.py), but for one row against a weight
# of GEMV_OVER_SMALL_GEMM_BYTES or more, which this gemv reads faster. A norm before such a matmul (Llama's
# RMSNorm before its 12 MiB QKV projection) is then a kernel of its own, where the small GEMM would take it as
# its prologue. So up to GEMV_AFTER_FUSION_BYTES a one-row matmul whose A a kernel computes for it alone waits
# for the small_gemms pass: it takes the fused norm as the prologue, or leaves the matmul to gemvs_after_fusion.
# Past it the gemv's lead (32 MiB: 7.15 against 9.98 us) outgrows a norm's kernel (2.3 us on an H200 in
# Llama-1B's decode step, benchmarks/results/2026-11-26-h200-genai).
GEMV_AFTER_FUSION_BYTES = 16 << 20


def small_matmuls_as_kernels(g: Graph, small_gemms: bool = False) -> Graph:
    """small_gemms: the small_gemms pass runs after fusion (fusion "full"), and takes the half-precision
    matmuls it does better (GEMV_OVER_SMALL_GEMM_BYTES): those stay library calls for it."""
    source = view_source(g)
    readers = _readers(g, source)
    producers, consumers = g.producers(), g.consumers()
    out = []
    for node in g.nodes:
        if node.op == "Library" and node.attrs.get("op") == "matmul":
            prologue = small_gemms and _may_be_prologue(g, node.inputs[0], producers, consumers)
            kernel_node = _as_gemv(g, node, source, readers, small_gemms, prologue)
            if kernel_node is not None:
                out.append(kernel_node)
                continue
        out.append(node)
    g.nodes = out
    return g


def gemvs_after_fusion(g: Graph) -> Graph:
    """The one-row matmuls that waited for the small_gemms pass (GEMV_AFTER_FUSION_BYTES) and were left to
    cuBLASLt there, no prologue taken, against a weight the gemv reads faster: gemv kernels."""
    source = view_source(g)
    readers = _readers(g, source)
    out = []
    for node in g.nodes:
        if node.op == "Library" and node.attrs.get("op") == "matmul":
            w, y = g.lookup(source(node.inputs[1])), g.lookup(node.outputs[0])
            if w is not None and w.const is not None and w.const.nbytes >= GEMV_OVER_SMALL_GEMM_BYTES \
                    and math.prod(y.shape[:-1]) == 1:
                node = _as_gemv(g, node, source, readers, small_gemms=False) or node
        out.append(node)
    g.nodes = out
    return g


def _readers(g: Graph, source) -> dict:
    """How many nodes read each value, through its reshapes (a weight read by another node keeps its layout)."""
    readers: dict = {}
    for n in g.nodes:
        for i in set(n.inputs):
            readers[source(i)] = readers.get(source(i), 0) + 1
    return readers


def _may_be_prologue(g: Graph, a_name: str, producers, consumers) -> bool:
    """A is computed by a kernel that this matmul alone reads (through reshapes), no graph output: once fused
    (a norm, an input's cast), the small GEMM may take it as its prologue (passes/small_gemm.py _prologue)."""
    name = a_name
    while True:
        node = producers.get(name)
        if node is None or name in g.outputs:
            return False
        if node.op != "View":
            break
        name = node.inputs[0]
    while name != a_name:   # every value from the kernel's output to A has one reader, the next
        users = consumers.get(name, ())
        if len(users) != 1 or users[0].op != "View":
            return False
        name = users[0].outputs[0]
    return node.op == "Kernel" and len(consumers.get(a_name, ())) == 1


def _as_gemv(g: Graph, node: Node, source, readers, small_gemms: bool, prologue: bool = False):
    attrs = node.attrs
    if attrs.get("trans_a") or attrs.get("act") or attrs.get("views"):
        return None
    names = list(node.inputs) + [""] * (4 - len(node.inputs))
    a, b, c, bias = (g.lookup(n) if n else None for n in names)
    w = g.lookup(source(names[1]))
    y = g.lookup(node.outputs[0])
    if (w is None or w.const is None or y.dtype not in GEMV_DTYPES or a.dtype != y.dtype
            or math.prod(b.shape[:-2]) != 1 or len(b.shape) != 2):
        return None
    rows = math.prod(y.shape[:-1])
    n_out = y.shape[-1]
    depth = a.shape[-1]
    weight = np.asarray(w.const).reshape(b.shape)
    limit = LARGE_WEIGHT_ROWS if weight.nbytes > LARGE_WEIGHT_BYTES else GEMV_MAX_ROWS
    if rows > limit or depth < GEMV_MIN_DEPTH:
        return None
    bound = GEMV_AFTER_FUSION_BYTES if prologue else GEMV_OVER_SMALL_GEMM_BYTES - 1
    if small_gemms and small_gemm_takes(y.dtype, depth) and (rows > 1 or weight.nbytes <= bound):
        return None
    if not attrs.get("trans_b"):
        if readers.get(source(names[1]), 0) > 1:
            return None   # another reader wants the stored layout: keep one copy of the weight
        stored = weight
        weight = derived(f"nk{stored.shape}", (w.const,), lambda: np.ascontiguousarray(stored.T))
    wt = g.add_value("gemv_weight", y.dtype, weight.shape, weight)

    acc = dtypes.accumulation(y.dtype)
    out_rank = len(y.shape)
    r = K.ridx(depth)
    ix = [K.idx(i) for i in range(out_rank)]
    a_ix = broadcast_index(a.shape[:-1], ix[:-1]) + (r,)
    prod = K.cast(K.load(0, a_ix, a.dtype), acc) * K.cast(K.load(1, (ix[-1], r), y.dtype), acc)
    body = K.reduce("sum", prod, (r,))
    alpha = float(attrs.get("alpha", 1.0))
    if alpha != 1.0:
        body = body * K.const(alpha, acc)
    inputs = [(tuple(a.shape), a.dtype), (tuple(weight.shape), y.dtype)]
    slots = [names[0], wt.name]
    if c is not None:
        beta = float(attrs.get("beta", 1.0))
        term = K.cast(K.load(len(slots), broadcast_index(c.shape, ix), c.dtype), acc)
        body = body + (term * K.const(beta, acc) if beta != 1.0 else term)
        inputs.append((tuple(c.shape), c.dtype))
        slots.append(names[2])
    if bias is not None:
        body = body + K.cast(K.load(len(slots), (ix[-1],), bias.dtype), acc)
        inputs.append((tuple(bias.shape), bias.dtype))
        slots.append(names[3])
    kernel = K.Kernel(tuple(y.shape), y.dtype, K.cast(body, y.dtype), tuple(inputs))
    return Node("Kernel", slots, list(node.outputs), name=node.name, attrs={"kernel": kernel},
                origin=list(node.origin))
