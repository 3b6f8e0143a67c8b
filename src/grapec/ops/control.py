"""If and Loop: region nodes whose bodies are compiled like any graph (specialize ... schedule).

Bodies read enclosing values directly (ONNX scoping). Shapes must be static: both If branches
must produce the same shapes, and Loop-carried values must keep their shape across iterations.
Scan outputs need an exact trip count (a constant M and a loop that cannot stop early), since
their size is fixed in the plan. passes/predicate.py then puts the regions in the form the backends
run: on the GPU, conditional IF / WHILE nodes of the CUDA graph.
"""
from __future__ import annotations

import math

from ..errors import NeedsValueError, UnsupportedError
from ..ir.graph import Node, Value, upstream, view_source
from . import op


def compile_body(ctx, body, input_shapes: dict):
    # Up a floor, on purpose: a body is a graph like any other and goes through the compiler's whole
    # pipeline, reached from lowering and from specialize's constant folding alike.
    from ..compiler.pipeline import compile_graph
    try:
        return compile_graph(body, input_shapes, parent=ctx.graph)
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
        branches, outs = _both_branches(ctx)
    except NeedsValueError:
        raise
    except UnsupportedError as e:
        # A condition known at compile time takes one branch in specialize (passes/specialize.py);
        # here it is a run-time value. Where it follows from a small graph input (silero VAD's sample
        # rate), specialize's hint names that input and --value.
        raise NeedsValueError(f"node '{ctx.node.name}' (If): its condition '{ctx.node.inputs[0]}' is known only at "
                              "run time, so both branches must compile for these shapes and agree, but "
                              f"{e.problems[0]}", ctx.node.inputs[0]) from None
    results = _define_outputs(ctx, outs)
    ctx.emit(Node("If", [ctx.node.inputs[0]], list(ctx.node.outputs), ctx.node.name, {}, branches))
    return results


def _both_branches(ctx) -> tuple:
    """-> ({branch name: lowered body}, [(shape, dtype) per output]) where both branches compile
    and their outputs agree on shapes (one set of slots serves the conditional node)."""
    branches = {k: compile_body(ctx, ctx.node.subgraphs[k], {}) for k in ("then_branch", "else_branch")}
    outs = []
    for i, (t, e) in enumerate(zip(branches["then_branch"].outputs, branches["else_branch"].outputs)):
        tv, ev = branches["then_branch"].lookup(t), branches["else_branch"].lookup(e)
        if (tv.shape, tv.dtype) != (ev.shape, ev.dtype):
            raise UnsupportedError([f"output {i} has {tv.dtype}{list(tv.shape)} in then_branch but "
                                    f"{ev.dtype}{list(ev.shape)} in else_branch"])
        outs.append((tv.shape, tv.dtype))
    return branches, outs


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
    outs = []
    for i in range(n_carried):
        init, got = ctx.value(2 + i), low.lookup(low.outputs[1 + i])
        if (got.shape, got.dtype) != (init.shape, init.dtype):
            ctx.fail(f"loop-carried value {i} ('{body.inputs[2 + i]}') changes from {init.dtype}{list(init.shape)} "
                     f"to {got.dtype}{list(got.shape)} across iterations; grapec needs fixed shapes")
        outs.append((init.shape, init.dtype))
    scans = low.outputs[1 + n_carried:]
    if scans:
        trips = _exact_trip_count(ctx, low, body)
        for s in scans:
            v = low.lookup(s)
            outs.append(((trips,) + tuple(v.shape), v.dtype))
    results = _define_outputs(ctx, outs)
    ctx.emit(Node("Loop", list(ctx.node.inputs), list(ctx.node.outputs), ctx.node.name,
                  {"n_carried": n_carried}, {"body": low}))
    return results


def _require_single(ctx, v, what: str, dtype: str):
    """Control values are single elements of one type (ONNX: bool conditions, an int64 trip count)."""
    if v.dtype != dtype or math.prod(v.shape) != 1:
        ctx.fail(f"{what} '{v.name}' must be a single {dtype}, got {v.dtype}{list(v.shape)}")


def _exact_trip_count(ctx, low, body) -> int:
    """Scan outputs have a fixed size only if the loop runs exactly M times."""
    m = ctx.const(0, "M (trip count), needed for scan outputs") if ctx.has(0) else None
    if m is None:
        ctx.fail("scan outputs need a trip count M")
    if ctx.has(1):
        c = ctx.const(1, "cond, needed for scan outputs")
        if not bool(c.reshape(-1)[0]):
            return 0
    name = view_source(low)(low.outputs[0])   # an Identity of the condition input is still the condition input
    cond_out = low.lookup(name)
    always = cond_out.const is not None and bool(cond_out.const.reshape(-1)[0])
    if not (always or name == body.inputs[1]):
        ctx.fail("scan outputs with a loop that may stop early (data-dependent length) are not supported")
    return int(m.reshape(-1)[0])
