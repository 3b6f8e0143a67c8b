"""What a kernel asks of the GPU: the counts the cost model prices (cost/model.py).

Each record holds physical quantities of one graph node, derived from the IR alone (no GPU needed):
bytes that must come from DRAM, bytes re-read from cache, arithmetic, the longest serial loop a
thread runs, how many dependent memory round trips and block-wide reductions stand between its
launch and its last store, and how many SMs its grid can occupy.

    kernel_work(kernel, launch)      a generated kernel in its thread mapping (codegen/launch.py)
    attention_work(kernel)           a fused attention kernel (ir/attention.py)
    small_gemm_work(kernel)          a few-row GEMM kernel with its prologue (ir/small_gemm.py)
    gemm_work(m, n, k, batch, ...)   a cuBLASLt matmul, as cuBLASLt tiles it at small M
    sdpa_work(attrs, dtype)          cuDNN's fused attention (an `sdpa` library step)
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from .. import dtypes
from ..codegen.vectors import vector_loads
from ..codegen.launch import Launch, plan_launch, row_reductions
from ..codegen.resident import resident_row, row_function_launch
from ..ir import kernel as K
from ..ir.attention import KIND as ATTENTION
from ..ir.kinds import kernel_from_json
from ..ir.selection import NmsKernel, NmsMaskKernel, NonZeroKernel, TopKKernel
from ..ir.small_gemm import KIND as SMALL_GEMM
from ..plan import KernelStep, LibraryStep

THREADS_PER_SM = 2048
BLOCKS_PER_SM = 32
ARITH = K.ELEMENTWISE | {"cast"}
TRANSCENDENTAL = {"exp", "log", "sqrt", "sin", "cos", "tan", "tanh", "erf", "pow", "sigmoid", "div",
                  "reciprocal", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "atan2"}
SELECTION = "selection"
SELECTION_KINDS = (NonZeroKernel.kind, NmsKernel.kind, NmsMaskKernel.kind, TopKKernel.kind)
GEMM_TILE_M, GEMM_TILE_N, GEMM_TILE_K = 64, 128, 64   # a typical cuBLASLt tile at small M (fp16, sm_90)


@dataclass(frozen=True)
class Work:
    """One graph node's demands. `kind` picks the coefficients it is priced with."""
    kind: str              # kernel | attention | small_gemm | gemm | sdpa | selection
    dram_mb: float         # unique bytes read + bytes written, MB
    cache_mb: float        # bytes read again (from L1/L2), MB
    gflop: float           # arithmetic, 1e9 operations (transcendentals count 4)
    serial: float          # the longest chain of loop iterations one thread (warp) runs, per wave
    phases: int            # dependent memory round trips (a reduction's result before its readers)
    block_syncs: int       # block-wide reductions (shared memory and barriers)
    warp_syncs: int        # warp-shuffle reductions
    blocks: int            # blocks (tiles) in the grid
    block: int             # threads per block
    mapping: str = ""      # the thread mapping (launch mode), for reports
    aligned: bool = True   # gemm: every operand's rows start 16-byte aligned (else cuBLASLt's slow path)
    vectorized: bool = False   # its row loops load 16 bytes a lane, later loads in flight (warp mode, rows read in order)

    def waves(self, sms: int) -> int:
        per_sm = max(1, min(BLOCKS_PER_SM, THREADS_PER_SM // max(self.block, 1)))
        return max(1, math.ceil(self.blocks / (sms * per_sm)))

    def active(self, sms: int) -> float:
        """The fraction of SMs the grid keeps busy: bandwidth and arithmetic scale with it."""
        return min(1.0, max(self.blocks, 1) / sms)


def kernel_work(kernel: K.Kernel, launch: Launch) -> Work:
    memo: dict = {}
    size = max(kernel.size, 1)
    rowwise = launch.mode in ("row", "warp")
    row_level = set(row_reductions(kernel.body, memo)) if rowwise else set()
    reads: Counter = Counter()
    ops = [0.0]
    serial = [0.0]
    lanes = 32 if launch.mode == "warp" else launch.block

    def scope(root: K.Expr, executions: float, per_thread: float):
        """Loads and arithmetic of one loop body (reductions nested in it are scopes of their own)."""
        loads, reduces, arith = _scope_nodes(root)
        for ld in loads:
            reads[ld.args[0]] += executions
        ops[0] += executions * arith
        serial[0] += per_thread
        for r in reduces:
            n = _extent(r)
            if r in row_level:   # the whole block (warp) strides over it, once per row
                scope(r.args[1], launch.rows * n, math.ceil(n / lanes))
            else:
                scope(r.args[1], executions * n, per_thread * n)

    if rowwise:
        scope(kernel.body, size, math.ceil(launch.cols / lanes))
    else:
        scope(kernel.body, size, 1)
    unique = cached = 0.0
    for slot, n in reads.items():
        shape, dt = kernel.inputs[slot]
        numel = math.prod(shape)
        unique += min(n, numel) * dtypes.itemsize(dt)
        cached += max(0.0, n - numel) * dtypes.itemsize(dt)
    written = size * dtypes.itemsize(kernel.dtype)
    # a row held in registers (codegen/resident.py) is read in one round trip, whatever reduces it
    depth = 0 if not rowwise or resident_row(kernel, launch, memo) else _reduction_depth(kernel.body, row_level)
    gathers = _gather_depth(kernel.body)
    syncs = len(row_level)
    block_syncs = syncs if launch.mode == "row" and launch.block > 32 else 0
    # warp mode reads a row 16 bytes a lane with later loads in flight, where the loads run along it
    vectorized = launch.mode == "warp" and bool(row_level) and all(
        vector_loads(kernel, r.args[2], r.args[1], memo)[1] for r in row_level)
    return Work("kernel", (unique + written) / 1e6, cached / 1e6, ops[0] / 1e9, serial[0],
                1 + depth + gathers, block_syncs, syncs - block_syncs, launch.grid, launch.block,
                _mapping_name(launch), vectorized=vectorized)


def attention_work(kernel) -> Work:
    """Flash attention (codegen/attention.py): each warp owns 16 query rows and walks the key tiles."""
    from ..codegen.attention import attention_launch, key_tile, tiling_of
    launch = attention_launch(kernel)
    ranks = tiling_of(kernel)[3]   # a cluster's blocks splitting a query tile's keys, merged in one more step
    isz = dtypes.itemsize(kernel.dtype)
    heads = math.prod(kernel.batch)
    q = heads * kernel.seq_q * kernel.head_dim
    kv = heads * kernel.seq_k * (kernel.head_dim + kernel.value_dim)
    out = heads * kernel.seq_q * kernel.value_dim
    extras = sum(math.prod(s) * dtypes.itemsize(d) for s, d in kernel.inputs[3:])
    warps_per_head = math.ceil(kernel.seq_q / 16)
    cached = kv * isz * max(0, warps_per_head - 1)   # every warp of a head reads the head's keys and values
    slices = max(1, launch.split)
    tiles = math.ceil(kernel.seq_k / (key_tile(kernel) * slices * ranks)) + (ranks > 1)   # dependent steps of one warp
    mapping = f"{launch.block // 32} warp(s) per block" + (f", keys in {slices} slices" if slices > 1 else "") \
        + (f" x {ranks} blocks of a cluster" if ranks > 1 else "")
    if kernel.causal_offset is not None:
        # priced as the whole square: on an H200 GPT-2 seq 128's 12 heads took the same time with the
        # tiles skipped (0.453 -> 0.451 ms for the model: launch- and latency-bound at batch 1)
        mapping += ", causal: key tiles past the band skipped"
    return Work("attention", ((q + kv + out) * isz + extras) / 1e6, cached / 1e6, kernel.flops / 1e9, tiles,
                1, 0, 0, launch.grid, launch.block, mapping)


def selection_work(kernel) -> Work:
    """NonZero's compaction, TopK's ranking or NonMaxSuppression's rounds (codegen/selection.py): serial
    work that scales with the input (NonZero: a chunk of a block's width x NONZERO_ITEMS at a time, each
    a block scan; TopK's select: a few passes over a row) or with the selections (NMS: at most the bound,
    each a pass over the boxes and a block arg-reduction)."""
    from ..codegen.selection import NONZERO_ITEMS, selection_launch, topk_selects
    launch = selection_launch(kernel)
    in_bytes = sum(math.prod(s) * dtypes.itemsize(d) for s, d in kernel.inputs)
    out_bytes = kernel.size * 8
    if isinstance(kernel, NonZeroKernel):
        rounds = math.ceil(max(kernel.segment or kernel.shape[1], 1) / (launch.block * NONZERO_ITEMS))
        return Work(SELECTION, (in_bytes + out_bytes) / 1e6, 0.0, 0.0, rounds, 1, 2 * rounds, rounds, launch.grid,
                    launch.block, "a block per segment of the flags, each scanned in order" if kernel.segment
                    else "one block scans the flags in order")
    if isinstance(kernel, TopKKernel) and topk_selects(kernel):
        dim = kernel.inputs[0][0][kernel.axis]
        passes = 5   # the radix digits of a 32-bit key and the gather (64-bit keys: 9)
        rounds = passes * math.ceil(dim / launch.block)
        return Work(SELECTION, (in_bytes * passes + out_bytes) / 1e6, 0.0, 0.0, rounds, 1, 3 * passes, passes,
                    launch.grid, launch.block, "a block per row: radix select of the k-th key, the k ranked among themselves")
    if isinstance(kernel, TopKKernel):
        dim = kernel.inputs[0][0][kernel.axis]
        return Work(SELECTION, (in_bytes + out_bytes) / 1e6, in_bytes * dim / 1e6, math.prod(kernel.inputs[0][0]) * dim / 1e9,
                    dim, 1, 0, 0, launch.grid, launch.block, "a thread per element, its rank a sweep over its row")
    if isinstance(kernel, NmsMaskKernel):
        pairs = kernel.shape[0] * kernel.shape[1] * kernel.shape[1] / 2
        return Work(SELECTION, (in_bytes + out_bytes / 2) / 1e6, pairs * 16 / 1e6, pairs * 20 / 1e9, 64, 1, 0, 0,
                    launch.grid, launch.block, "a thread per mask word: 64 IoUs")
    rounds = kernel.shape[2]
    passes = rounds * math.ceil(kernel.boxes / launch.block)
    return Work(SELECTION, (in_bytes + out_bytes) / 1e6, in_bytes * rounds / 1e6, passes * launch.block * 30 / 1e9,
                passes, 1, 2 * rounds, rounds, launch.grid, launch.block,
                "a block per batch and class, a round per selected box (at most the bound)")


def small_gemm_work(kernel) -> Work:
    """A few-row GEMM kernel (codegen/small_gemm.py): every block stages A's rows (through the
    prologue), then streams its weight tiles; the rows are read again by every block, from L2."""
    from ..codegen.small_gemm import is_split, small_gemm_tiling
    t = small_gemm_tiling(kernel)
    isz = dtypes.itemsize(kernel.dtype)
    a_bytes = sum(math.prod(s) * dtypes.itemsize(d) for s, d in kernel.inputs[:kernel.a_slots])
    a_bytes = min(a_bytes, 4 * kernel.rows * kernel.depth * isz)   # a gather reads rows, not its table
    w_bytes = kernel.weight_bytes
    extras = sum(math.prod(s) * dtypes.itemsize(d) for s, d in kernel.inputs[kernel.a_slots + kernel.w_slots:])
    out = kernel.rows * kernel.cols * isz
    reductions = len(row_reductions(kernel.prologue.body)) if kernel.prologue is not None else 0
    # the prologue's reductions each read the row again, unless it is held in registers: one round trip
    rounds = reductions
    if reductions and resident_row(kernel.prologue, row_function_launch(kernel.prologue, kernel.rows, kernel.depth)):
        rounds = 1
    serial = t.steps * math.ceil(t.block_tiles / t.grid)
    if is_split(kernel):   # the split form: a cluster per column group reads A once, then sums
        return Work(SMALL_GEMM, (a_bytes + w_bytes + extras + out) / 1e6, a_bytes * (t.block_tiles - 1) / 1e6,
                    kernel.flops / 1e9, serial * t.row_tiles, 3, 0, 0, t.grid, t.block,
                    f"{t.col_tiles} tile(s) a block, {t.row_tiles} row tile(s), K split over a cluster of "
                    f"{t.splits}, {t.steps} steps")
    return Work(SMALL_GEMM, (a_bytes + w_bytes + extras + out) / 1e6, a_bytes * (t.grid - 1) / 1e6,
                kernel.flops / 1e9, serial, 1 + rounds, 0, reductions, t.grid, t.block,
                f"{t.col_tiles} tile(s) x {t.k_slices} k-slice(s) a block, {t.steps} steps"
                + (", A from its prologue" if kernel.prologue is not None else ""))


def gemm_work(m: int, n: int, k: int, batch: int, dtype: str, c: bool = False, bias: bool = False,
              a_elems: int | None = None, b_elems: int | None = None, lds: tuple = ()) -> Work:
    """A cuBLASLt matmul. Without the algorithm it will pick (chosen on the GPU at load time) it is
    described by a typical small-M tile: tiles of the output run in waves, each walking K serially."""
    isz = dtypes.itemsize(dtype)
    a = batch * m * k if a_elems is None else a_elems
    b = batch * k * n if b_elems is None else b_elems
    out = batch * m * n
    nbytes = (a + b + out * (2 if c else 1) + (n if bias else 0)) * isz
    tiles = batch * math.ceil(m / GEMM_TILE_M) * math.ceil(n / GEMM_TILE_N)
    k_steps = math.ceil(k / GEMM_TILE_K)
    aligned = all(ld * isz % 16 == 0 for ld in lds)
    return Work("gemm", nbytes / 1e6, 0.0, 2.0 * batch * m * n * k / 1e9, k_steps, 1, 0, 0, tiles, 128,
                f"tiles {GEMM_TILE_M}x{GEMM_TILE_N}" + ("" if aligned else ", unaligned rows"), aligned)


def sdpa_work(attrs: dict, dtype: str) -> Work:
    """cuDNN's flash attention (ir/library.py sdpa): q, k, v, out and the bias read or written
    once, its arithmetic spread over the whole GPU (cuDNN picks tiles that fill it)."""
    bsz, heads, s, t, d, dv = attrs["dims"]
    isz = dtypes.itemsize(dtype)
    z = bsz * heads
    elems = z * (s * d + t * (d + dv) + s * dv)
    if attrs.get("bias"):
        elems += math.prod(attrs["bias"][1])
    rows = math.ceil(s / 64)
    # a causal band is priced as the whole square: cuDNN took as long with it as with no mask (H200,
    # 16 x 12 heads x 128: 8.5 and 7.9 us; benchmarks/results/2026-11-26-h200-sdpa-causal)
    return Work("sdpa", elems * isz / 1e6, 0.0, 2.0 * z * s * t * (d + dv) / 1e9, math.ceil(t / 128), 1, 0, 0,
                z * rows, 128, f"{bsz} x {heads} heads, {s} x {t}" + (", causal" if attrs.get("causal") else ""))


def _scope_nodes(root: K.Expr) -> tuple:
    """(loads, outermost reductions, arithmetic count) reachable from root without entering a reduce."""
    loads, reduces, arith, seen, stack = [], [], 0.0, set(), [root]
    while stack:
        e = stack.pop()
        if e in seen:
            continue
        seen.add(e)
        if e.op == "reduce":
            reduces.append(e)
            continue
        if e.op == "load":
            loads.append(e)
        elif e.op in ARITH:
            arith += 4 if e.op in TRANSCENDENTAL else 1
        stack.extend(K.children(e))
    return loads, reduces, arith


def _extent(r: K.Expr) -> int:
    return math.prod(v.args[1] for v in r.args[2])


def _reduction_depth(body: K.Expr, row_level: set) -> int:
    """The longest chain of row reductions each needing the one before (LayerNorm: mean, variance)."""
    depth: dict = {}
    for e in K.walk(body):   # children first
        below = max((depth[c] for c in K.children(e) if c in depth), default=0)
        depth[e] = below + (1 if e in row_level else 0)
    return depth.get(body, 0)


def _gather_depth(body: K.Expr) -> int:
    """Loads whose address is itself loaded (an embedding lookup): one more round trip each level."""
    return 1 if any(e.op == "load" and K.indirect_index(e) for e in K.walk(body)) else 0


def _mapping_name(launch: Launch) -> str:
    if launch.mode == "element":
        return f"thread per element, {launch.block} threads"
    if launch.mode == "warp":
        return f"warp per row, {launch.block // 32} rows per block"
    return f"block per row, {launch.block} threads"


def step_work(kernels: list, plan, step) -> Work | None:
    """The work of one top-level plan step (kernels: the bundle's kernel JSON entries), or None for
    steps the model does not price (If/Loop regions, scan stores)."""
    if isinstance(step, KernelStep):
        k = kernel_from_json(kernels[step.kernel])
        kind = kernels[step.kernel].get("kind")
        if kind == ATTENTION:
            return attention_work(k)
        if kind in SELECTION_KINDS:
            return selection_work(k)
        return small_gemm_work(k) if kind == SMALL_GEMM else kernel_work(k, plan_launch(k))
    if isinstance(step, LibraryStep) and step.attrs.get("op") == "matmul":
        # the operands' type sets the rate (a float32 out_dtype is still a half GEMM)
        return matmul_step_work(step.attrs, [plan.buffers[i].shape if i >= 0 else None for i in step.args],
                                plan.buffers[step.out].shape, plan.buffers[step.args[0]].dtype)
    if isinstance(step, LibraryStep) and step.attrs.get("op") == "sdpa":
        return sdpa_work(step.attrs, plan.buffers[step.out].dtype)
    if isinstance(step, LibraryStep) and step.attrs.get("op") == "conv":
        return conv_step_work(step.attrs, [plan.buffers[i].shape if i >= 0 else None for i in step.args],
                              plan.buffers[step.out].shape, plan.buffers[step.out].dtype)
    return None


def conv_step_work(attrs: dict, shapes: list, out_shape: tuple, dtype: str) -> Work:
    """A channels-last `conv` library step as the implicit GEMM cuDNN runs: per group, the output
    pixels times the filter taps (x [N,H,W,C] read once, not once per tap). shapes: x, w, then the
    bias and the residual, None where absent."""
    g = attrs.get("group", 1)
    k_out, r, s, cg = shapes[1]
    pixels = math.prod(out_shape[:-1])
    present = [sh is not None for sh in shapes] + [False, False]
    return gemm_work(pixels, k_out // g, r * s * cg, g, dtype, c=present[3], bias=present[2],
                     a_elems=math.prod(shapes[0]), b_elems=math.prod(shapes[1]))


def matmul_step_work(attrs: dict, shapes: list, out_shape: tuple, dtype: str) -> Work:
    """A `matmul` library step (ir/library.py), its operands seen through their views."""
    shapes = list(shapes)
    lds = {"0": shapes[0][-1], "1": shapes[1][-1], "out": out_shape[-1]}   # dense rows
    for key, (_offset, _stride, ld, shape) in (attrs.get("views") or {}).items():
        lds[key] = ld
        if key == "out":
            out_shape = tuple(shape)
        else:
            shapes[int(key)] = tuple(shape)
    a, b = shapes[0], shapes[1]
    m, n = out_shape[-2], out_shape[-1]
    k = a[-2] if attrs.get("trans_a") else a[-1]
    batch = math.prod(out_shape[:-2])
    has_c = len(shapes) > 2 and shapes[2] is not None
    has_bias = len(shapes) > 3 and shapes[3] is not None
    return gemm_work(m, n, k, batch, dtype, has_c, has_bias, math.prod(a), math.prod(b), tuple(lds.values()))
