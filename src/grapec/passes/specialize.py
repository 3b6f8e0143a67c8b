"""specialize: give every value of the graph a concrete shape and dtype for one input-shape bucket.

Shapes come from the op lowerings themselves (ops/), so shape semantics live in one place. A node
whose inputs are all known constants is also evaluated (lowered, then run by the CPU interpreter):
with concrete input shapes, Shape -> Gather -> Concat -> Reshape chains become constants here, and
`simplify` then removes them.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from .. import dtypes
from ..errors import NeedsValueError, ShapeError
from .bounds import BOUNDED_OPS
from ..ir.graph import Graph, Node, Value, outer_reads, upstream
from ..ir.interpret import eval_nodes
from .lower import NONDETERMINISTIC, LoweredForm, ReadOptions, lower_node

# Constant folding stops at this size: bigger results stay computed at run time, not stored.
FOLD_LIMIT_BYTES = 64 << 20
# ... and at this size, in a range of sizes (--dynamic), for a value computed from the graph's inputs
# (their shapes): it would be stored once per size (position embeddings gathered for seq 1..512
# would add 200 MiB to GPT-2), and a size whose plan is derived from its launch structure's
# (compiler/structures.py) has no constants of its own. A shape tensor still folds.
SIZED_FOLD_LIMIT_BYTES = 64
# A graph input this small that feeds a shape parameter is a "shape input" (as TensorRT calls it):
# its value can be fixed at compile time. A bigger one is data.
SHAPE_INPUT_MAX_ELEMENTS = 64
# Inputs an op reads for their element type only: a node folds whether or not they are constants.
# (onnxruntime's contrib rewrites cast every scalar like a run-time tensor: CastLike(0.0, keys) in a
# decode step was a kernel of its own, four a layer.)
TYPE_ONLY_INPUTS = {"CastLike": {1}}


def specialize(graph: Graph, input_shapes: dict, parent: Graph | None = None, input_values: dict | None = None,
               fold_limit: int = FOLD_LIMIT_BYTES, sized_fold_limit: int | None = None,
               forms: dict | None = None) -> Graph:
    """A copy of `graph` with concrete shapes. input_shapes: name -> tuple of ints (all inputs).
    input_values: inputs whose values are fixed at compile time (--value); they become constants
    and are no longer inputs of the specialized graph. fold_limit: the largest result (bytes)
    constant folding stores; sized_fold_limit: the largest for a value that depends on the graph's
    inputs (a body's inputs included), where it is not fold_limit. forms: filled with {id(node):
    LoweredForm} of the nodes not folded, which lower_graph then need not lower again."""
    fixed = input_values or {}
    spec = Graph(list(graph.nodes), [n for n in graph.inputs if n not in fixed], list(graph.outputs), {},
                 graph.name, parent if parent is not None else graph.parent, graph.opset)
    for name, v in graph.values.items():
        if v.const is not None:
            spec.values[name] = Value(name, v.dtype, v.shape, v.const)
    for name in graph.inputs:
        v = graph.values[name]
        if v.dtype is None:
            raise ShapeError(f"input '{name}' has no element type in the model")
        arr = fixed.get(name)
        shape = tuple(arr.shape) if arr is not None else tuple(int(d) for d in input_shapes[name])
        spec.values[name] = Value(name, v.dtype, shape, arr)
    todo = list(reversed(graph.nodes))
    spec.nodes = []
    sized = set(spec.inputs) if sized_fold_limit is not None else None   # values computed from the inputs
    while todo:
        node = todo.pop()
        taken = _taken_branch(node, spec)
        if taken is not None:   # the branch's nodes take the If's place, so its shapes need not match the other's
            todo.extend(reversed(taken))
            continue
        # a copy: later passes rewrite a node's inputs in place, and the imported graph serves every
        # bucket of the compile (a range's seq 1 once rewired the mask's reads of seq 2)
        node = replace(node, inputs=list(node.inputs), outputs=list(node.outputs), attrs=dict(node.attrs),
                       origin=list(node.origin))
        spec.nodes.append(node)
        try:
            limit = fold_limit
            if sized is not None:
                reads = set(node.inputs) | outer_reads(node)
                if reads & sized:
                    sized.update(o for o in node.outputs if o)
                    limit = min(fold_limit, sized_fold_limit)
            specialize_node(node, spec, limit, {"sized_fold_limit": sized_fold_limit} if sized is not None else None,
                            forms)
        except NeedsValueError as e:   # a body's inputs cannot be fixed: the top level names what can
            raise (e if parent is not None else _with_input_hint(e, spec)) from None
    for o in spec.outputs:
        if spec.lookup(o) is None or spec.lookup(o).shape is None:
            raise ShapeError(f"graph output '{o}' is not produced by any node")
    return spec


def _taken_branch(node, spec: Graph) -> list | None:
    """For an If whose condition is known now (exporters branch on ranks and shapes): the nodes of
    the branch it takes, then an Identity per output. None for any other node."""
    cond = spec.lookup(node.inputs[0]) if node.op == "If" else None
    if cond is None or cond.const is None or cond.const.size != 1:
        return None
    branch = node.subgraphs["then_branch" if bool(cond.const.reshape(-1)[0]) else "else_branch"]
    for name, v in branch.values.items():
        if v.const is not None:
            spec.values.setdefault(name, Value(name, v.dtype, v.shape, v.const))
    return list(branch.nodes) + [Node("Identity", [src], [dst], f"{node.name}/out", {}, {}, "")
                                 for src, dst in zip(branch.outputs, node.outputs) if dst]


def specialize_node(node, spec: Graph, fold_limit: int = FOLD_LIMIT_BYTES, options: dict | None = None,
                    forms: dict | None = None):
    scratch = Graph([], [], [], {}, "scratch", spec, spec.opset)
    options = ReadOptions(options)
    emitted = lower_node(node, scratch, scratch.nodes, options)
    type_only = TYPE_ONLY_INPUTS.get(node.op, ())
    reads = [i for j, i in enumerate(node.inputs) if i and j not in type_only] + sorted(outer_reads(node))
    foldable = (node.op not in NONDETERMINISTIC and not node.subgraphs
                and all(spec.lookup(i) is not None and spec.lookup(i).const is not None for i in reads)
                and all(scratch.values[o].const is not None or scratch.values[o].nbytes <= fold_limit
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
        if const is None and v.bounds is not None and np.array_equal(*v.bounds):   # a count's shape, all fixed
            const = np.asarray(v.bounds[1])
        if const is not None:
            const = const.reshape(v.shape).astype(dtypes.np_dtype(v.dtype), copy=False)
        spec.values[o] = Value(o, v.dtype, v.shape, const, v.counts if const is None else None,
                               v.bounds if const is None else None)
        for count in (v.counts or {}).values() if const is None else ():   # what later nodes' guards load
            if count in scratch.values:   # made by this node (one of an enclosing graph stays there)
                spec.values.setdefault(count, scratch.values[count])
    if forms is not None and any(spec.values[o].const is None for o in node.outputs if o):
        form = LoweredForm.of(node, scratch, emitted, options)
        if form is not None:
            forms[id(node)] = form


def _with_input_hint(e: NeedsValueError, spec: Graph) -> NeedsValueError:
    """Name the graph inputs a runtime shape parameter comes from, and how to fix their values; where an
    upper bound would do, also how to give one."""
    def is_const(name):
        v = spec.lookup(name)
        return v is not None and v.const is not None
    found = {n for n in upstream(spec, [e.value_name, *e.depends_on], stop=is_const) if n in spec.inputs}
    names = sorted(found)
    bound = _bound_hint(e, spec)
    if not names:
        return NeedsValueError(e.problems[0] + bound, e.value_name) if bound else e
    if any(spec.values[n].nbytes > SHAPE_INPUT_MAX_ELEMENTS * 8 for n in names):
        return NeedsValueError(f"{e.problems[0]} (it is computed from the data of graph input(s) "
                               f"{', '.join(repr(n) for n in names)}, so no compile-time value exists){bound}", e.value_name)
    hint = " ".join(f"--value {n}=..." for n in names)
    return NeedsValueError(f"{e.problems[0]}; it follows from graph input(s) {', '.join(repr(n) for n in names)}: "
                           f"fix their values at compile time with {hint}{bound}", e.value_name, names)


def _bound_hint(e: NeedsValueError, spec: Graph) -> str:
    """'; or ... --bound NAME=N' where an upper bound would do. NAME: the parameter, or the smallest
    tensor it is computed from by the ops that carry bounds (passes/bounds.py BOUNDED_OPS): a dim's
    count rather than the whole shape it is concatenated into, so only that dim is bounded."""
    if not e.boundable or e.value_name not in spec.values:
        return ""
    made_by = {o: n for n in spec.nodes for o in n.outputs if o}
    name = e.value_name
    while name in made_by and made_by[name].op in BOUNDED_OPS:
        varying = [i for i in made_by[name].inputs if i and not (spec.lookup(i) and spec.lookup(i).const is not None)]
        if len(varying) != 1 or spec.lookup(varying[0]) is None or spec.lookup(varying[0]).nbytes > spec.lookup(name).nbytes:
            break
        name = varying[0]
    return (f"; or, if it only sets sizes, give '{name}' an upper bound with --bound {name}=N (what it sizes is then "
            "allocated at N and counted at run time)")
