"""specialize: give every value of the graph a concrete shape and dtype for one input-shape bucket.

Shapes come from the op lowerings themselves (ops/), so shape semantics live in one place. A node
whose inputs are all known constants is also evaluated (lowered, then run by the CPU interpreter):
with concrete input shapes, Shape -> Gather -> Concat -> Reshape chains become constants here, and
`simplify` then removes them.
"""
from __future__ import annotations

from .. import dtypes
from ..errors import ShapeError
from ..ir.graph import Graph, Value, outer_reads
from ..ir.interpret import eval_nodes
from .lower import NONDETERMINISTIC, lower_node

# Constant folding stops at this size: bigger results stay computed at run time, not stored.
FOLD_LIMIT_BYTES = 64 << 20


def specialize(graph: Graph, input_shapes: dict, parent: Graph | None = None) -> Graph:
    """A copy of `graph` with concrete shapes. input_shapes: name -> tuple of ints (all inputs)."""
    spec = Graph(list(graph.nodes), list(graph.inputs), list(graph.outputs), {}, graph.name,
                 parent if parent is not None else graph.parent, graph.opset)
    for name, v in graph.values.items():
        if v.const is not None:
            spec.values[name] = Value(name, v.dtype, v.shape, v.const)
    for name in graph.inputs:
        v = graph.values[name]
        if v.dtype is None:
            raise ShapeError(f"input '{name}' has no element type in the model")
        spec.values[name] = Value(name, v.dtype, tuple(int(d) for d in input_shapes[name]))
    for node in graph.nodes:
        specialize_node(node, spec)
    for o in spec.outputs:
        if spec.lookup(o) is None or spec.lookup(o).shape is None:
            raise ShapeError(f"graph output '{o}' is not produced by any node")
    return spec


def specialize_node(node, spec: Graph):
    scratch = Graph([], [], [], {}, "scratch", spec, spec.opset)
    emitted = lower_node(node, scratch, scratch.nodes)
    reads = [i for i in node.inputs if i] + sorted(outer_reads(node))
    foldable = (node.op not in NONDETERMINISTIC and not node.subgraphs
                and all(spec.lookup(i) is not None and spec.lookup(i).const is not None for i in reads)
                and all(scratch.values[o].const is not None or scratch.values[o].nbytes <= FOLD_LIMIT_BYTES
                        for o in node.outputs if o))
    try:
        env = eval_nodes(emitted, scratch, {}) if foldable and emitted else {}
    except Exception as e:  # a bug in a lowering or the interpreter: name the node that hit it
        raise RuntimeError(f"constant folding of node '{node.name}' ({node.op}) failed: {type(e).__name__}: {e}") from e
    for o in node.outputs:
        if not o:
            continue
        v = scratch.values[o]
        const = v.const if v.const is not None else env.get(o)
        if const is not None:
            const = const.reshape(v.shape).astype(dtypes.np_dtype(v.dtype), copy=False)
        spec.values[o] = Value(o, v.dtype, v.shape, const)
