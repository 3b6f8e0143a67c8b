"""How a kernel maps onto the GPU: one thread per output element, or one thread block per row.

"element" mode: thread t computes output element t; any reduction is a loop in that thread.
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
WARP_MODE_MIN_ROWS = 256     # fewer rows than this keep a block each (a warp per row would idle SMs)
WARP_MODE_MAX_WORK = 4096    # ... and a longer row keeps a block (a warp would loop too long)
WARP_BLOCK = 128           # 4 rows a block: a narrow gemv (768 rows) still spreads over every SM
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

    def to_json(self) -> list:
        return [self.mode, self.grid, self.block, self.split]


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
    size = max(kernel.size, 1)
    element = Launch("element", (size + ELEMENT_BLOCK - 1) // ELEMENT_BLOCK, ELEMENT_BLOCK)
    memo: dict = {}
    reds = row_reductions(kernel.body, memo)
    if not reds or kernel.size == 0:
        return element
    deps = [a.args[0] for r in reds for a in free_vars(r, memo) if a.op == "idx"]
    split = 1 + max(deps, default=-1)
    rows = math.prod(kernel.shape[:split])
    cols = math.prod(kernel.shape[split:])
    longest = max(extent(r.args[2]) for r in reds)
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
