"""Bounds of small run-time integer tensors computed from data-dependent sizes (issue 36): a Shape of a
counted value, and the arithmetic exporters do on it (torchvision's min(candidates, count), an Expand
target built by Where(Equal(shape, -1), 1, shape)). A consumer that needs a constant shape takes the
upper bound and reads the varying elements at run time (LowerCtx.shape_param); where the bounds meet,
the value is a constant after all and folds.
"""
from __future__ import annotations

import numpy as np

from .. import dtypes
from ..ir.graph import Graph, Node, Value
from ..ir.interpret import eval_nodes

# Ops whose integer outputs are monotone in each input, or only move its elements: evaluated at the
# corners of their inputs' bounds, they bound the output (bound_outputs).
BOUNDED_OPS = {"Add", "Sub", "Mul", "Div", "Neg", "Min", "Max", "Clip", "Cast", "Ceil", "Floor", "Identity",
               "Gather", "Concat", "Slice", "Squeeze", "Unsqueeze", "Reshape", "Flatten", "ReduceMin", "ReduceMax",
               "ReduceSum", "ReduceProd", "Expand", "Tile", "Transpose"}
BOUNDED_INPUTS_MAX = 3        # corners evaluated: 2 ** this at most
BOUNDED_ELEMENTS_MAX = 64     # shape-like tensors only


def bound_outputs(node: Node, graph: Graph, lower_node):
    """Give a run-time output bounds (ir/graph.py Value.bounds) where its inputs are constants or bounded:
    a comparison or Where by interval rules, any other op of BOUNDED_OPS evaluated at every corner of
    its bounded inputs (lower_node lowers it for that). An output whose bounds meet is a constant
    (specialize folds it, LowerCtx.const reads it)."""
    if node.op in INTERVAL_OPS:
        _interval_bounds(node, graph)
        return
    if node.op not in BOUNDED_OPS:
        return
    ins = [graph.lookup(i) if i else None for i in node.inputs]
    bounded = [j for j, v in enumerate(ins) if v is not None and v.const is None]
    if not bounded or len(bounded) > BOUNDED_INPUTS_MAX or any(ins[j].bounds is None for j in bounded):
        return
    outs = [o for o in node.outputs if o and graph.lookup(o).const is None]
    if not outs or any(graph.lookup(o).dtype not in ("int64", "int32") or graph.lookup(o).nbytes > 8 * BOUNDED_ELEMENTS_MAX
                       for o in outs):
        return
    corners = []
    for corner in range(1 << len(bounded)):
        consts = {node.inputs[j]: ins[j].bounds[(corner >> b) & 1] for b, j in enumerate(bounded)}
        corners.append(_evaluated(node, graph, consts, lower_node))
    for o in outs:
        values = np.stack([c[o] for c in corners])
        graph.lookup(o).bounds = (values.min(axis=0), values.max(axis=0))   # equal: a constant (LowerCtx.const)


def _evaluated(node: Node, graph: Graph, consts: dict, lower_node) -> dict:
    """{output: array} of the node run on constant inputs (lowered in a scratch graph, interpreted)."""
    scratch = Graph([], [], [], {}, "bounds", graph, graph.opset)
    for name, arr in consts.items():
        v = graph.lookup(name)
        scratch.values[name] = Value(name, v.dtype, v.shape, np.asarray(arr, dtypes.np_dtype(v.dtype)).reshape(v.shape))
    emitted = lower_node(node, scratch, scratch.nodes)
    env = eval_nodes(emitted, scratch, {})
    return {o: np.asarray(scratch.values[o].const if scratch.values[o].const is not None else env[o]).reshape(
        scratch.values[o].shape) for o in node.outputs if o}


INTERVAL_OPS = {"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Not", "And", "Or", "Where"}


def _interval_bounds(node: Node, graph: Graph):
    """Comparisons, logic and Where by interval arithmetic: an element is known where every value in its
    inputs' ranges gives the same answer (a shape element against -1, say, is never equal)."""
    ranges = []
    for name in node.inputs:
        v = graph.lookup(name) if name else None
        if v is None or (v.const is None and v.bounds is None) or v.nbytes > 8 * BOUNDED_ELEMENTS_MAX:
            return
        ranges.append((np.asarray(v.const), np.asarray(v.const)) if v.const is not None else tuple(map(np.asarray, v.bounds)))
    out = graph.lookup(node.outputs[0])
    if out.const is not None or not any(graph.lookup(n).const is None for n in node.inputs if n):
        return
    op = node.op
    if op == "Where":
        (c_lo, c_hi), (a_lo, a_hi), (b_lo, b_hi) = ranges
        known = c_lo.astype(bool) == c_hi.astype(bool)
        pick = c_lo.astype(bool)
        low = np.where(known, np.where(pick, a_lo, b_lo), np.minimum(a_lo, b_lo))
        high = np.where(known, np.where(pick, a_hi, b_hi), np.maximum(a_hi, b_hi))
    elif op == "Not":
        low, high = ~ranges[0][1].astype(bool), ~ranges[0][0].astype(bool)
    elif op in ("And", "Or"):
        f = np.logical_and if op == "And" else np.logical_or
        low, high = f(ranges[0][0], ranges[1][0]), f(ranges[0][1], ranges[1][1])
    else:
        (a_lo, a_hi), (b_lo, b_hi) = ranges if op in ("Equal", "Less", "LessOrEqual") else ranges[::-1]
        if op == "Equal":
            sure = (a_lo == a_hi) & (b_lo == b_hi) & (a_lo == b_lo)
            never = (a_hi < b_lo) | (b_hi < a_lo)
        elif op in ("Less", "Greater"):
            sure, never = a_hi < b_lo, a_lo >= b_hi
        else:
            sure, never = a_hi <= b_lo, a_lo > b_hi
        low, high = sure, ~never
    shape = out.shape
    out.bounds = (np.broadcast_to(low, shape).astype(dtypes.np_dtype(out.dtype)),
                  np.broadcast_to(high, shape).astype(dtypes.np_dtype(out.dtype)))
