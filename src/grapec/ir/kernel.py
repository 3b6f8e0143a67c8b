"""The kernel IR: one output tensor, each element a scalar expression of its index.

A `Kernel` computes `out[i0, .., in] = body` for every index of `shape`. The body is an `Expr`
tree over:

    const(v)            a literal
    idx(a)              the a-th coordinate of the output element
    ridx(k, n)          a reduction variable running over range(n), bound by an enclosing `reduce`
    load(s, (e..), m)   element (e..) of input slot s; where mask m is false, `other` and no read
    <op>(args)          elementwise scalar ops (ELEMENTWISE below), `where`, `cast`
    reduce(op, body, (ridx..))   sum/prod/max/min/argmax/argmin of body over the ridx ranges

The same tree is evaluated by the numpy interpreter (ir/interpret.py) and rendered to CUDA C
(one thread per output element, reductions as loops). Integer `div` and `mod` follow C (truncate
toward zero), so both backends agree bit for bit on integers.

Exprs are immutable and hash-consed: building the same expression twice gives the same object,
so common subexpressions are shared and dictionary lookups are cheap.
"""
from __future__ import annotations

import math
import functools
import weakref
from dataclasses import dataclass

from .. import dtypes
from .alu import apply_op

UNARY = {
    "neg", "abs", "exp", "log", "sqrt", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh",
    "tanh", "asinh", "acosh", "atanh", "erf", "floor", "ceil", "round", "sign", "not", "bitnot",
    "isnan", "isinf", "isposinf", "isneginf", "reciprocal", "sigmoid",
}
BINARY = {
    "add", "sub", "mul", "div", "mod", "pow", "max", "min", "eq", "ne", "lt", "le", "gt", "ge",
    "and", "or", "xor", "bitand", "bitor", "bitxor", "shl", "shr", "atan2",
}
COMPARE = {"eq", "ne", "lt", "le", "gt", "ge", "isnan", "isinf", "isposinf", "isneginf"}
REDUCE = {"sum", "prod", "max", "min", "argmax", "argmin", "argmax_last", "argmin_last"}
ELEMENTWISE = UNARY | BINARY | {"where"}


class Expr:
    """A node of the scalar expression tree. Use the constructor functions below, not Expr(...)."""

    __slots__ = ("op", "args", "dtype", "_hash", "__weakref__")
    _interned = weakref.WeakValueDictionary()

    def __new__(cls, op: str, args: tuple, dtype: str):
        key = (op, args, dtype)
        hit = cls._interned.get(key)
        if hit is not None:
            return hit
        self = object.__new__(cls)
        self.op, self.args, self.dtype = op, args, dtype
        self._hash = hash(key)
        cls._interned[key] = self
        return self

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        return self is other

    def __repr__(self):
        if self.op == "const":
            return repr(self.args[0])
        if self.op == "idx":
            return f"i{self.args[0]}"
        if self.op == "ridx":
            return f"r{self.args[0]}"
        return f"{self.op}({', '.join(map(repr, self.args))})"

    # Index arithmetic reads better with operators; python numbers become constants of our dtype.
    def __add__(self, o):
        return binary("add", self, _lift(o, self.dtype))

    __radd__ = __add__

    def __sub__(self, o):
        return binary("sub", self, _lift(o, self.dtype))

    def __rsub__(self, o):
        return binary("sub", _lift(o, self.dtype), self)

    def __mul__(self, o):
        return binary("mul", self, _lift(o, self.dtype))

    __rmul__ = __mul__

    def __floordiv__(self, o):  # only for non-negative index math, where C division agrees
        return binary("div", self, _lift(o, self.dtype))

    def __mod__(self, o):
        return binary("mod", self, _lift(o, self.dtype))

    def __neg__(self):
        return unary("neg", self)

    @property
    def is_const(self) -> bool:
        return self.op == "const"

    @property
    def value(self):
        return self.args[0]


def _lift(v, dtype: str) -> Expr:
    return v if isinstance(v, Expr) else const(v, dtype)


# --- constructors ------------------------------------------------------------------------------

def const(value, dtype: str) -> Expr:
    if dtype == "bool":
        value = bool(value)
    elif dtypes.is_int(dtype):
        value = int(value)
    else:
        value = float(value)
        if math.isnan(value):
            value = float("nan")  # one canonical NaN so interning works
    return Expr("const", (value,), dtype)


def idx(axis: int) -> Expr:
    return Expr("idx", (axis,), "int64")


_ridx_counter = [0]


def ridx(size: int) -> Expr:
    """A fresh reduction variable over range(size); kernels renumber them canonically."""
    _ridx_counter[0] += 1
    return Expr("ridx", (_ridx_counter[0], int(size)), "int64")


def load(slot: int, index: tuple, dtype: str, mask: Expr | None = None, other: Expr | None = None) -> Expr:
    index = tuple(_lift(i, "int64") for i in index)
    if mask is not None:
        if mask.is_const:
            if mask.value:
                mask = None
            else:
                return other if other is not None else const(0, dtype)
        else:
            mask, index = _guarded(mask, index)
            if other is None:
                other = const(0, dtype)
    return Expr("load", (slot, index, mask, other if mask is not None else None), dtype)


def _guarded(mask: Expr, index: tuple) -> tuple:
    """(mask, index) with what the mask's conjuncts imply applied: under x < n with x >= 0, x % n is x
    and x / n is 0 (C's truncation). A pad or slice of a size's tensor reads at a wrapped index that
    the load only takes where it is in range; as a range's merged function the wrap was a division by
    a size argument per element (Wav2Vec2's positional-convolution gather). Sound because nothing is
    read where the mask is false, and a conjunct rewritten under another keeps the mask's value."""
    for _ in range(8):   # a rewrite can expose another fact; a few rounds at most
        fact = next((f for f in _facts(mask) if _wrapped(f, mask, index)), None)
        if fact is None:
            return mask, index
        x, n = fact
        table = {binary("mod", x, n): x, binary("div", x, n): const(0, x.dtype)}
        mask, index = substitute(mask, table), tuple(substitute(i, table) for i in index)
    return mask, index


def _conjuncts(e: Expr) -> list:
    out, stack = [], [e]
    while stack:
        c = stack.pop()
        if c.op == "and" and c.dtype == "bool":
            stack.extend(c.args)
        else:
            out.append(c)
    return out


def _facts(mask: Expr) -> list:
    """(x, n) for each conjunct x < n of integers whose x is known non-negative under the mask."""
    conj = _conjuncts(mask)
    known = {c.args[0] for c in conj if c.op == "ge" and c.args[1].is_const and c.args[1].value == 0}
    known |= {c.args[0] for c in conj if c.op == "gt" and c.args[1].is_const and c.args[1].value == -1}
    facts = [c.args for c in conj if c.op == "lt"] + [c.args[::-1] for c in conj if c.op == "gt"]
    return [(x, n) for x, n in facts if dtypes.is_int(x.dtype) and _nonnegative(x, known)]


def _wrapped(fact: tuple, mask: Expr, index: tuple) -> bool:
    """Whether x % n or x / n occurs in the mask or the index."""
    x, n = fact
    return any(node.op in ("mod", "div") and node.args == (x, n) for e in (mask, *index) for node in walk(e))


def _nonnegative(e: Expr, known: set) -> bool:
    """e >= 0 for every value of its variables (C's integer semantics); `known`: exprs a mask bounds below."""
    sign: dict = {}
    for node in walk(e):
        a = [sign[c] for c in children(node)]
        if node in known or node.op in ("idx", "ridx"):
            sign[node] = True
        elif node.is_const:
            sign[node] = dtypes.is_int(node.dtype) and node.value >= 0
        elif node.op in ("add", "mul", "min", "where"):
            sign[node] = all(a[1:]) if node.op == "where" else all(a)
        elif node.op == "max":
            sign[node] = any(a)
        elif node.op == "mod":   # C: the remainder takes the dividend's sign
            sign[node] = a[0]
        elif node.op in ("div", "shr"):
            sign[node] = a[0] and a[1]
        else:
            sign[node] = False
    return sign[e]


def substitute(e: Expr, table: dict) -> Expr:
    """e with each subexpression in `table` replaced by its image, rebuilt through the constructors."""
    if not any(node in table for node in walk(e)):
        return e
    memo: dict = {}
    for node in walk(e):
        memo[node] = table[node] if node in table else with_children(node, [memo[c] for c in children(node)])
    return memo[e]


def cast(x: Expr, dtype: str) -> Expr:
    if x.dtype == dtype:
        return x
    if x.is_const:
        import numpy as np
        with np.errstate(all="ignore"):
            v = np.array(x.value, dtypes.np_dtype(x.dtype)).astype(dtypes.np_dtype(dtype))
        return const(v.item(), dtype)
    return Expr("cast", (x,), dtype)


def unary(op: str, x: Expr) -> Expr:
    assert op in UNARY, op
    dtype = "bool" if op in COMPARE else x.dtype
    if x.is_const:
        return const(_eval_const(op, (x,), dtype), dtype)
    if op == "neg" and x.op == "neg":
        return x.args[0]
    return Expr(op, (x,), dtype)


def binary(op: str, a: Expr, b: Expr) -> Expr:
    assert op in BINARY, op
    assert a.dtype == b.dtype or op in ("shl", "shr"), f"{op}: {a.dtype} vs {b.dtype}"
    dtype = "bool" if op in COMPARE else a.dtype
    if a.is_const and b.is_const:
        return const(_eval_const(op, (a, b), dtype), dtype)
    simplified = _simplify_binary(op, a, b)
    if simplified is not None:
        return simplified
    if op in ("add", "mul", "max", "min", "and", "or", "eq", "ne", "bitand", "bitor", "bitxor") and a.is_const:
        a, b = b, a  # constants on the right: one canonical form for commutative ops
    return Expr(op, (a, b), dtype)


def _simplify_binary(op, a, b):
    integer = dtypes.is_int(a.dtype)
    if b.is_const:
        v = b.value
        if op in ("add", "sub") and v == 0:
            return a
        if op == "mul" and v == 1:
            return a
        if op == "mul" and v == 0 and integer:
            return b
        if op == "div" and v == 1 and integer:
            return a
        if op == "mod" and v == 1 and integer:
            return const(0, a.dtype)
    if a.is_const:
        v = a.value
        if op == "add" and v == 0:
            return b
        if op == "mul" and v == 1:
            return b
        if op == "mul" and v == 0 and integer:
            return a
    if integer and op == "add" and b.is_const and a.op == "add" and a.args[1].is_const:
        return binary("add", a.args[0], const(a.args[1].value + b.value, a.dtype))
    return None


def where(c: Expr, a: Expr, b: Expr) -> Expr:
    assert c.dtype == "bool" and a.dtype == b.dtype, (c.dtype, a.dtype, b.dtype)
    if c.is_const:
        return a if c.value else b
    if a is b:
        return a
    if a.op == "load" and a.args[2] is c and a.args[3] is b:   # the load already gives b where c is false
        return a
    return Expr("where", (c, a, b), a.dtype)


def reduce(op: str, body: Expr, rvars: tuple) -> Expr:
    assert op in REDUCE, op
    if not rvars:
        return body
    dtype = "int64" if op.startswith("arg") else body.dtype
    return Expr("reduce", (op, _unshadowed(body, frozenset(rvars)), tuple(rvars)), dtype)


def _unshadowed(body: Expr, bound: frozenset) -> Expr:
    """body with every reduce inside it that binds one of `bound` given fresh variables instead.
    The same reduce expression can be inlined into a loop over its own variable (a mask holding a
    sum over a row, pushed onto the loads of that sum: guard_loads); the inner binding would then
    shadow the outer one, which neither the interpreter nor the CUDA renderer scope, so each
    reduction keeps variables of its own (renaming a binder and what it binds changes no value)."""
    if not any(n.op == "reduce" and bound.intersection(n.args[2]) for n in walk(body)):
        return body
    memo: dict = {}
    for node in walk(body):
        new = with_children(node, [memo[c] for c in children(node)])
        if node.op == "reduce" and bound.intersection(node.args[2]):
            new = rebuild(new, ridx_map={r: ridx(r.args[1]) for r in node.args[2] if r in bound})
        memo[node] = new
    return memo[body]


# --- constant evaluation (shares numpy semantics with the interpreter) ---------------------------

def _eval_const(op, args, dtype):
    import numpy as np
    vals = [np.array(a.value, dtypes.np_dtype(a.dtype)) for a in args]
    with np.errstate(all="ignore"):
        return np.asarray(apply_op(op, vals)).astype(dtypes.np_dtype(dtype)).item()


# --- kernels -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Kernel:
    """out[idx] = body for idx in ndindex(shape). inputs[s] = (shape, dtype) of slot s.
    mapping: how threads cover the output, when the planner chose it (codegen/launch.py:
    ("element", threads per block[, elements per thread]), ("row", threads per block), ("warp", rows
    per block)); empty: the default rules pick."""

    shape: tuple
    dtype: str
    body: Expr
    inputs: tuple
    mapping: tuple = ()

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def to_json(self) -> dict:
        d = {"shape": list(self.shape), "dtype": self.dtype,
             "inputs": inputs_to_json(self.inputs), "body": expr_to_json(self.body)}
        if self.mapping:
            d["mapping"] = list(self.mapping)
        return d

    @staticmethod
    def from_json(d: dict) -> "Kernel":
        mapping = d.get("mapping") or ()
        inputs = inputs_from_json(d["inputs"])
        check_table(d["body"], len(d["shape"]), inputs)
        return Kernel(tuple(d["shape"]), d["dtype"], expr_from_json(d["body"]),
                      inputs, (str(mapping[0]), *(int(n) for n in mapping[1:])) if mapping else ())


def inputs_to_json(inputs: tuple) -> list:
    """A kernel's slots [(shape, dtype)..] as JSON (every kind of kernel stores them so)."""
    return [[list(s), d] for s, d in inputs]


def inputs_from_json(rows: list) -> tuple:
    return tuple((tuple(s), dt) for s, dt in rows)


def walk(e: Expr) -> tuple:
    """Every distinct subexpression of e, children before parents. Expressions are interned and never
    change, so the walks are remembered (the passes and the cost model walk the same bodies again and
    again: a third of a range's compile time went here); the cache is bounded."""
    return _walk(e)


@functools.lru_cache(maxsize=8192)
def _walk(e: Expr) -> tuple:
    seen, order, stack = set(), [], [(e, False)]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if node in seen:
            continue
        seen.add(node)
        stack.append((node, True))
        for c in reversed(children(node)):
            if c not in seen:
                stack.append((c, False))
    return tuple(order)


def children(e: Expr) -> list:
    if e.op in ("const", "idx", "ridx"):
        return []
    if e.op == "load":
        _, index, mask, other = e.args
        return [*index, *([mask, other] if mask is not None else [])]
    if e.op == "reduce":
        return [e.args[1], *e.args[2]]
    return list(e.args)


def expr_to_json(root: Expr) -> list:
    """A flat list of nodes, children first; references are list positions. Reduction variables
    are renumbered 0.. in order of appearance, so equal kernels serialize to equal JSON."""
    table, pos, rnum = [], {}, {}
    for e in walk(root):
        ref = lambda x: pos[x]  # noqa: E731
        if e.op == "const":
            row = ["const", e.dtype, e.value if not (isinstance(e.value, float) and not math.isfinite(e.value)) else repr(e.value)]
        elif e.op == "idx":
            row = ["idx", e.args[0]]
        elif e.op == "ridx":
            rnum.setdefault(e.args[0], len(rnum))
            row = ["ridx", rnum[e.args[0]], e.args[1]]
        elif e.op == "load":
            slot, index, mask, other = e.args
            row = ["load", e.dtype, slot, [ref(i) for i in index],
                   ref(mask) if mask is not None else None, ref(other) if other is not None else None]
        elif e.op == "reduce":
            row = ["reduce", e.args[0], ref(e.args[1]), [ref(r) for r in e.args[2]]]
        elif e.op == "cast":
            row = ["cast", e.dtype, ref(e.args[0])]
        else:
            row = [e.op, [ref(a) for a in e.args]]
        pos[e] = len(table)
        table.append(row)
    return table


MAX_EXPR_DEPTH = 200   # the interpreter recurses ~3 frames a level; grapec's kernels stay near 20 (the zoo)


def check_table(table: list, rank: int, inputs: tuple):
    """A stored expression table that expr_from_json can build and the interpreter can run: every
    reference to an earlier row, coordinates within the kernel's rank, loads of existing input slots
    with one index per input dim, and a bounded depth. Raises ValueError naming the row."""
    depth: list = []

    def refs(r: int, xs) -> int:
        if any(not isinstance(x, int) or isinstance(x, bool) or not 0 <= x < r for x in xs):
            raise ValueError(f"row {r} refers to {list(xs)}, not to rows before it")
        return 1 + max((depth[x] for x in xs), default=0)

    for r, row in enumerate(table):
        if not isinstance(row, list) or not row or not isinstance(row[0], str):
            raise ValueError(f"row {r} is not an expression row")
        op = row[0]
        if op == "const":
            d = 1
        elif op == "idx":
            if not isinstance(row[1], int) or not 0 <= row[1] < rank:
                raise ValueError(f"row {r}: coordinate {row[1]!r} of a rank-{rank} kernel")
            d = 1
        elif op == "ridx":
            if not isinstance(row[2], int) or row[2] < 0:
                raise ValueError(f"row {r}: reduction extent {row[2]!r}")
            d = 1
        elif op == "load":
            _, _, slot, index, m, o = row
            if not isinstance(slot, int) or not 0 <= slot < len(inputs):
                raise ValueError(f"row {r}: load of input {slot!r}; the kernel has {len(inputs)}")
            if len(index) != len(inputs[slot][0]):
                raise ValueError(f"row {r}: {len(index)} indices into input {slot} of rank {len(inputs[slot][0])}")
            d = refs(r, list(index) + [x for x in (m, o) if x is not None])
        elif op == "reduce":
            d = refs(r, [row[2], *row[3]])
        elif op == "cast":
            d = refs(r, [row[2]])
        else:
            d = refs(r, row[1])
        if d > MAX_EXPR_DEPTH:
            raise ValueError(f"row {r}: expression {d} deep, more than {MAX_EXPR_DEPTH}")
        depth.append(d)
    if not table:
        raise ValueError("empty expression table")


def expr_from_json(table: list) -> Expr:
    built: list[Expr] = []
    ridxs: dict = {}
    for row in table:
        op = row[0]
        if op == "const":
            v = row[2]
            built.append(const(float(v) if isinstance(v, str) else v, row[1]))
        elif op == "idx":
            built.append(idx(row[1]))
        elif op == "ridx":
            if row[1] not in ridxs:
                ridxs[row[1]] = ridx(row[2])
            built.append(ridxs[row[1]])
        elif op == "load":
            _, dt, slot, index, m, o = row
            mask = built[m] if m is not None else None
            other = built[o] if o is not None else None
            built.append(Expr("load", (slot, tuple(built[i] for i in index), mask, other), dt))
        elif op == "reduce":
            if any(built[r].op != "ridx" for r in row[3]):
                raise ValueError("a reduce runs over something other than reduction variables")
            built.append(Expr("reduce", (row[1], built[row[2]], tuple(built[r] for r in row[3])),
                              "int64" if row[1].startswith("arg") else built[row[2]].dtype))
        elif op == "cast":
            built.append(Expr("cast", (built[row[2]],), row[1]))
        else:
            args = tuple(built[a] for a in row[1])
            if op == "where":
                dt = args[1].dtype
            elif op in COMPARE:
                dt = "bool"
            else:
                dt = args[0].dtype
            built.append(Expr(op, args, dt))
    return built[-1]


def indirect_index(load: Expr) -> bool:
    """A load whose index itself reads memory or reduces (a gather through loaded indices), not one
    computed from coordinates alone."""
    return any(x.op in ("load", "reduce") for i in load.args[1] for x in walk(i))


def free_vars(e: Expr, memo: dict | None = None) -> frozenset:
    """The idx and ridx nodes e depends on; a reduce binds its own ridx."""
    memo = {} if memo is None else memo
    for node in walk(e):
        if node in memo:
            continue
        if node.op in ("idx", "ridx"):
            d = frozenset([node])
        elif node.op == "reduce":
            d = memo[node.args[1]] - frozenset(node.args[2])
        else:
            d = frozenset().union(*(memo[c] for c in children(node)))
        memo[node] = d
    return memo[e]


def rebuild(e: Expr, index: tuple | None = None, load_fn=None, ridx_map: dict | None = None) -> Expr:
    """e with idx(a) replaced by index[a], every load by load_fn(load) and each reduction variable
    in ridx_map by its image (children first), built through the constructors, so constant index
    math simplifies again."""
    memo: dict = {}
    for node in walk(e):
        if node.op == "idx":
            new = index[node.args[0]] if index is not None else node
        elif node.op == "ridx":
            new = ridx_map.get(node, node) if ridx_map else node
        else:
            kids = [memo[c] for c in children(node)]
            new = with_children(node, kids)
            # a masked load whose mask folded to false is its `other`, already rebuilt: not loaded again
            if node.op == "load" and new.op == "load" and load_fn is not None and not any(new is k for k in kids):
                new = load_fn(new)
        memo[node] = new
    return memo[e]


def with_children(node: Expr, kids: list) -> Expr:
    """node rebuilt over new children (in children()'s order) through the constructors."""
    op = node.op
    if op in ("const", "idx", "ridx"):
        return node
    if op == "load":
        slot, ix, mask, other = node.args
        n = len(ix)
        return load(slot, tuple(kids[:n]), node.dtype, *(kids[n:n + 2] if mask is not None else (None, None)))
    if op == "reduce":
        return reduce(node.args[0], kids[0], tuple(kids[1:]))
    if op == "cast":
        return cast(kids[0], node.dtype)
    if op == "where":
        return where(*kids)
    if op in UNARY:
        return unary(op, kids[0])
    return binary(op, *kids)


def is_kernel_node(node) -> bool:
    """A graph node that runs a kernel-IR Kernel (the fusion passes' material; the other kinds of
    ir/kinds.py are opaque to them)."""
    return node.op == "Kernel" and isinstance(node.attrs.get("kernel"), Kernel)
