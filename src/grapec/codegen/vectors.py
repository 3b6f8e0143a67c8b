"""Which loads of a cooperative reduction are read in vectors, and how wide.

A reduction whose threads stride over its one variable r reads the loads that run along r with unit
stride `width` elements at a time: 16 bytes per thread per load is what keeps DRAM busy with few
warps. Loads whose last index is r // c (MatMulNBits' packed codes, c per byte; its block scales, c a
block) then read width // c elements a step, or one where c is a multiple of the width.

A packed weight's 4-bit codes are the narrowest stream: at A's 8 halves a step, a lane read 4 bytes of
codes, and a warp's output needed 8 dependent-free loads of 128 bytes. So where packed codes are read,
the width grows (to MAX_VECTOR_WIDTH) until their vector is 16 bytes too; a load wider than 16 bytes
(A's 32 halves) is then read as several 16-byte vectors.

Also here: a row walked through trailing dimensions (r // c, r % c: attention heads through their
transpose) is one contiguous row (flat_tail); a factor read once a step (a block's scale) multiplies
the step's sum (per_step_factor); 4-bit codes dotted eight at a time (NibbleDot).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .. import dtypes
from ..ir.kernel import Expr, Kernel, binary, cast, free_vars, walk

PACKED_CODES = ("uint8", "int8")   # weight codes (MatMulNBits' packed int4) stream like floats
VECTOR_TYPE = {16: "uint4", 8: "uint2", 4: "unsigned int"}   # bytes -> the CUDA type moved in one instruction
MAX_VECTOR_WIDTH = 32   # elements a lane reads of each load per step (A's row: 64 bytes of halves)


def divided_loads(kernel: Kernel, r, body, width: int, memo: dict | None = None) -> list:
    """-> [(load, c)] of the loads whose last index is r // c (c a constant), the rest free of r, in
    a reduction read `width` elements of r at a time (vector_loads): a step's r // c values are
    width // c consecutive elements (a vector, where a row of the buffer is whole vectors of them)
    or, where c is a multiple of width, one. MatMulNBits' packed bytes (c = codes per byte) and
    block scales (c = block size) are such loads."""
    memo = {} if memo is None else memo
    out = []
    for e in walk(body):
        if e.op != "load" or e.args[2] is not None or not _divisor(e, r) or \
                any(r in free_vars(i, memo) for i in e.args[1][:-1]):
            continue
        c, row = _divisor(e, r), kernel.inputs[e.args[0]][0][-1]
        count = width // c if width % c == 0 else 1
        if c % width and (width % c or count * dtypes.itemsize(e.dtype) not in VECTOR_TYPE or row % count):
            continue
        out.append((e, c))
    return out


def vector_loads(kernel: Kernel, rvars, body, memo: dict | None = None) -> tuple:
    """-> (width, loads) for a cooperative reduction whose loads run along its one variable with
    unit stride from a row start that a vector of `width` elements divides: those loads are read
    `width` elements at a time. Buffers start 256-byte aligned (plan_memory, the weight store).
    (1, []) otherwise. The cost model asks the same question (cost/work.py): such a loop keeps its
    loads in flight."""
    memo = {} if memo is None else memo
    if len(rvars) != 1:
        return 1, []
    r = rvars[0]
    loads = []
    for e in walk(body):
        if e.op != "load" or e.args[2] is not None or not e.args[1] or \
                not (dtypes.is_float(e.dtype) or e.dtype in PACKED_CODES):
            continue
        if flat_tail(e, r, kernel.inputs[e.args[0]][0], memo):
            loads.append(e)
    if not loads:
        return 1, []
    width = min(16 // dtypes.itemsize(e.dtype) for e in loads)
    loads = [e for e in loads if _row(kernel, e, r, memo) % width == 0]
    if width < 2 or r.args[1] % width or not loads:
        return 1, []
    return _widened(kernel, r, body, width, loads, memo), loads


def flat_tail(load: Expr, r: Expr, shape: tuple, memo: dict | None = None) -> int:
    """How many trailing index dimensions of the load walk its buffer's contiguous row with r, at unit
    stride: 1 where the last index is r; 2 where the last two are (r // c, r % c) over a last dimension
    of c (an attention output read through its heads' transpose, [heads, head_dim] as one row of K);
    0 where neither holds, or the other indices read r."""
    memo = {} if memo is None else memo
    index = load.args[1]
    if index[-1] is r:
        tail = 1
    else:   # (.., r // c, [unit dimensions], r % c): the unit dimensions add no stride
        walked = [d for d in range(len(index)) if shape[d] != 1]
        if len(walked) < 2:
            return 0
        low, high = index[walked[-1]], index[walked[-2]]
        if not (walked[-1] == len(index) - 1 and low.op == "mod" and low.args[0] is r and low.args[1].is_const
                and high.op == "div" and high.args[0] is r and high.args[1] is low.args[1]
                and int(low.args[1].value) == shape[-1]):
            return 0
        tail = len(index) - walked[-2]
    return 0 if any(r in free_vars(i, memo) for i in index[:-tail]) else tail


def _row(kernel: Kernel, load: Expr, r: Expr, memo: dict) -> int:
    """The elements of the load's contiguous row that r walks."""
    shape = kernel.inputs[load.args[0]][0]
    return math.prod(shape[-flat_tail(load, r, shape, memo):])


def _divisor(load: Expr, r: Expr) -> int:
    """c where the load's last index is r // c (c a constant), else 0."""
    last = load.args[1][-1] if load.args[1] else None
    ok = last is not None and last.op == "div" and last.args[0] is r and last.args[1].is_const
    return int(last.args[1].value) if ok else 0


def _packed_code_divisors(body, r) -> list:
    """c of every packed-code load indexed r // c (c codes a byte), whether or not it is a vector read at
    the base width (a float32 A's 4 elements a step read 2 bytes of 4-bit codes: no vector type)."""
    return [_divisor(e, r) for e in walk(body) if e.op == "load" and e.dtype in PACKED_CODES and _divisor(e, r) > 1]


def _widened(kernel: Kernel, r, body, width: int, loads: list, memo: dict) -> int:
    """The width at which every vector load (and packed codes read by r // c) moves 16 bytes a step, up to
    MAX_VECTOR_WIDTH, where the reduction and each row are whole steps and no divided load is lost."""
    wants = [16 // dtypes.itemsize(e.dtype) for e in loads] + [16 * c for c in _packed_code_divisors(body, r)]
    before = {id(e) for e, _ in divided_loads(kernel, r, body, width, memo)}
    wide = min(MAX_VECTOR_WIDTH, max(wants))
    while wide > width:
        if r.args[1] % wide == 0 and all(_row(kernel, e, r, memo) % wide == 0 for e in loads) and \
                before <= {id(e) for e, _ in divided_loads(kernel, r, body, wide, memo)}:
            return wide
        wide //= 2
    return width


def per_step_factor(body, per_step_loads: list) -> tuple:
    """body = inner x factor, where the factor's loads are all read once a step (a block scale at r // c,
    c a multiple of the width) and it reads r through them alone: -> (inner, factor), or (body, None).
    A sum then multiplies each step's sum of `inner` by the factor (MatMulNBits: sum_k x_k (q_k - z) s
    is s times the block's sum of x_k (q_k - z), a multiply an element fewer)."""
    if body.op != "mul" or not per_step_loads:
        return body, None
    factors = _factors(body)
    fixed = [e for e in factors if _reads_only(e, per_step_loads)]
    if not fixed or len(fixed) == len(factors):
        return body, None
    varying = [e for e in factors if not any(e is x for x in fixed)]
    return _product(varying), _product(fixed)


def _factors(e) -> list:
    return _factors(e.args[0]) + _factors(e.args[1]) if e.op == "mul" and e.args[0].dtype == e.dtype else [e]


def _product(es: list):
    out = es[0]
    for e in es[1:]:
        out = binary("mul", out, e)
    return out


def _reads_only(e, loads: list) -> bool:
    """Does e read nothing that varies along the reduction but these loads (no ridx outside them)?"""
    if any(e is ld for ld in loads):
        return True
    if e.op in ("ridx", "load"):
        return False
    return all(_reads_only(a, loads) for a in e.args if hasattr(a, "op"))


@dataclass(frozen=True)
class NibbleDot:
    """A step's sum of x_u * (code_u - zero) over 4-bit codes packed low nibble first (MatMulNBits at 4
    bits, its scale factored out: per_step_factor): x a float16 vector read, `codes` the packed bytes'
    vector read (r // 2), `zero` a float32 integer the step shares (a constant, or a packed zero
    point's code). Rendered eight codes at a time by g_dot8_q4 (codegen/prelude.py): two codes to a
    pair of halves by their bits, minus the zero point exactly, then float32 multiply-adds. The
    element-wise form spent about 7 instructions a code (its shifts and masks, the magic-number
    conversion), g_dot8_q4 about 4."""
    x: Expr
    codes: Expr
    zero: Expr


def nibble_dot(inner: Expr, r: Expr, width: int, vector: list, divided: list) -> NibbleDot | None:
    if width % 8 or inner.op != "mul" or inner.dtype != "float32":
        return None
    codes_read = [ld for ld, c in divided if c == 2 and ld.dtype == "uint8"]
    for x, w in (inner.args, inner.args[::-1]):
        if not (x.op == "cast" and x.args[0].op == "load" and x.args[0].dtype == "float16"
                and any(x.args[0] is v for v in vector)) or w.op != "sub":
            continue
        code, zero = w.args
        if code.op != "cast" or code.dtype != "float32" or not _integer_per_step(zero, r, width):
            continue
        masked = code.args[0]
        if masked.op != "bitand" or not masked.args[1].is_const or int(masked.args[1].value) != 15:
            continue
        shifted = masked.args[0]
        if shifted.op != "shr" or shifted.args[1] is not cast((r % 2) * 4, "int32"):
            continue
        byte = shifted.args[0]
        if byte.op == "cast" and byte.dtype == "int32" and any(byte.args[0] is ld for ld in codes_read):
            return NibbleDot(x.args[0], byte.args[0], zero)
    return None


def _integer_per_step(e: Expr, r: Expr, width: int) -> bool:
    """A float32 integer (an integral constant, or a cast from an integer type) that reads r only as
    r // c, c a multiple of the step's width: one value a step."""
    if e.op == "const":
        return float(e.value).is_integer() and abs(e.value) < 1024
    return e.op == "cast" and dtypes.is_int(e.args[0].dtype) and _per_step(e, r, width)


def _per_step(e: Expr, r: Expr, width: int) -> bool:
    if e is r:
        return False
    if e.op == "div" and e.args[0] is r and e.args[1].is_const and int(e.args[1].value) % width == 0:
        return True
    kids = [a for a in e.args if isinstance(a, Expr)]
    kids += [i for a in e.args if isinstance(a, tuple) for i in a if isinstance(i, Expr)]
    return all(_per_step(a, r, width) for a in kids)
