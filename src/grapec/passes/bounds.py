"""Bounds of small run-time integer tensors computed from data-dependent sizes (issue 36): a Shape of a
counted value, and the arithmetic exporters do on it (torchvision's min(candidates, count), an Expand
target built by Where(Equal(shape, -1), 1, shape)). A consumer that needs a constant shape takes the
upper bound and reads the varying elements at run time (LowerCtx.shape_param); where the bounds meet,
the value is a constant after all and folds.
"""
from __future__ import annotations

import numpy as np

from .. import dtypes
from ..errors import GrapecError
from ..ir.graph import Graph, Node, Value
from ..ir.interpret import eval_nodes
from ..ir.selection import bound_output_name

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


def apply_user_bounds(graph: Graph, bounds: dict) -> list:
    """--bound NAME=N, for an integer tensor that sets sizes nothing else bounds (a Range limit read from
    the data, a shape, a Loop's trip count): every reader of NAME reads it clipped to [0, N] through a
    Bound node (ops/shape.py), whose bounds let the sizes it sets be allocated at N and counted at run
    time. NAME itself becomes a hidden graph output, which the session compares with N after each run:
    a run whose NAME went past N is refused by name, never returned cut short. The graph is changed in
    place. -> the manifest's record of each bound: value, bound, its output and the nodes that read it."""
    made = set(graph.inputs) | {o for n in graph.nodes for o in n.outputs if o}
    records = []
    for name, bound in bounds.items():
        if name not in made:
            raise GrapecError(f"--bound {name}={bound}: the model's main graph has no value '{name}' (give the "
                              "name of a graph input or of a node's output; `grapec inspect MODEL.onnx` lists them)")
        if not isinstance(bound, int) or bound < 0:
            raise GrapecError(f"--bound {name}={bound}: expected a whole number >= 0")
        clipped = f"{name}/bounded"
        while clipped in made or clipped in graph.values:
            clipped += "_"
        readers = [n for n in graph.nodes if _rename_reads(n, name, clipped)]
        at = next((i + 1 for i, n in enumerate(graph.nodes) if name in n.outputs), 0)
        graph.nodes.insert(at, Node("Bound", [name], [clipped], f"{name}/bound", {"bound": bound}, domain="grapec"))
        graph.nodes.append(Node("Identity", [name], [bound_output_name(name)], f"{name}/bound_check"))
        graph.outputs.append(bound_output_name(name))
        records.append({"value": name, "bound": bound, "output": bound_output_name(name),
                        "read_by": [f"node '{n.name}' ({n.op})" for n in readers]})
    return records


def _rename_reads(node: Node, old: str, new: str) -> bool:
    """Make node (and the bodies inside it) read `new` where it read `old`; whether it read it."""
    hit = old in node.inputs
    node.inputs = [new if i == old else i for i in node.inputs]
    for body in node.subgraphs.values():
        for inner in body.nodes:
            hit = _rename_reads(inner, old, new) or hit
    return hit
