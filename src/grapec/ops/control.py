"""If and Loop: region nodes whose bodies are compiled like any graph (specialize ... schedule).

Bodies read enclosing values directly (ONNX scoping). Shapes must be static: both If branches
must produce the same shapes (or one is data-dependent: then both are padded to the larger and the
If returns their lengths), and Loop-carried values must keep their shape across iterations. Scan
outputs need a constant trip count M, their rows' bound; a loop that may stop early counts the rows
it wrote by its iterations (ops/counted.py). passes/predicate.py then puts the regions in the form
the backends run: on the GPU, conditional IF / WHILE nodes of the CUDA graph.
"""
from __future__ import annotations

import math

import numpy as np

from .. import dtypes
from ..errors import NeedsValueError, UnsupportedError
from ..ir.graph import Node, Value, upstream, view_source
from ..ir.selection import count_output_name
from . import op


def compile_body(ctx, body, input_shapes: dict):
    # Up a floor, on purpose: a body is a graph like any other and goes through the compiler's whole
    # pipeline, reached from lowering and from specialize's constant folding alike.
    from ..compiler.pipeline import compile_graph
    try:
        return compile_graph(body, input_shapes, parent=ctx.graph, predicated=ctx.options.get("predicated"),
                             **ctx.options.get("body", {}))
    except NeedsValueError as e:   # keep the kind: the enclosing graph may trace it to its own inputs
        raise NeedsValueError(f"in the body of node '{ctx.node.name}' ({ctx.node.op}): {e.problems[0]}",
                              e.value_name, (), e.depends_on + _outer_sources(body, e.value_name)) from None
    except UnsupportedError as e:
        raise UnsupportedError([f"in the body of node '{ctx.node.name}' ({ctx.node.op}): {p}" for p in e.problems]) from None


def _outer_sources(body, name: str) -> tuple:
    """The enclosing-scope values that `name`, a value of `body`, is computed from."""
    return tuple(sorted(n for n in upstream(body, [name]) if n not in body.values))


def _define_outputs(ctx, shapes_dtypes):
    outs = []
    for name, (shape, dtype) in zip(ctx.node.outputs, shapes_dtypes):
        if name:
            ctx.graph.values[name] = Value(name, dtype, tuple(shape))
            outs.append(ctx._load(ctx.graph.values[name]))
        else:
            outs.append(None)
    return outs


@op("If")
def if_(ctx):
    _require_single(ctx, ctx.value(0), "condition", "bool")
    try:
        branches, outs, counts = _both_branches(ctx)
    except NeedsValueError:
        raise
    except UnsupportedError as e:
        # A condition known at compile time takes one branch in specialize (passes/specialize.py);
        # here it is a run-time value. Where it follows from a small graph input (silero VAD's sample
        # rate), specialize's hint names that input and --value.
        raise NeedsValueError(f"node '{ctx.node.name}' (If): its condition '{ctx.node.inputs[0]}' is known only at "
                              "run time, so both branches must compile for these shapes and agree, but "
                              f"{e.problems[0]}", ctx.node.inputs[0]) from None
    extra = [c for name in ctx.node.outputs if name in counts for c in counts[name].values()]
    results = _define_outputs(ctx, outs[:len(ctx.node.outputs)])
    for c in extra:   # each branch's lengths of its varying outputs: the If's counts of them
        ctx.graph.values[c] = Value(c, "int64", ())
    ctx.out_counts = {j: counts[name] for j, name in enumerate(ctx.node.outputs) if name in counts} or None
    ctx.emit(Node("If", [ctx.node.inputs[0]], list(ctx.node.outputs) + extra, ctx.node.name, {}, branches))
    return results


def _both_branches(ctx) -> tuple:
    """-> ({branch name: lowered body}, [(shape, dtype) per output], {output: {axis: count output}})
    where both branches compile and their outputs agree on shapes (one set of slots serves the
    conditional node). An output whose length differs between the branches, or is data-dependent in
    one (torchvision's `if boxes.numel() == 0: return empty`), is made data-dependent: each branch
    pads it to the larger bound and also returns its length (_counted_branches)."""
    branches = {k: compile_body(ctx, ctx.node.subgraphs[k], {}) for k in BRANCHES}
    varying = _varying_outputs(branches)
    counts = {}
    if varying:
        subs, counts = _counted_branches(ctx, branches, varying)
        branches = {k: compile_body(ctx, subs[k], {}) for k in BRANCHES}
    outs = []
    for i, (t, e) in enumerate(zip(branches["then_branch"].outputs, branches["else_branch"].outputs)):
        tv, ev = branches["then_branch"].lookup(t), branches["else_branch"].lookup(e)
        if (tv.shape, tv.dtype) != (ev.shape, ev.dtype):
            raise UnsupportedError([f"output {i} has {tv.dtype}{list(tv.shape)} in then_branch but "
                                    f"{ev.dtype}{list(ev.shape)} in else_branch"])
        outs.append((tv.shape, tv.dtype))
    return branches, outs, counts


BRANCHES = ("then_branch", "else_branch")


def _varying_outputs(branches: dict) -> dict:
    """{output position: (bound shape, axes)} of the outputs that are data-dependent in a branch, where
    the other branch's length differs or is data-dependent too, or is empty (torchvision's `if
    boxes.numel() == 0: return empty`): their bound is the larger length. Two static lengths that just
    differ are left to the usual refusal, which names the input the condition comes from."""
    varying = {}
    for i, (t, e) in enumerate(zip(branches["then_branch"].outputs, branches["else_branch"].outputs)):
        tv, ev = branches["then_branch"].lookup(t), branches["else_branch"].lookup(e)
        if tv.dtype != ev.dtype or len(tv.shape) != len(ev.shape) or not (tv.counts or ev.counts):
            continue
        counted = set(tv.counts or {}) | set(ev.counts or {})
        differ = {a for a, (x, y) in enumerate(zip(tv.shape, ev.shape)) if x != y}
        if any(a not in counted and 0 not in (tv.shape[a], ev.shape[a]) for a in differ):
            continue
        axes = sorted(differ | counted)
        if axes:
            varying[i] = (tuple(max(x, y) for x, y in zip(tv.shape, ev.shape)), axes)
    return varying


def _counted_branches(ctx, compiled: dict, varying: dict) -> tuple:
    """Copies of both branch graphs in which each varying output is padded (at its end) to its bound and
    each of its varying axes' lengths is returned too: Shape of the output there, a count where it is
    data-dependent, a constant where not. -> ({branch: graph}, {If output: {axis: its count output}})."""
    subs = {}
    for k in BRANCHES:
        g = ctx.node.subgraphs[k]
        sub = type(g)(list(g.nodes), list(g.inputs), list(g.outputs), dict(g.values), g.name, g.parent, g.opset)
        extra = []
        for i, (bound, axes) in sorted(varying.items()):
            out = original = sub.outputs[i]
            shape = compiled[k].lookup(compiled[k].outputs[i]).shape
            if tuple(shape) != bound:
                padded = sub.add_value("if_padded", None, ()).name
                sub.values.pop(padded)
                if 0 in shape:   # nothing to keep: zeros of the bound's shape
                    dims = sub.add_value("if_shape", "int64", (len(bound),), np.array(bound, np.int64))
                    zero = np.zeros(1, dtypes.np_dtype(compiled[k].lookup(out).dtype))
                    sub.nodes.append(Node("ConstantOfShape", [dims.name], [padded], f"{ctx.node.name}/{k}/pad{i}",
                                          {"value": zero}))
                else:
                    pads = sub.add_value("if_pads", "int64", (2 * len(bound),),
                                         np.array([0] * len(bound) + [b - d for b, d in zip(bound, shape)], np.int64))
                    sub.nodes.append(Node("Pad", [out, pads.name], [padded], f"{ctx.node.name}/{k}/pad{i}"))
                out = sub.outputs[i] = padded
            for a in axes:
                one = sub.add_value("if_len", None, ()).name
                count = count_output_name(out, a)
                sub.values.pop(one)
                zero = sub.add_value("if_axes", "int64", (1,), np.array([0], np.int64))
                sub.nodes += [Node("Shape", [original], [one], f"{ctx.node.name}/{k}/len{i}_{a}", {"start": a, "end": a + 1}),
                              Node("Squeeze", [one, zero.name], [count], f"{ctx.node.name}/{k}/count{i}_{a}")]
                extra.append(count)
        sub.outputs = sub.outputs + extra
        subs[k] = sub
    counts = {ctx.node.outputs[i]: {a: count_output_name(ctx.node.outputs[i], a) for a in axes}
              for i, (_, axes) in sorted(varying.items())}
    return subs, counts


@op("Loop")
def loop(ctx):
    body = ctx.node.subgraphs["body"]
    n_carried = len(ctx.node.inputs) - 2
    for i, what, dtype in ((0, "trip count M", "int64"), (1, "condition", "bool")):
        if ctx.has(i):
            _require_single(ctx, ctx.value(i), what, dtype)
    if len(body.inputs) != n_carried + 2:
        ctx.fail(f"body takes {len(body.inputs)} inputs, expected {n_carried + 2} (iteration, condition, carried)")
    shapes = {body.inputs[0]: (), body.inputs[1]: ()}
    for name, dt in ((body.inputs[0], "int64"), (body.inputs[1], "bool")):
        declared = body.values[name]
        shapes[name] = tuple(declared.shape) if declared.shape and all(isinstance(d, int) for d in declared.shape) else ()
        body.values[name] = Value(name, dt, declared.shape)
    for i in range(n_carried):
        v = ctx.value(2 + i)
        name = body.inputs[2 + i]
        body.values[name] = Value(name, v.dtype, body.values[name].shape)
        shapes[name] = v.shape
    low = compile_body(ctx, body, shapes)
    _require_single(ctx, low.lookup(low.outputs[0]), "the body's condition output", "bool")
    for o in low.outputs:
        if low.lookup(o).counts:
            ctx.fail(f"its body's output '{o}' has a data-dependent size (dim {min(low.lookup(o).counts)}); "
                     "a Loop carrying one is not supported yet")
    outs = []
    for i in range(n_carried):
        init, got = ctx.value(2 + i), low.lookup(low.outputs[1 + i])
        if (got.shape, got.dtype) != (init.shape, init.dtype):
            ctx.fail(f"loop-carried value {i} ('{body.inputs[2 + i]}') changes from {init.dtype}{list(init.shape)} "
                     f"to {got.dtype}{list(got.shape)} across iterations; grapec needs fixed shapes")
        outs.append((init.shape, init.dtype))
    scans = low.outputs[1 + n_carried:]
    trips, counted = (_scan_rows(ctx, low, body) if scans else (0, False))
    for s in scans:
        v = low.lookup(s)
        outs.append(((trips,) + tuple(v.shape), v.dtype))
    results = _define_outputs(ctx, outs)
    attrs, outputs = {"n_carried": n_carried}, list(ctx.node.outputs)
    if counted:   # the rows written: the iterations the loop ran, its counter after the last (ops/counted.py)
        rows = count_output_name(ctx.node.name, 0)
        ctx.graph.values[rows] = Value(rows, "int64", ())
        attrs["iterations_output"] = rows
        outputs.append(rows)
        for j in range(n_carried, len(ctx.node.outputs)):
            if ctx.node.outputs[j]:
                ctx.count_output(j, 0, ctx._load(ctx.graph.values[rows]), trips,
                                 f"the trip count M ({trips}): the loop may stop early")
    ctx.emit(Node("Loop", list(ctx.node.inputs), outputs, ctx.node.name, attrs, {"body": low}))
    return results


def _require_single(ctx, v, what: str, dtype: str):
    """Control values are single elements of one type (ONNX: bool conditions, an int64 trip count)."""
    if v.dtype != dtype or math.prod(v.shape) != 1:
        ctx.fail(f"{what} '{v.name}' must be a single {dtype}, got {v.dtype}{list(v.shape)}")


def _scan_rows(ctx, low, body) -> tuple:
    """(rows, counted) of the scan outputs: M rows where the loop runs exactly M times; M rows at most,
    the rows the run wrote counted by its iterations, where it may stop early (a condition computed in
    the body, a run-time initial condition, or a run-time M with an upper bound: its bound's rows)."""
    if not ctx.has(0):
        ctx.fail("scan outputs need a trip count M (the bound of their rows)")
    m = ctx.value(0)
    stops = m.const is None and m.bounds is not None   # a run-time M with an upper bound (--bound)
    high = m.bounds[1] if stops else ctx.const(0, "M (trip count), needed for scan outputs as their bound", boundable=True)
    rows = int(np.asarray(high).reshape(-1)[0])
    if ctx.has(1):
        if ctx.value(1).const is None:
            stops = True
        elif not bool(ctx.value(1).const.reshape(-1)[0]):
            return 0, False
    name = view_source(low)(low.outputs[0])   # an Identity of the condition input is still the condition input
    cond_out = low.lookup(name)
    always = cond_out.const is not None and bool(cond_out.const.reshape(-1)[0])
    return rows, stops or not (always or name == body.inputs[1])
