"""Render kernel IR as CUDA C, in the launch mode codegen/launch.py picks.

Element mode: the thread's flat index is unravelled into the output coordinates. Row mode: the
block index is unravelled into the row's coordinates and the threads stride over the columns;
row-level reductions are computed by the whole block before the column loop. The body is printed as
SSA statements. A subexpression is placed in the innermost loop (column loop or reduction loop) it
depends on, so work that does not depend on a loop variable is hoisted out of it. float16 values are
computed in float and rounded when stored (that is what the fp32-accumulation policy asks for).
"""
from __future__ import annotations

from .. import dtypes
from ..errors import UnsupportedError
from ..ir.kernel import Expr, Kernel, const, free_vars, idx, indirect_index, walk
from .launch import Launch, extent, is_cooperative, plan_launch
from .vectors import VECTOR_TYPE, divided_loads, flat_tail, nibble_dot, per_step_factor, vector_loads
from .resident import fill_lines, register_read, resident_row, row_function_launch, stored_vector

MAX_UNROLLED_VECTOR_STEPS = 16
NARROW_INDEX = True   # 32-bit index divisions where a kernel's index space fits (CudaRenderer._unravel)

# minifloat -> its (E, M, B, K) in g_mf_decode/g_mf_encode
_MINIFLOAT = {"float8e4m3fn": (4, 3, 7, 1), "float8e4m3fnuz": (4, 3, 8, 2), "float8e5m2": (5, 2, 15, 0),
              "float8e5m2fnuz": (5, 2, 16, 2), "float4e2m1": (2, 1, 1, 3)}
# encoded storage type -> (decode to the compute type, encode from it)
_CONVERT = {"float16": ("h2f", "f2h"), "bfloat16": ("b2f", "f2b")}
_CONVERT.update({dt: (f"g_mf_decode<{p}>", f"g_mf_encode<{p}>")
                 for dt, p in ((dt, ", ".join(map(str, f))) for dt, f in _MINIFLOAT.items())})
_SUBBYTE_BITS = {"int4": 4, "uint4": 4, "int2": 2, "uint2": 2}
_CONVERT.update({dt: (f"g_{'u' if dt.startswith('u') else ''}int_decode<{bits}>", f"g_int_encode<{bits}>")
                 for dt, bits in _SUBBYTE_BITS.items()})

_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "mod": "%", "eq": "==", "ne": "!=", "lt": "<",
          "le": "<=", "gt": ">", "ge": ">=", "and": "&&", "or": "||", "xor": "!=", "bitand": "&",
          "bitor": "|", "bitxor": "^", "shl": "<<", "shr": ">>"}
_FLOAT_FN = {"exp": "exp", "log": "log", "sqrt": "sqrt", "sin": "sin", "cos": "cos", "tan": "tan",
             "asin": "asin", "acos": "acos", "atan": "atan", "sinh": "sinh", "cosh": "cosh", "tanh": "tanh",
             "asinh": "asinh", "acosh": "acosh", "atanh": "atanh", "erf": "erf", "floor": "floor",
             "ceil": "ceil", "round": "rint", "abs": "fabs", "pow": "pow", "atan2": "atan2", "mod": "fmod"}


def _small_int_to_float(e: Expr) -> bool:
    """A float32 cast of an int32 masked to under 2^23 (an unpacked weight code): its bits ORed into
    2^23's make the float 2^23 + value, so the conversion is a logic op and an add, not an I2F (a quarter
    of the issue rate, and one per weight element of a quantized GEMV)."""
    x = e.args[0] if e.op == "cast" else None
    return (x is not None and e.dtype == "float32" and x.dtype == "int32" and x.op == "bitand"
            and x.args[1].op == "const" and 0 <= int(x.args[1].value) < 1 << 23)


def _small_integer(e: Expr) -> bool:
    return e.op == "const" and e.dtype == "float32" and float(e.value).is_integer() and abs(e.value) < 1 << 22


def ctype(dt: str) -> str:
    return {"float16": "f16", "bfloat16": "bf16"}.get(dt) or dtypes.c_type(dt)


def compute_type(dt: str) -> str:
    return ctype(dtypes.accumulation(dt))


class _Scope:
    """A block of statements: the kernel's root, the column loop or a reduction loop; `loop_vars`
    are the idx/ridx nodes that vary inside it."""

    def __init__(self, loop_vars, indent: str):
        self.loop_vars = frozenset(loop_vars)
        self.lines: list = []
        self.indent = indent


# the prelude's type names (codegen/prelude.py TYPES), which a numbered variable must not take
RESERVED_NAMES = frozenset({"i64", "f16", "bf16"})


class CudaRenderer:
    def __init__(self, kernel: Kernel, launch: Launch | None = None, hold_rows: bool = True, vectors: bool = True):
        self.k = kernel
        self.launch = launch or plan_launch(kernel)
        self.hold_rows = hold_rows     # warp mode may keep rows in registers (codegen/module.py says where not)
        self.vectors = vectors         # warp mode may read rows in 16-byte vectors (codegen/module.py says where not)
        self.names: dict = {}
        self.rnames: dict = {}
        self.deps: dict = {}
        self.scopes: list = []
        self.all_scopes: list = []   # keeps every scope alive, so id(scope) stays unique
        self.count = 0
        self.vector_reads: dict = {}   # load -> its element of a vector read (see _vector_loads)
        self.vector_names: dict = {}   # load -> the variable its vector is read into
        self.read_vectors = False      # some row was read in vectors (render() tells after it ran)
        self.resident = None           # warp mode: the rows held in registers (codegen/resident.py)

    def fresh(self, prefix="v") -> str:
        self.count += 1
        if f"{prefix}{self.count}" in RESERVED_NAMES:   # the 16th name "f" must not be the type f16
            self.count += 1
        return f"{prefix}{self.count}"

    def push(self, loop_vars, indent: str) -> _Scope:
        scope = _Scope(loop_vars, indent)
        self.scopes.append(scope)
        self.all_scopes.append(scope)
        return scope

    def target_scope(self, e: Expr) -> _Scope:
        d = free_vars(e, self.deps)
        for s in reversed(self.scopes):
            if s.loop_vars & d:
                return s
        return self.scopes[0]

    def emit(self, e: Expr) -> str:
        key = (e, id(self.target_scope(e)))
        if key in self.names:
            return self.names[key]
        if e.op == "const":
            return self.literal(e)
        if e.op == "idx":
            return f"i{e.args[0]}"
        if e.op == "ridx":
            return self.rname(e)
        scope = self.target_scope(e)
        ct = compute_type(e.dtype)
        if e.op == "reduce":
            name = self.emit_reduce(e, scope)
        else:
            rhs = self.expression(e)
            name = self.fresh()
            scope.lines.append(f"{scope.indent}const {ct} {name} = {rhs};")
        self.names[key] = name
        return name

    def rname(self, r: Expr) -> str:
        """Numbered in order of use, so kernels that differ only in sizes render alike."""
        return self.rnames.setdefault(r, f"r{len(self.rnames)}")

    def literal(self, e: Expr) -> str:
        v, dt = e.value, e.dtype
        if dt == "bool":
            return "true" if v else "false"
        if dtypes.is_int(dt):
            suffix = "ULL" if dt == "uint64" else "LL" if dt in ("int64", "uint32") else ""
            if dt == "int64" and v == -(2 ** 63):
                return "(-9223372036854775807LL - 1)"
            return f"(({ctype(dt)}){v}{suffix})"
        ct = compute_type(dt)
        if v != v:
            return f"(({ct})G_NAN)"
        if v in (float("inf"), float("-inf")):
            return f"({'-' if v < 0 else ''}({ct})G_INF)"
        return f"(({ct}){v!r})"

    def expression(self, e: Expr) -> str:
        op, dt = e.op, e.dtype
        if op == "load":
            return self.load(e)
        if op == "cast" and _small_int_to_float(e):
            return f"({self._code_bits(e.args[0])} - 8388608.f)"
        if op == "sub" and _small_int_to_float(e.args[0]) and _small_integer(e.args[1]):
            # (q + 2^23) - (2^23 + c) is q - c exactly: one add for MatMulNBits' code minus its zero point
            return f"({self._code_bits(e.args[0].args[0])} - {8388608 + int(e.args[1].value)}.f)"
        if op == "cast":
            x = self.emit(e.args[0])
            src = e.args[0].dtype
            wide = "i64" if dtypes.is_int(dt) and dt in _CONVERT else compute_type(dt)
            if dtypes.is_float(src) and dtypes.is_int(dt):
                x = f"(({wide})({x} == {x} && !g_isinf({x}) ? {x} : 0))"
            if dt in _CONVERT:   # held in a wider register, but a cast to an encoded type rounds (or wraps)
                decode, encode = _CONVERT[dt]
                return f"{decode}({encode}(({wide}){x}))"
            return f"(({compute_type(dt)}){x})"
        if op == "where":
            c, a, b = (self.emit(x) for x in e.args)
            return f"({c} ? {a} : {b})"
        args = [self.emit(a) for a in e.args]
        in_dt = e.args[0].dtype
        is_f = dtypes.is_float(in_dt)
        f_suffix = "f" if compute_type(in_dt) == "float" else ""
        if op in ("max", "min"):
            return f"g_{op}<{compute_type(in_dt)}>({args[0]}, {args[1]})"
        if is_f and op in _FLOAT_FN:
            return f"{_FLOAT_FN[op]}{f_suffix}({', '.join(args)})"
        if op in _INFIX:
            return f"({args[0]} {_INFIX[op]} {args[1]})"
        if op == "neg":
            return f"(-{args[0]})"
        if op == "abs":
            return f"({args[0]} < 0 ? -{args[0]} : {args[0]})"
        if op == "not":
            return f"(!{args[0]})"
        if op == "bitnot":
            return f"(({compute_type(dt)})~{args[0]})"
        if op == "sign":
            return f"g_sign<{compute_type(in_dt)}>({args[0]})"
        if op == "reciprocal":
            return f"(({compute_type(dt)})1 / {args[0]})"
        if op == "sigmoid":
            return f"(({compute_type(dt)})1 / (({compute_type(dt)})1 + exp{f_suffix}(-{args[0]})))"
        if op == "isnan":
            return f"({args[0]} != {args[0]})" if is_f else "false"
        if op == "isinf":
            return f"g_isinf({args[0]})" if is_f else "false"
        if op == "isposinf":
            return f"({args[0]} == G_INF)" if is_f else "false"
        if op == "isneginf":
            return f"({args[0]} == -G_INF)" if is_f else "false"
        if op == "pow":
            return f"(({compute_type(dt)})pow((double){args[0]}, (double){args[1]}))"
        if op in ("floor", "ceil", "round"):
            return args[0]  # integers
        raise UnsupportedError([f"CUDA code generation of '{op}' on {in_dt} is not implemented"])

    def _code_bits(self, masked: Expr) -> str:
        """The float whose bits are 2^23's ORed with `masked` (a bitand by a constant under 2^23)."""
        return f"__int_as_float(0x4B000000 | {self.emit(masked)})"

    def load(self, e: Expr) -> str:
        slot, index, mask, other = e.args
        shape, dt = self.k.inputs[slot]
        read = self.vector_reads.get(e) or f"in{slot}[{self.flat_offset(index, shape)}]"
        if dt in _CONVERT:
            read = f"{_CONVERT[dt][0]}({read})"
        if mask is None:
            return read
        return f"({self.emit(mask)} ? {read} : {self.emit(other)})"

    def flat_offset(self, index, shape) -> str:
        if not shape:
            return "0"
        terms, stride = [], 1
        for i, d in reversed(list(zip(index, shape))):
            if d != 1:
                v = self.emit(i)
                terms.append(v if stride == 1 else f"{v} * {stride}LL")
            stride *= d
        return " + ".join(reversed(terms)) or "0"

    def emit_reduce(self, e: Expr, scope: _Scope) -> str:
        rop, body, rvars = e.args
        ct = compute_type(e.dtype)
        acc = self.fresh("acc")
        body_ct = compute_type(body.dtype)
        ind = scope.indent
        if rop.startswith("arg"):
            best = self.fresh("best")
            init = "G_INF" if "min" in rop else "-G_INF" if dtypes.is_float(body.dtype) else \
                ("((long long)9223372036854775807LL)" if "min" in rop else "(-9223372036854775807LL - 1)")
            scope.lines.append(f"{ind}{body_ct} {best} = ({body_ct}){init}; i64 {acc} = -1;")
        else:
            init = {"sum": "0", "prod": "1"}.get(rop)
            if init is None:
                if dtypes.is_float(e.dtype):
                    init = "-G_INF" if rop == "max" else "G_INF"
                elif e.dtype == "bool":
                    init = "false" if rop == "max" else "true"
                else:
                    import numpy as np
                    info = np.iinfo(dtypes.np_dtype(e.dtype))
                    init = str(info.min if rop == "max" else info.max) + ("ULL" if e.dtype.startswith("uint") else "LL")
            scope.lines.append(f"{ind}{ct} {acc} = ({ct}){init};")
        # Headers go in only after the body is emitted: statements hoisted out of the loop into
        # this scope while emitting the body must come before the loop, not inside it.
        # the same test launch.row_reductions applies when it picks row mode
        cooperative = self.launch.mode in ("row", "warp") and scope is self.scopes[0] and is_cooperative(e)
        warp = self.launch.mode == "warp"
        headers, inner_indent, per_step, nibbles = [], ind, None, None
        width, vector = self._vector_loads(rvars, body) if cooperative and warp and not self.resident and self.vectors \
            else (1, [])
        if cooperative and warp and self.resident:   # the row is in registers: walk them in their order
            rr, s, u = self.resident, self.fresh("s"), self.fresh("u")
            width = rr.width
            vector = [ld for ld in walk(body) if ld in rr.reads]
            for ld in vector:
                self.vector_reads[ld] = register_read(rr, ld, ctype(ld.dtype), s, u)
            headers += [f"{ind}#pragma unroll", f"{ind}for (int {s} = 0; {s} < {rr.count}; ++{s}) {{",
                        f"{ind}  #pragma unroll", f"{ind}  for (int {u} = 0; {u} < {width}; ++{u}) {{",
                        f"{ind}    const i64 {self.rname(rvars[0])} = {rr.element(self._lane(), s, u)};"]
            inner_indent += "    "
            n_loops = 2
        elif vector:   # each thread takes `width` consecutive elements per step, read as one vector
            self.read_vectors = True
            f, u = self.fresh("f"), self.fresh("u")
            steps = -(-extent(rvars) // (32 * width))   # per lane: all its reads in flight at once
            step_bytes = max(width * dtypes.itemsize(ld.dtype) for ld in vector)
            unrolled = steps * step_bytes <= MAX_UNROLLED_VECTOR_STEPS * 16
            headers.append(f"{ind}#pragma unroll" + ("" if unrolled else " 4"))
            headers.append(f"{ind}for (i64 {f} = (i64){self._lane()} * {width}; {f} < {extent(rvars)}LL; "
                           f"{f} += {self._lanes()} * {width}) {{")
            inner_indent += "  "
            for ld in vector:
                headers += self._vector_read(ld, rvars[0], width, f, inner_indent, u)
            divided = divided_loads(self.k, rvars[0], body, width, self.deps)
            if rop == "sum":   # a block scale read once a step multiplies the step's sum, not each element
                body, per_step = per_step_factor(body, [ld for ld, c in divided if c % width == 0])
            if rop == "sum" and ct == "float":
                nibbles = nibble_dot(body, rvars[0], width, vector, divided)
            for ld, c in divided:   # a packed code's byte, a block's scale: the step's few elements at once
                headers.append(self._divided_read(ld, c, width, f, inner_indent, u))
            vector = vector + [ld for ld, _ in divided]
            if per_step is not None or nibbles is not None:
                step_sum, step_factor = self.fresh("ps"), self.fresh("sv")
                headers.append(f"{inner_indent}{ct} {step_sum} = ({ct})0" + (f", {step_factor};" if per_step is not None else ";"))
            if nibbles is not None:   # no element loop: the step's per-step values at its first element
                headers.append(f"{inner_indent}const i64 {self.rname(rvars[0])} = {f};")
                n_loops = 1
            else:
                headers.append(f"{inner_indent}#pragma unroll")
                headers.append(f"{inner_indent}for (int {u} = 0; {u} < {width}; ++{u}) {{")
                inner_indent += "  "
                headers.append(f"{inner_indent}const i64 {self.rname(rvars[0])} = {f} + {u};")
                n_loops = 2
        elif cooperative:   # the block's (warp's) threads stride over the flattened reduction range
            f = self.fresh("f")
            # loads of later iterations go out before earlier ones return (a block's argmax over
            # 50257 logits, 50 iterations a thread: 15 us on an H200 with one load in flight)
            headers.append(f"{ind}#pragma unroll 4")
            headers.append(f"{ind}for (i64 {f} = {self._lane()}; {f} < {extent(rvars)}LL; {f} += {self._lanes()}) {{")
            inner_indent += "  "
            for i, r in enumerate(rvars):
                stride = self._stride(rvars, i)
                q = f if stride == 1 else f"{f} / {stride}LL"
                val = q if i == 0 else f"{q} % {r.args[1]}LL" if r.args[1] != 1 else "0"
                headers.append(f"{inner_indent}const i64 {self.rname(r)} = {val};")
            n_loops = 1
        if not cooperative:
            for r in rvars:
                headers.append(f"{inner_indent}for (i64 {self.rname(r)} = 0; {self.rname(r)} < {r.args[1]}LL; ++{self.rname(r)}) {{")
                inner_indent += "  "
            n_loops = len(rvars)
        inner = self.push(rvars, inner_indent)
        known = []
        if vector:   # r % c with c dividing the step: the unrolled u's, known when it compiles
            for e in walk(body):
                if e.op == "mod" and e.args[0] is rvars[0] and e.args[1].is_const and width % int(e.args[1].value) == 0:
                    known.append((e, id(self.target_scope(e))))
                    self.names[known[-1]] = f"((long long)({u} % {int(e.args[1].value)}))"
        if nibbles is not None:
            inner.lines += self._nibble_step(nibbles, width, step_sum, inner_indent)
            v = step_sum
        else:
            v = self.emit(body)
        if per_step is not None:   # the factor is emitted in the element loop; its value is the step's
            inner.lines.append(f"{inner_indent}{step_factor} = {self.emit(per_step)};")
        self.scopes.pop()
        for ld in vector:   # the vectors live in this loop only
            del self.vector_reads[ld]
        for key in known:
            del self.names[key]
        scope.lines.extend(headers)
        scope.lines.extend(inner.lines)
        if nibbles is not None:
            upd = f"{acc} += {step_sum}" + (f" * {step_factor};" if per_step is not None else ";")
        elif per_step is not None:
            upd = f"{step_sum} += {v};"
        elif rop == "sum":
            upd = f"{acc} += {v};"
        elif rop == "prod":
            upd = f"{acc} *= {v};"
        elif rop in ("max", "min"):
            upd = f"{acc} = g_{rop}<{ct}>({acc}, {v});"
        else:
            flat = " + ".join(f"{self.rname(r)} * {self._stride(rvars, i)}LL" for i, r in enumerate(rvars))
            cmp = ">" if rop.startswith("argmax") else "<"
            if rop.endswith("_last"):
                cmp += "="
            upd = f"if ({acc} < 0 || {v} {cmp} {best}) {{ {best} = {v}; {acc} = {flat}; }}"
        scope.lines.append(f"{inner_indent}{upd}")
        for i in range(n_loops):
            inner_indent = inner_indent[:-2]
            scope.lines.append(f"{inner_indent}}}")
            if i == 0 and per_step is not None and nibbles is None:
                scope.lines.append(f"{inner_indent}{acc} += {step_sum} * {step_factor};")
        group = "warp" if warp else "block"
        if cooperative and rop.startswith("arg"):
            want_max, last = str(rop.startswith("argmax")).lower(), str(rop.endswith("_last")).lower()
            scope.lines.append(f"{ind}g_{group}_argreduce<{body_ct}>({best}, {acc}, {want_max}, {last});")
        elif cooperative:
            scope.lines.append(f"{ind}{acc} = g_{group}_reduce<{ct}>({acc}, g_op_{rop}());")
        if rop.startswith("arg"):
            scope.lines.append(f"{ind}if ({acc} < 0) {acc} = 0;")
        return acc

    def _vector_loads(self, rvars, body) -> tuple:
        return vector_loads(self.k, rvars, body, self.deps)

    def _nibble_step(self, nd, width: int, step_sum: str, indent: str) -> list:
        """A step of a 4-bit GEMV's dot product, eight codes a call (codegen/vectors.py NibbleDot)."""
        zero, g = self.emit(nd.zero), self.fresh("g")
        x, codes = self.vector_names[nd.x], self.vector_names[nd.codes]
        return [f"{indent}#pragma unroll", f"{indent}for (int {g} = 0; {g} < {width // 8}; ++{g})",
                f"{indent}  {step_sum} += g_dot8_q4(((const uint4*)&{x})[{g}], ((const unsigned*)&{codes})[{g}], {zero});"]

    def _divided_read(self, ld: Expr, c: int, width: int, f: str, indent: str, u: str) -> str:
        """The statement that reads step f's width // c elements of a load indexed r // c (divided_loads),
        or its one element where c is a multiple of the width; records how element u is read."""
        name, count = self.fresh("vec"), max(1, width // c)
        self.vector_names[ld] = name
        start = self.flat_offset(ld.args[1][:-1] + (const(0, "int64"),), self.k.inputs[ld.args[0]][0])
        at = f"in{ld.args[0]} + {start} + {f} / {c}LL"
        if count == 1:
            self.vector_reads[ld] = name
            return f"{indent}const {ctype(ld.dtype)} {name} = *({at});"
        vt = VECTOR_TYPE[count * dtypes.itemsize(ld.dtype)]
        self.vector_reads[ld] = f"((const {ctype(ld.dtype)}*)&{name})[{u} / {c}]"
        return f"{indent}const {vt} {name} = *(const {vt}*)({at});"

    def _vector_read(self, ld: Expr, r: Expr, width: int, f: str, indent: str, u: str) -> list:
        """The statement that reads load `ld`'s `width` elements of step f (16-byte vectors where they
        are wider: a lane's 32 halves beside 16 bytes of packed codes); records how element u is read."""
        nbytes, name = width * dtypes.itemsize(ld.dtype), self.fresh("vec")
        self.vector_names[ld] = name
        shape = self.k.inputs[ld.args[0]][0]
        tail = flat_tail(ld, r, shape, self.deps)   # the row's first element: its walked indices at 0
        start = self.flat_offset(ld.args[1][:-tail] + (const(0, "int64"),) * tail, shape)
        at = f"in{ld.args[0]} + {start} + {f}"
        self.vector_reads[ld] = f"((const {ctype(ld.dtype)}*)&{name})[{u}]"
        if nbytes <= 16:
            vt = VECTOR_TYPE[nbytes]
            return [f"{indent}const {vt} {name} = *(const {vt}*)({at});"]
        per = 16 // dtypes.itemsize(ld.dtype)
        parts = ", ".join(f"*(const uint4*)({at} + {j * per})" for j in range(nbytes // 16))
        return [f"{indent}const uint4 {name}[{nbytes // 16}] = {{{parts}}};"]

    def _lane(self) -> str:
        return "g_lane" if self.launch.mode == "warp" else "threadIdx.x"

    def _lanes(self) -> str:
        return "G_WARP" if self.launch.mode == "warp" else "blockDim.x"

    @staticmethod
    def _stride(rvars, i):
        s = 1
        for r in rvars[i + 1:]:
            s *= r.args[1]
        return s

    def render(self, name: str) -> tuple:
        """-> (kernel name, CUDA C source without the prelude)."""
        k = self.k
        params = [f"{ctype(k.dtype)}* __restrict__ out"]
        params += [f"const {ctype(dt)}* __restrict__ in{i}" for i, (_, dt) in enumerate(k.inputs)]
        lines = [f'extern "C" __global__ void {name}({", ".join(params)}) {{', "  G_AWAIT_PREDECESSOR();"]
        if self.launch.mode in ("row", "warp"):
            row = "(i64)blockIdx.x"
            if self.launch.mode == "warp":   # one row per warp; a warp past the last row has nothing to do
                row = "g_row"
                lines += ["  const i64 g_row = (i64)blockIdx.x * (blockDim.x / G_WARP) + threadIdx.x / G_WARP;",
                          f"  if (g_row >= {self.launch.rows}LL) return;",
                          "  const int g_lane = threadIdx.x % G_WARP;"]
            lines += self.row_program(row, f"out[{row} * {self.launch.cols}LL + c]")
        elif self.launch.per_thread > 1:   # elements a block's width apart: each access stays coalesced
            root = self.push((), "  ")
            each = self.push([idx(a) for a in range(len(k.shape))], "      ")
            each.lines += self._unravel("tid", range(len(k.shape)), "      ")
            v = self.emit(k.body)
            lines += root.lines
            lines += [f"  const i64 g_first = (i64)blockIdx.x * blockDim.x * {self.launch.per_thread} + threadIdx.x;",
                      "  #pragma unroll",
                      f"  for (int g_u = 0; g_u < {self.launch.per_thread}; ++g_u) {{",
                      "    const i64 tid = g_first + (i64)g_u * blockDim.x;",
                      f"    if (tid < {k.size}LL) {{"]
            lines += each.lines
            lines += [f"      out[tid] = {self._store(v)};", "    }", "  }"]
        else:
            root = self.push((), "  ")
            lines += ["  const i64 tid = (i64)blockIdx.x * blockDim.x + threadIdx.x;",
                      f"  if (tid >= {k.size}LL) return;"]
            lines += self._unravel("tid", range(len(k.shape)))
            v = self.emit(k.body)
            lines += root.lines
            lines.append(f"  out[tid] = {self._store(v)};")
        lines.append("}")
        return name, "\n".join(lines)

    def row_program(self, row: str, store_at: str) -> list:
        """Row or warp mode: the statements that compute row `row` (a flat row index) and store its
        column c at `store_at`."""
        k, split = self.k, self.launch.split
        root = self.push((), "  ")
        lines = self._unravel(row, range(split))
        self._prefetch_row_loads(split)
        if self.launch.mode == "row":
            root.lines += self._prefetch_column_loads(split)
        rr = self.resident = resident_row(k, self.launch, self.deps) if self.hold_rows else None
        for i, (slot, prefix) in enumerate(rr.rows if rr else ()):   # every row in flight at once
            start = self.flat_offset(prefix + (const(0, "int64"),), k.inputs[slot][0])
            root.lines += fill_lines(rr, i, slot, start, self._lane())
        col = self.push([idx(a) for a in range(split, len(k.shape))], "    ")
        col.lines += self._unravel("c", range(split, len(k.shape)), "    ")
        column_reads = [ld for ld in walk(k.body) if rr and ld in rr.reads and ld.args[1][-1] is idx(split)]
        for ld in column_reads:
            self.vector_reads[ld] = register_read(rr, ld, ctype(ld.dtype), "g_s", "g_u")
        v = self.emit(k.body)
        lines += root.lines
        vt = rr and stored_vector(rr, k.dtype)
        if rr:   # the columns in the order the registers hold them
            lines += ["  #pragma unroll", f"  for (int g_s = 0; g_s < {rr.count}; ++g_s) {{"]
            if vt:   # a lane's W columns are adjacent: gathered, then stored as one vector (a warp's stores coalesce)
                lines.append(f"  union {{ {ctype(k.dtype)} e[{rr.width}u]; {vt} v; }} g_ov;   /* the vector's alignment */")
            lines += ["  #pragma unroll", f"  for (int g_u = 0; g_u < {rr.width}; ++g_u) {{",
                      f"    const i64 c = {rr.element(self._lane(), 'g_s', 'g_u')};"]
        else:
            lines.append(f"  for (i64 c = {self._lane()}; c < {self.launch.cols}LL; c += {self._lanes()}) {{")
        lines += col.lines
        lines.append(f"    {'g_ov.e[g_u]' if vt else store_at} = {self._store(v)};")
        lines.append("  }")
        if vt:
            lines.append(f"  {{ const i64 c = {rr.element(self._lane(), 'g_s', '0')}; "
                         f"*({vt}*)&{store_at} = g_ov.v; }}")
        if rr:
            lines.append("  }")
        for ld in column_reads:
            del self.vector_reads[ld]
        return lines

    def _prefetch_row_loads(self, split: int):
        """Issue the row's own loads (a gemv's bias, a residual element) first, so that their latency
        overlaps the reductions instead of following them."""
        row_axes = {idx(a) for a in range(split)}
        for e in walk(self.k.body):
            if e.op == "load" and free_vars(e, self.deps) <= row_axes and not indirect_index(e):
                self.emit(e)

    def _prefetch_column_loads(self, split: int) -> list:
        """A row kernel reads its columns' own operands (LayerNorm's weight and bias) only after the
        row's reductions; ask L2 for them first, so that DRAM latency is paid while the block reduces."""
        k = self.k
        col_axes = {idx(a) for a in range(split, len(k.shape))}
        loads = [e for e in walk(k.body) if e.op == "load" and e.args[2] is None and e.args[1]
                 and free_vars(e, self.deps) & col_axes
                 and not any(v.op == "ridx" for v in free_vars(e, self.deps))
                 and not indirect_index(e)]
        if not loads:
            return []
        scope = self.push(col_axes, "    ")
        scope.lines += self._unravel("c", range(split, len(k.shape)), "    ")
        for e in loads:
            scope.lines.append(f"    G_PREFETCH(in{e.args[0]} + {self.flat_offset(e.args[1], k.inputs[e.args[0]][0])});")
        self.scopes.pop()
        return [f"  for (i64 c = {self._lane()}; c < {self.launch.cols}LL; c += {self._lanes()}) {{",
                *scope.lines, "  }"]

    def _store(self, v: str) -> str:
        if self.k.dtype in _CONVERT:
            return f"{_CONVERT[self.k.dtype][1]}({v})"
        return f"({ctype(self.k.dtype)}){v}"

    def _unravel(self, flat: str, axes, indent: str = "  ") -> list:
        """Statements defining i<a> for the given output axes from their flat index `flat`. Where the
        kernel's index space fits 32 bits the divisions are 32-bit: a 64-bit division by a constant is
        a long multiply-high sequence, a 32-bit one a multiply-high and a shift."""
        axes = [a for a in axes if self.k.shape[a] != 1]
        lines, rest = [], flat
        narrow = NARROW_INDEX and self.k.size < 2 ** 31
        for j in range(len(axes) - 1, -1, -1):
            a, d = axes[j], self.k.shape[axes[j]]
            if j == 0:
                lines.append(f"{indent}const i64 i{a} = {rest};")
            elif narrow:
                lines.append(f"{indent}const i64 i{a} = (i64)((unsigned)({rest}) % (unsigned){d});")
                lines.append(f"{indent}const i64 t{a} = (i64)((unsigned)({rest}) / (unsigned){d});")
                rest = f"t{a}"
            else:
                lines.append(f"{indent}const i64 i{a} = {rest} % {d}LL;")
                lines.append(f"{indent}const i64 t{a} = {rest} / {d}LL;")
                rest = f"t{a}"
        return lines


class ValueFunctionRenderer(CudaRenderer):
    """A kernel as a device function of (the value at slot 0, the output coordinates, the other
    slots): an attention score, a GEMM epilogue. Slot 0's load is the value itself; the function
    returns the body in float."""

    def load(self, e):
        if e.args[0] == 0:
            return "s"
        return super().load(e)

    def render_function(self, name: str, as_lambda: bool = False) -> str:
        """as_lambda: a lambda declared inside the calling kernel (which then holds every number the
        function uses, so codegen/module.py can turn them into the kernel's arguments)."""
        k = self.k
        params = ["float s"] + [f"const i64 i{a}" for a in range(len(k.shape))]
        params += [f"const {ctype(dt)}* __restrict__ in{i}" for i, (_, dt) in enumerate(k.inputs) if i > 0]
        root = self.push((), "  ")
        v = self.emit(k.body)
        head = (f"const auto {name} = [&]({', '.join(params)}) -> float {{" if as_lambda else
                f"__device__ __forceinline__ float {name}({', '.join(params)}) {{")
        return "\n".join([head, *root.lines, f"  return (float){v};", "};" if as_lambda else "}"])


class RowFunctionRenderer(CudaRenderer):
    """A kernel as a device function that one warp calls to compute one row (its leading axes) into
    `out`[0..cols): a GEMM prologue (a LayerNorm staged into shared memory). Row reductions are warp
    reductions, loads 16 bytes a lane where they run along the row (warp mode)."""

    def __init__(self, kernel: Kernel, rows: int, cols: int):
        super().__init__(kernel, row_function_launch(kernel, rows, cols))

    def render_function(self, name: str) -> str:
        k = self.k
        params = [f"{ctype(k.dtype)}* __restrict__ out", "const i64 g_row", "const int g_lane"]
        params += [f"const {ctype(dt)}* __restrict__ in{i}" for i, (_, dt) in enumerate(k.inputs)]
        return "\n".join([f"__device__ __forceinline__ void {name}({', '.join(params)}) {{",
                          *self.row_program("g_row", "out[c]"), "}"])
