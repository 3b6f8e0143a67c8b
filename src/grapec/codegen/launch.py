"""How a kernel maps onto the GPU: one thread per output element, or one thread block per row.

"element" mode: thread t computes output element t; any reduction is a loop in that thread. A large
kernel (ELEMENTS_PER_THREAD_FROM elements or more) may give each thread ELEMENTS_PER_THREAD elements
a block's width apart: one element a thread leaves a copy latency-bound (each thread's one load in
flight). GPT-2's fp16 -> fp32 logits cast at batch 16 (206 MB in, 411 MB out) on an H100
(benchmarks/elementwise.py, 2026-11-25): 1 element a thread 484 us (1.3 TB/s), 4 225 us (2.7 TB/s),
8 217 us. Four keeps most of the gain with a quarter of the registers that eight would hold.
"warp" mode: row mode with a warp per row and several rows per block, for many short rows (a
matrix-vector product is one row per output element, each a dot product over the weight's row).
"row" mode: the output's leading axes [0, split) pick a block (a "row"), the trailing axes are the
row's columns, which the block's threads stride over. A *row-level* reduction -- one that depends on
no reduction variable and on no column axis, such as a LayerNorm mean or a softmax max -- is computed
once per block by all its threads together (a strided partial, then warp shuffles and shared
memory). This is what lets the fuse pass stitch a reduction into the kernel that consumes it:
LayerNorm or softmax become one kernel.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..ir.kernel import Expr, Kernel, free_vars, walk

ELEMENT_BLOCK = 256
ELEMENTS_PER_THREAD = 4
ELEMENTS_PER_THREAD_FROM = 1 << 20   # smaller kernels keep one element a thread (and every SM busy)
WARP_MODE_MIN_ROWS = 256     # fewer rows than this keep a block each (a warp per row would idle SMs)
WARP_MODE_MAX_WORK = 4096    # ... and a longer row keeps a block (a warp would loop too long)
WARP_BLOCK = 128           # 4 rows a block: a narrow gemv (768 rows) still spreads over every SM
BLOCK_SIZES = (32, 64, 128, 256, 512, 1024)
WARP_ROWS = (1, 2, 4, 8)
COOPERATIVE_OPS = ("sum", "prod", "max", "min", "argmax", "argmin", "argmax_last", "argmin_last")
COOPERATIVE_DTYPES = ("float32", "float16", "bfloat16", "float64", "int32", "int64")


def is_cooperative(e: Expr) -> bool:
    """A reduction a block can compute together: the threads' partials combine associatively.
    For argmax/argmin the partial is a (value, index) pair, so the body's dtype is what counts."""
    return (e.op == "reduce" and e.args[0] in COOPERATIVE_OPS
            and (e.args[1].dtype if e.args[0].startswith("arg") else e.dtype) in COOPERATIVE_DTYPES)
MAX_ROWS_FOR_SHORT_REDUCTIONS = 8192   # past this, a short reduction is cheaper in each thread


@dataclass(frozen=True)
class Launch:
    mode: str      # "element" | "row" | "warp"
    grid: int
    block: int
    split: int = 0   # row mode: output axes [0, split) index the row
    rows: int = 0
    cols: int = 0
    per_thread: int = 1   # element mode: elements a thread computes, a block's width apart

    def to_json(self) -> list:
        return [self.mode, self.grid, self.block, self.split]


def element_launch(kernel: Kernel, block: int, per: int | None = None) -> Launch:
    """per: elements a thread computes; None: by the kernel's size (per_thread_for)."""
    size = max(kernel.size, 1)
    per = per_thread_for(size) if per is None else per
    return Launch("element", -(-size // (block * per)), block, per_thread=per)


def per_thread_for(size: int) -> int:
    return ELEMENTS_PER_THREAD if size >= ELEMENTS_PER_THREAD_FROM else 1


def row_reductions(body: Expr, memo: dict | None = None) -> list:
    """Reductions in body that depend on no reduction variable (each is computed once per output
    element, or once per row in row mode), and that a block can compute cooperatively."""
    memo = {} if memo is None else memo
    out = []
    for e in walk(body):
        if not is_cooperative(e):
            continue
        if any(v.op == "ridx" for v in free_vars(e, memo)):
            continue
        out.append(e)
    return out


def extent(rvars) -> int:
    """How many iterations a reduction over these ridx nodes has."""
    return math.prod(r.args[1] for r in rvars)


def plan_launch(kernel: Kernel) -> Launch:
    """The kernel's launch: the mapping the planner recorded in it (passes/mappings.py), else the
    default rules below."""
    if kernel.mapping:
        return mapped_launch(kernel, *kernel.mapping)
    return default_launch(kernel)


def row_split(kernel: Kernel) -> tuple:
    """(split, rows, cols, longest row reduction) of a kernel with row reductions; None without."""
    memo: dict = {}
    reds = row_reductions(kernel.body, memo)
    if not reds or kernel.size == 0:
        return None
    deps = [a.args[0] for r in reds for a in free_vars(r, memo) if a.op == "idx"]
    split = 1 + max(deps, default=-1)
    return (split, math.prod(kernel.shape[:split]), math.prod(kernel.shape[split:]),
            max(extent(r.args[2]) for r in reds))


def mapped_launch(kernel: Kernel, mode: str, n: int, per: int | None = None) -> Launch:
    """mode "element" (n threads a block; per elements a thread, by size where None), "row" (a block
    of n threads per row) or "warp" (a warp per row, n rows a block). ValueError for a mapping the
    kernel cannot take."""
    if mode == "element" and n in BLOCK_SIZES and per in (None, 1, ELEMENTS_PER_THREAD):
        return element_launch(kernel, n, per)
    rs = row_split(kernel)
    if rs is None or mode not in ("row", "warp"):
        raise ValueError(f"mapping {mode}/{n}: the kernel has no row reduction to map rows of")
    split, rows, cols, _ = rs
    if mode == "row" and n in BLOCK_SIZES:
        return Launch("row", rows, n, split, rows, cols)
    if mode == "warp" and n in WARP_ROWS:
        return Launch("warp", (rows + n - 1) // n, 32 * n, split, rows, cols)
    raise ValueError(f"mapping {mode}/{n}: unknown mapping")


def candidate_mappings(kernel: Kernel) -> list:
    """Every mapping worth pricing for the kernel: a block per row at each block size up to the
    row's work, a warp per row at 1-8 rows a block, and a thread per element where each element's
    own loop is short or there is one column per row."""
    rs = row_split(kernel)
    if rs is None:
        return [("element", ELEMENT_BLOCK)]
    _, rows, cols, longest = rs
    work = max(cols, longest)
    out = [("row", b) for b in BLOCK_SIZES if b >= 32 and (b <= work or b == 32)]
    out += [("warp", n) for n in WARP_ROWS if n == 1 or rows >= 2 * n]
    if cols == 1 or longest < 32:
        out.append(("element", ELEMENT_BLOCK))
    return out


def default_launch(kernel: Kernel) -> Launch:
    """The rules used where no cost model chose (--fusion rules, If/Loop bodies)."""
    element = element_launch(kernel, ELEMENT_BLOCK)
    rs = row_split(kernel)
    if rs is None:
        return element
    split, rows, cols, longest = rs
    if longest < 32 and rows > MAX_ROWS_FOR_SHORT_REDUCTIONS:
        return element
    work = max(cols, longest)
    if rows >= WARP_MODE_MIN_ROWS and longest >= 32 and work <= WARP_MODE_MAX_WORK:
        per_block = WARP_BLOCK // 32
        return Launch("warp", (rows + per_block - 1) // per_block, WARP_BLOCK, split, rows, cols)
    block = 32
    while block < 256 and block < work:
        block *= 2
    if rows <= 64 and work >= 4096:
        block = 1024   # few rows, long ones: more threads per row
    return Launch("row", rows, block, split, rows, cols)
