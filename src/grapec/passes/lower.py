"""lower: ONNX nodes -> Kernel / Library / View / region nodes.

The same walk serves `specialize` (which only wants output shapes and constant values): lowering a
node tells its output shapes, and a node whose inputs are all constants is lowered and then run
by the CPU interpreter at once, which is how Shape/ConstantOfShape chains fold.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .. import dtypes
from ..errors import GrapecError, ShapeError, UnsupportedError
from ..ir import kernel as K
from ..ir.graph import Graph, Node, Value
from ..ir.selection import count_output_name
from ..ir.tensor import T
from ..ops import counted, lowering
from .bounds import bound_outputs
from ..ops.context import LowerCtx

# Ops whose value must never be computed at compile time (a fresh sample each run).
NONDETERMINISTIC = {"RandomUniform", "RandomNormal", "RandomUniformLike", "RandomNormalLike", "Bernoulli", "Multinomial"}


def lower_node(node: Node, graph: Graph, emitted: list, options: dict | None = None) -> list:
    """Lower one ONNX node into `emitted`; define its outputs' Values in `graph`. Returns the
    lowered nodes this call added. options: what the lowerings may choose (LowerCtx.options)."""
    fn = lowering(node.op, node.domain)
    if fn is None:
        raise UnsupportedError([f"node '{node.name}': op {node.op} is not supported"])
    start = len(emitted)
    ctx = LowerCtx(node, graph, emitted, options)
    try:
        counted.guard(ctx)
        results = fn(ctx)
    except ShapeError as e:   # name the node, where the lowering did not
        if f"'{node.name}'" in str(e) or type(e) is not ShapeError:
            raise
        raise ShapeError(f"node '{node.name}' ({node.op}) with inputs {[_describe(graph, i) for i in node.inputs]}: "
                         f"{e}") from None
    except GrapecError:
        raise
    except (ValueError, IndexError, KeyError, TypeError, AssertionError) as e:
        raise UnsupportedError([f"node '{node.name}' ({node.op}): cannot lower with inputs "
                                f"{[_describe(graph, i) for i in node.inputs]}: {type(e).__name__}: {e}"]) from e
    if not isinstance(results, (list, tuple)):
        results = [results]
    for i, name in enumerate(node.outputs):
        if not name:
            continue
        r = results[i] if i < len(results) else None
        if r is None:
            raise UnsupportedError([f"node '{node.name}' ({node.op}): output {i} ('{name}') is not produced"])
        bind_output(ctx, name, r)
    for j, counts in (ctx.out_counts or {}).items():
        graph.values[node.outputs[j]].counts = counts
    for j, bounds in ctx.out_bounds.items():
        graph.values[node.outputs[j]].bounds = bounds
    counted.propagate(ctx)
    bound_outputs(node, graph, lower_node)
    return emitted[start:]


def bind_output(ctx: LowerCtx, name: str, r):
    """Make value `name` hold r: a constant, an alias of an existing value, or a kernel's output."""
    graph = ctx.graph
    if isinstance(r, np.ndarray) or np.isscalar(r):
        arr = np.asarray(r)
        graph.values[name] = Value(name, dtypes.from_numpy(arr.dtype), tuple(arr.shape), arr)
        return
    assert isinstance(r, T), r
    if r.source == name:
        return  # the lowering wrote `name` itself (region nodes)
    graph.values[name] = Value(name, r.dtype, r.shape)
    if r.source is not None:
        ctx.emitted.append(Node("View", [r.source], [name], name=ctx.node.name, origin=[ctx.node.name]))
    else:
        ctx.emit_kernel(r, name)


def _describe(graph, name):
    v = graph.lookup(name) if name else None
    return f"{name}:{v.dtype}{list(v.shape)}" if v is not None and v.shape is not None else name


class ReadOptions(dict):
    """Lowering options that remember which of them a lowering read or added to (LowerCtx.options)."""
    def __init__(self, options: dict | None):
        super().__init__(options or {})
        self.read: set = set()

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.read.add(key)
        return super().__contains__(key)

    def setdefault(self, key, default=None):
        self.read.add(key)
        return super().setdefault(key, default)


# The one option whose value specialize and lower_graph give alike: a lowering that read any other (the
# convolution path, where notes go, a body's compile, what a data-dependent size registers) is lowered again.
SHARED_OPTIONS = {"sized_fold_limit"}


@dataclass
class LoweredForm:
    """What lower_node made of one node while specialize worked out its output shapes. lower_graph takes it
    instead of lowering the node again while the node reads what it read then: simplify and the sibling
    merge rewire inputs, replace weights (a BatchNorm folded into its Conv) and set attributes."""
    node: Node
    inputs: tuple     # the node's inputs then
    attrs: tuple      # its attributes then, (name, value) pairs, compared by identity
    reads: tuple      # the Values of its inputs then
    nodes: list       # the lowered nodes
    values: dict      # the Values the lowering defined: the node's outputs and its intermediates

    @staticmethod
    def of(node: Node, graph: Graph, emitted: list, options: ReadOptions) -> "LoweredForm | None":
        """The form of a node lowered into `graph` (a scratch graph holding only what the lowering defined),
        or None where lowering it again could differ: a body inside it, or an option read that lower_graph
        gives otherwise."""
        if node.subgraphs or options.read - SHARED_OPTIONS:
            return None
        return LoweredForm(node, tuple(node.inputs), tuple(node.attrs.items()),
                           tuple(graph.lookup(i) if i else None for i in node.inputs), list(emitted),
                           dict(graph.values))

    def holds(self, node: Node, graph: Graph) -> bool:
        """Whether lowering `node` in `graph` now would make this form again: the graph being lowered into,
        whose values an input's producer lowered again may have changed (a count's new name)."""
        return (node is self.node and tuple(node.inputs) == self.inputs and len(node.attrs) == len(self.attrs)
                and all(node.attrs.get(k, self) is v for k, v in self.attrs)
                and all(_same_value(graph.lookup(i) if i else None, v) for i, v in zip(node.inputs, self.reads)))

    def replay(self, into: Graph):
        """Add copies of the lowered nodes and their values to `into` (later passes change both in place)."""
        for name, v in self.values.items():
            into.values[name] = Value(v.name, v.dtype, v.shape, v.const, dict(v.counts) if v.counts else v.counts,
                                      v.bounds)
        into.nodes.extend(replace(n, inputs=list(n.inputs), outputs=list(n.outputs), attrs=dict(n.attrs),
                                  origin=list(n.origin)) for n in self.nodes)


def _same_value(a: Value | None, b: Value | None) -> bool:
    if a is b:
        return True
    return (a is not None and b is not None and a.dtype == b.dtype and a.shape == b.shape and a.const is b.const
            and a.counts == b.counts and a.bounds is b.bounds)


def lower_graph(graph: Graph, into: Graph | None = None, options: dict | None = None,
                forms: dict | None = None) -> Graph:
    """Lower every node of a specialized, simplified graph. Returns a new graph of lowered nodes,
    whose values include the originals (with their shapes) and the intermediates lowering made.
    forms: {id(node): LoweredForm} that specialize made; a node that still reads what it did then is
    not lowered again (lowering each node twice was a fifth of a range's per-size compile, profiled)."""
    out = into or Graph([], list(graph.inputs), list(graph.outputs), {}, graph.name, graph.parent, graph.opset)
    for name, v in graph.values.items():
        out.values[name] = Value(v.name, v.dtype, v.shape, v.const, v.counts, v.bounds)
    problems = []
    forms = forms or {}
    for node in graph.nodes:
        form = forms.get(id(node))
        if form is not None and form.holds(node, out):
            form.replay(out)
            continue
        try:
            lower_node(node, out, out.nodes, options)
        except UnsupportedError as e:
            problems.extend(e.problems)
    if problems:
        raise UnsupportedError(problems, header=f"{len(problems)} node(s) cannot be compiled")
    _count_outputs(out)
    _check_outputs(out, (options or {}).get("checks", []))
    return out


def _check_outputs(g: Graph, checks: list):
    """Each size a lowering needs exact at run time (LowerCtx.check_equals) becomes a graph output of the
    top level; one made inside a body has no output to travel by, and is refused."""
    for graph, value, name in checks:
        if graph is not g:
            continue
        if g.parent is not None:
            raise UnsupportedError([f"'{name.split('::')[0]}': a size checked at run time inside an If or Loop body "
                                    "is not supported yet"])
        _scalar_output(g, value, name, name, [])


def _count_outputs(g: Graph):
    """Each data-dependent axis of a graph output gets its count as an output of its own (named by
    count_output_name), which the session reads to trim the output (runtime/session.py). A body's
    outputs are left to the If or Loop around it (ops/control.py)."""
    for o in list(g.outputs):
        v = g.lookup(o)
        for axis, count in sorted((v.counts or {}).items()):
            name = count_output_name(o, axis)
            if g.parent is not None:   # a body: an If returns its counts itself (ops/control.py), a Loop refuses
                continue
            if count == name:   # an If's own count output (ops/control.py) already has the name
                g.outputs.append(name)
                continue
            _scalar_output(g, count, name, f"{o}/count", [o])


def _scalar_output(g: Graph, value: str, name: str, node_name: str, origin: list):
    """A graph output `name` holding a copy of the int64 scalar `value` (a count, a checked size)."""
    copy = K.Kernel((), "int64", K.load(0, (), "int64"), (((), "int64"),))
    g.nodes.append(Node("Kernel", [value], [name], name=node_name, attrs={"kernel": copy}, origin=origin))
    g.values[name] = Value(name, "int64", ())
    g.outputs.append(name)
