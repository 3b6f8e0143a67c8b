"""What an op lowering sees: its node's inputs as lazy tensors, attributes, and ways to emit work.

A lowering is a function `f(ctx) -> list` registered with `@op("Name")` in one of the ops modules.
It returns one entry per ONNX output: a `T` (lazy tensor), a numpy array (a compile-time
constant, e.g. Shape), or None for an optional output that is absent. The driver turns each T into a
Kernel node (or a View node when it is still a plain reshape of an existing value).
"""
from __future__ import annotations

import numpy as np

from .. import dtypes
from ..errors import NeedsValueError, ShapeError, UnsupportedError
from ..ir import kernel as K
from ..ir.graph import Graph, Node, Value
from ..ir.selection import check_output_name
from ..ir.tensor import T, from_array, index_vars, substitute_loads


class LowerCtx:
    def __init__(self, node: Node, graph: Graph, emitted: list, options: dict | None = None):
        self.node = node
        # compile options lowerings read: {"conv": ops/conv.py CONV_PATHS, "notes": where to report a path taken}
        self.options = options if options is not None else {}   # the same dict: passes/lower.py ReadOptions records reads
        self.graph = graph          # the graph being built (for new values and scope lookups)
        self.emitted = emitted      # lowered nodes are appended here
        self.slot_names: list = []  # global load slot -> value name, renumbered per kernel
        self._slot_of: dict = {}
        # {output position: {axis: count value name}} for a lowering that makes data-dependent sizes
        # itself (NonZero, NonMaxSuppression); None: ops/counted.py propagates its inputs' counts
        self.out_counts: dict | None = None
        self.out_bounds: dict = {}   # {output position: (low, high)}: ir/graph.py Value.bounds
        self.counts_handled = False  # the lowering settled its outputs' counts itself (ops/counted.py skips it)

    # --- inputs ----------------------------------------------------------------------------------
    @property
    def n_inputs(self) -> int:
        return len(self.node.inputs)

    def has(self, i: int) -> bool:
        return i < len(self.node.inputs) and bool(self.node.inputs[i])

    def value(self, i: int) -> Value:
        name = self.node.inputs[i]
        v = self.graph.lookup(name)
        if v is None or v.shape is None:
            raise ShapeError(f"node '{self.node.name}' ({self.node.op}): input '{name}' has no known shape")
        return v

    def shape(self, i: int) -> tuple:
        return self.value(i).shape

    def dtype(self, i: int) -> str:
        return self.value(i).dtype

    def input(self, i: int) -> T | None:
        if not self.has(i):
            return None
        return self.tensor(self.value(i))

    def inputs(self) -> list:
        return [self.input(i) for i in range(self.n_inputs)]

    def tensor(self, v: Value) -> T:
        """A lazy load of value v (small constants are inlined as literals)."""
        load_it = lambda: self._load(v)  # noqa: E731
        if v.const is not None:
            return from_array(v.const, load_it)
        return load_it()

    def _load(self, v: Value) -> T:
        slot = self._slot_of.get(v.name)
        if slot is None:
            slot = self._slot_of[v.name] = len(self.slot_names)
            self.slot_names.append(v.name)
        dt = v.dtype
        return T(v.shape, dt, lambda ix: K.load(slot, ix, dt), source=v.name)

    def const(self, i: int, what: str | None = None, why: str = "", boundable: bool = False) -> np.ndarray | None:
        """The compile-time value of input i (None if absent). Raises if it is not a constant;
        `why` says what depends on it (e.g. "the output length"); `boundable`: an upper bound would do
        instead (the error then says how to give one: --bound, passes/bounds.py)."""
        if not self.has(i):
            return None
        v = self.value(i)
        if v.const is None and v.bounds is not None and np.array_equal(*v.bounds):
            return np.asarray(v.bounds[1])   # computed from a data-dependent size, but fixed (passes/lower.py)
        if v.const is None:
            raise NeedsValueError(f"node '{self.node.name}' ({self.node.op}): input {i} ('{what or v.name}') "
                                  f"must be known at compile time{f' ({why})' if why else ''}, but depends on "
                                  "runtime data", v.name, boundable=boundable)
        return v.const

    def shape_param(self, i: int, what: str, why: str = "") -> tuple:
        """A shape-like input (ConstantOfShape's shape, a Reshape target): (its value, {flat index: int64
        scalar T}). A constant is its own value; a run-time tensor with bounds (a shape computed from a
        data-dependent size) gives its upper bound, and the elements that vary are read at run time."""
        v = self.value(i)
        if v.const is not None or v.bounds is None:
            return self.const(i, what, why, boundable=True), {}
        low, high = (np.asarray(b).reshape(-1) for b in v.bounds)
        t = self.tensor(v)
        flat = len(v.shape) != 1
        runtime = {}
        for e in np.flatnonzero(low != high):
            index = tuple(K.const(int(c), "int64") for c in np.unravel_index(e, v.shape)) if flat else (K.const(int(e), "int64"),)
            runtime[int(e)] = T((), "int64", lambda ix, index=index: K.cast(t.at(index), "int64"))
        return np.asarray(v.bounds[1]), runtime

    def size_source(self, i: int, what: str) -> str:
        """Where the bound of a size read from input i at run time came from (inspect shows it)."""
        return f"the {what} '{self.node.inputs[i]}', computed from a data-dependent size or given a --bound"

    def attr(self, name: str, default=None):
        return self.node.attrs.get(name, default)

    def count_output(self, j: int, axis: int, count: T, bound: int, source: str):
        """Output j's `axis` is data-dependent: its shape holds `bound`, `count` (an int64 scalar T) how
        many positions are valid at run time, `source` where the bound came from (inspect shows it)."""
        name = count.source if count.source is not None else self.realize(count, "count").source
        self.out_counts = self.out_counts or {}
        self.out_counts.setdefault(j, {})[axis] = name
        self.options.setdefault("predicated", []).append(
            {"node": self.node.name, "op": self.node.op, "output": self.node.outputs[j], "axis": axis,
             "bound": bound, "source": source})

    def check_equals(self, size: T, expected: int):
        """The int64 scalar `size` must be `expected` at run time (a size only the data decides, which the
        op needs fixed): it becomes a hidden graph output the session compares after each run
        (passes/lower.py, runtime/session.py), refusing the run by this node's name otherwise."""
        name = size.source if size.source is not None else self.realize(size, "checked_size").source
        self.options.setdefault("checks", []).append((self.graph, name, check_output_name(self.node.name, expected)))

    def fail(self, why: str):
        raise UnsupportedError([f"node '{self.node.name}' ({self.node.op}): {why}"])

    # --- emitting --------------------------------------------------------------------------------
    def new_value(self, hint: str, shape, dtype: str) -> Value:
        return self.graph.add_value(hint or "t", dtype, shape)

    def kernel_for(self, t: T) -> tuple:
        """(Kernel, input value names) computing t."""
        body = t.at(index_vars(t.shape))
        local: dict = {}
        names: list = []

        def renumber(load):
            g = load.args[0]
            if g not in local:
                local[g] = len(names)
                names.append(self.slot_names[g])
            slot, index, mask, other = load.args
            return K.Expr("load", (local[g], index, mask, other), load.dtype)
        body = substitute_loads(body, renumber)
        ins = tuple((self.graph.lookup(n).shape, self.graph.lookup(n).dtype) for n in names)
        return K.Kernel(t.shape, t.dtype, body, ins), names

    def emit_kernel(self, t: T, out: str):
        kern, names = self.kernel_for(t)
        self.emitted.append(Node("Kernel", names, [out], name=self.node.name,
                                 attrs={"kernel": kern}, origin=[self.node.name]))

    def realize(self, t: T, hint: str = "") -> T:
        """Materialize t into a new value (one kernel) and return a load of it."""
        v = self.new_value(hint or self.node.op.lower(), t.shape, t.dtype)
        self.emit_kernel(t, v.name)
        return self._load(v)

    def buffer(self, t: T, hint: str = "") -> str:
        """The name of a value holding exactly t, row-major (realizing or viewing as needed)."""
        if t.source is not None:
            src = self.graph.lookup(t.source)
            if src.shape == t.shape:
                return src.name
            v = self.new_value(hint or "view", t.shape, t.dtype)
            self.emitted.append(Node("View", [src.name], [v.name], name=self.node.name, origin=[self.node.name]))
            return v.name
        return self.realize(t, hint).source

    def library(self, op: str, ins: list, attrs: dict, shape, dtype: str, hint: str = "") -> T:
        """Emit a Library node (compute-bound work: matmul, conv) and return a load of its output."""
        names = [self.buffer(t) if t is not None else "" for t in ins]
        v = self.new_value(hint or op, shape, dtype)
        self.emitted.append(Node("Library", names, [v.name], name=self.node.name,
                                 attrs={"op": op, **attrs}, origin=[self.node.name]))
        return self._load(v)

    def constant(self, arr: np.ndarray, hint: str = "const") -> T:
        """A compile-time table (e.g. Resize weights) as a weight the kernel loads."""
        arr = np.asarray(arr)
        v = self.graph.add_value(hint, np_dtype_name(arr), arr.shape, arr)
        return self.tensor(v)

    def emit(self, node: Node):
        node.origin = node.origin or [self.node.name]
        self.emitted.append(node)


def np_dtype_name(arr: np.ndarray) -> str:
    return dtypes.from_numpy(arr.dtype)
