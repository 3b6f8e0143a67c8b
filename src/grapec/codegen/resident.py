"""A warp's row held in registers (warp mode): each row is read from memory once.

A LayerNorm computed by one warp walks its row three times: the mean, the variance, then the
normalized columns. Rendered plainly, each walk loads the row again, and each load is a round trip to
L2 that the next walk waits for: in a small GEMM's prologue (GPT-2 at seq 8) the LayerNorm cost more
than the GEMM's own weight stream. Where a row is short enough, every lane instead loads its slice of
each row it reads into registers first, a vector at a time, all loads in flight together, and the
reductions and the column loop read those registers (GPT-2's LayerNorm kernels at seq 128: 2.68 ->
1.52 us each on an H100; benchmarks/results/2026-11-26-h100-resident-rows).

Lane l holds elements l*W + s*32*W + u (u < W, s < steps) of the row, W the elements of the widest
type in 16 bytes (a float32 row with float16 weights: 4, the weights' vectors 8 bytes). The
reductions (over the row's one reduction variable) and the column loop (over its one column axis)
both walk the row in that order, so each element is read from the same register by both. A lane's W
output columns are adjacent too, so they are stored as one vector (stored one at a time, a warp's
stores land 16 bytes apart, and GPT-2's LayerNorms at batch 16 took 7.4 us for 6 MB).

`resident_row` decides whether a kernel can, and which loads read registers: a load whose last index
is the column axis or a reduction variable over the whole row, with unit stride, its other indices
free of both, from a buffer whose rows are whole vectors. Any other load reads memory as before.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import dtypes
from ..ir.kernel import Expr, Kernel, free_vars, idx, walk
from .launch import Launch, is_cooperative

VECTOR_BYTES = 16
HELD_TYPES = ("float16", "bfloat16", "float32")
VECTOR_TYPE = {16: "uint4", 8: "uint2", 4: "unsigned int", 2: "unsigned short"}
MAX_STEPS = 8           # vectors a lane holds per row: rows of up to 2048 half elements
MAX_VECTORS = 24        # vectors a lane holds in all (96 registers)


@dataclass(frozen=True)
class ResidentRow:
    width: int          # elements per vector
    steps: int          # vectors per lane per row
    rows: tuple         # ((slot, prefix index exprs), ...): one register array each
    types: tuple        # each array's vector type (W elements of its row's type)
    reads: dict         # load -> index into rows

    def array(self, i: int) -> str:
        return f"g_rv{i}"

    @property
    def count(self) -> str:
        """Vectors a lane holds, as C: `steps` on the GPU; G_WARP lanes of 1 hold them all on the host
        (codegen/host.py runs a warp as one thread). Written `4u`: it sizes register arrays, so it must
        stay a literal, and a number with a suffix is not one that kernels differing only in sizes
        merge into a parameter (codegen/module.py)."""
        return f"({self.steps}u * 32 / G_WARP)"

    def element(self, lane: str, step: str, unit: str) -> str:
        """The row element a lane holds at vector `step`, element `unit`, as C."""
        return f"(i64){lane} * {self.width} + {step} * (G_WARP * {self.width}) + {unit}"


def resident_row(kernel: Kernel, launch: Launch, memo: dict | None = None) -> ResidentRow | None:
    """The rows a warp-mode kernel keeps in registers, or None where it cannot (see the module)."""
    memo = {} if memo is None else memo
    split = launch.split
    if launch.mode != "warp" or len(kernel.shape) - split != 1:
        return None
    cols, column = launch.cols, idx(split)
    reduces = [e for e in walk(kernel.body) if e.op == "reduce"]
    if not reduces:
        return None
    for r in reduces:
        rvars = r.args[2]
        # one variable over the whole row, computed once per row (not per column), no reduction
        # inside it that runs per element (one free of its variable, a variance's mean, is hoisted)
        if not is_cooperative(r) or len(rvars) != 1 or rvars[0].args[1] != cols or column in free_vars(r, memo) or \
                any(x.op == "reduce" and rvars[0] in free_vars(x, memo) for x in walk(r.args[1])):
            return None
    along = {column} | {r.args[2][0] for r in reduces}
    reads, rows = {}, {}
    for e in walk(kernel.body):
        if e.op != "load" or e.args[2] is not None or not e.args[1] or e.dtype not in HELD_TYPES:
            continue
        *prefix, last = e.args[1]
        if last in along and not any(free_vars(i, memo) & along for i in prefix):
            reads[e] = rows.setdefault((e.args[0], tuple(prefix)), len(rows))
    if not reads:
        return None
    # a step of W elements is one vector of every row: 16 bytes of the widest type, fewer of the others
    width = min(VECTOR_BYTES // dtypes.itemsize(kernel.inputs[slot][1]) for slot, _ in rows)
    if any(kernel.inputs[slot][0][-1] % width for slot, _ in rows) or cols % (32 * width):
        return None
    steps = cols // (32 * width)
    if steps > MAX_STEPS or steps * len(rows) > MAX_VECTORS:
        return None
    types = tuple(VECTOR_TYPE[width * dtypes.itemsize(kernel.inputs[slot][1])] for slot, _ in rows)
    return ResidentRow(width, steps, tuple(rows), types, reads)


def row_function_launch(kernel: Kernel, rows: int, cols: int) -> Launch:
    """The launch a row function (a GEMM prologue: codegen/cuda.py RowFunctionRenderer) is rendered
    in: one warp per row, the leading axes the row."""
    return Launch("warp", 1, 32, len(kernel.shape) - 1, rows, cols)


def fill_lines(rr: ResidentRow, i: int, slot: int, start: str, lane: str) -> list:
    """Lane `lane`'s slice of row i (starting at element offset `start` of input `slot`) into its registers."""
    a, vt = rr.array(i), rr.types[i]
    return [f"  {vt} {a}[{rr.count}];",
            "  #pragma unroll",
            f"  for (int g_s = 0; g_s < {rr.count}; ++g_s) "
            f"{a}[g_s] = *(const {vt}*)(in{slot} + {start} + {rr.element(lane, 'g_s', '0')});"]


def stored_vector(rr: ResidentRow, dtype: str) -> str | None:
    """The vector type that stores a lane's W adjacent output columns at once, or None (one at a time)."""
    if dtype in ("int4", "uint4", "int2", "uint2", "float4e2m1"):
        return None
    return VECTOR_TYPE.get(rr.width * dtypes.itemsize(dtype))


def register_read(rr: ResidentRow, load: Expr, ctype: str, step: str, unit: str) -> str:
    """The element of `load` at vector `step`, element `unit` of this lane's slice."""
    return f"((const {ctype}*)&{rr.array(rr.reads[load])}[{step}])[{unit}]"
