"""How many rows of a NonMaxSuppression's output the model reads: detectors keep the first E
(torchvision's `keep[:detections_per_img]` after `batched_nms`, often outside the If that guards
it), so the greedy walk may stop at E selections a class instead of suppressing every box.

The rows are ordered by batch, class, then selection, so the first E rows never hold a class's
selections past its E-th: capping each class at E leaves them unchanged. The cap is given to the
node as the attribute ROWS_READ (ops/selection.py reads it), where the output reaches a Slice of
its first E rows through ops that keep its rows in place and that nothing else reads.
"""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Node, outer_reads
from ..ir.selection import ROWS_READ


def cap_nms_at_rows_read(graph: Graph):
    """Set ROWS_READ on every NonMaxSuppression (in any body) whose output only a first-rows Slice reads.
    Changes the nodes in place: the cap follows from the graph, so every bucket's compile agrees."""
    for g, node in _nodes_with_graphs(graph):
        if node.op == "NonMaxSuppression":
            rows = _first_rows_read(g, node.outputs[0])
            if rows is not None:
                node.attrs[ROWS_READ] = rows


def _nodes_with_graphs(g: Graph):
    for node in g.nodes:
        yield g, node
        for body in node.subgraphs.values():
            yield from _nodes_with_graphs(body)


def _first_rows_read(g: Graph, value: str) -> int | None:
    """E, where `value`'s rows reach a Slice of the first E through row-keeping ops alone; else None."""
    while True:
        readers = [n for n in g.nodes if value in n.inputs]
        if any(value in _inner_reads(n) for n in g.nodes):
            return None
        if value in g.outputs:   # a branch's output: follow the If's output in the enclosing graph
            holder = _holder(g)
            if readers or holder is None or holder.op != "If":
                return None
            g, value = g.parent, holder.outputs[g.outputs.index(value)]
            continue
        if len(readers) != 1:
            return None
        node = readers[0]
        if node.op == "Slice" and node.inputs[0] == value:
            return _first_rows_of_slice(g, node)
        if not _keeps_rows(g, node, value):
            return None
        value = node.outputs[0]


def _keeps_rows(g: Graph, node: Node, value: str) -> bool:
    """Whether `node` maps row i of `value` to row i of its output (a column of it, its type changed)."""
    if node.inputs[0] != value or any(i == value for i in node.inputs[1:]):
        return False
    if node.op in ("Identity", "Cast"):
        return True
    if node.op == "Gather":
        return node.attrs.get("axis", 0) == 1
    if node.op in ("Squeeze", "Unsqueeze"):
        axes = node.attrs.get("axes") if "axes" in node.attrs else _constant(g, node.inputs[1]) if len(node.inputs) > 1 else None
        return axes is not None and 0 not in [int(a) for a in np.asarray(axes).reshape(-1)]
    return False


def _first_rows_of_slice(g: Graph, node: Node) -> int | None:
    """E for a Slice of [0, E) along axis 0, step 1 (constants); None for any other cut."""
    starts, ends = (_constant(g, node.inputs[i]) for i in (1, 2))
    axes = _constant(g, node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] else np.array([0])
    steps = _constant(g, node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] else np.array([1])
    if any(c is None for c in (starts, ends, axes, steps)):
        return None
    starts, ends, axes, steps = (np.asarray(c).reshape(-1).tolist() for c in (starts, ends, axes, steps))
    if axes != [0] or starts != [0] or steps != [1] or ends[0] < 0:
        return None
    return int(ends[0])


def _constant(g: Graph, name: str):
    """The compile-time value of `name`: an initializer, or a Constant node's value; else None."""
    v = g.lookup(name)
    if v is not None and v.const is not None:
        return v.const
    while g is not None:
        for n in g.nodes:
            if n.op == "Constant" and n.outputs and n.outputs[0] == name:
                for key in ("value", "value_ints", "value_int"):
                    if key in n.attrs:
                        return np.asarray(n.attrs[key])
                return None
        g = g.parent
    return None


def _inner_reads(node: Node) -> set:
    """Names the bodies inside `node` read from outside them."""
    return outer_reads(node) if node.subgraphs else set()


def _holder(body: Graph) -> Node | None:
    """The node of the enclosing graph that holds `body`."""
    parent = body.parent
    if parent is None:
        return None
    return next((n for n in parent.nodes if any(b is body for b in n.subgraphs.values())), None)
