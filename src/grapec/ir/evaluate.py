"""Evaluate a lowered graph on numpy inputs, node by node: Kernel, Library and View nodes through the
kernel-IR interpreter (interpret.run_node), If and Loop nodes (in the form ops/control.py emits them,
before passes/predicate.py makes their bodies write in place) with ONNX's semantics.

The arrays are the ones the CPU backend would compute for a plan of the same graph: the plan adds
only memory placement and launch order. A value is dropped after its last reader (a body's reads
of enclosing values count as reads by its If or Loop node), so memory holds what is live, and
`on_value` sees each value as it is made, a body's once per iteration: compile's half-precision
calibration compares the float32 and half runs there (compiler/mixed_precision.py), with no plan,
bundle or session.
"""
from __future__ import annotations

import numpy as np

from .. import dtypes
from .graph import Graph
from .interpret import _widen, run_kernel
from .library import run_library_into
from .small_gemm import KIND as SMALL_GEMM


def run_graph(graph: Graph, feeds: dict, on_value=None, outer=None, keep: list | None = None,
              dies: list | None = None, consts: dict | None = None) -> list:
    """-> the values named in `keep` (default: the graph's outputs), in order. feeds: graph input
    name -> array; on_value(name, array): called for every value this graph's nodes (and their
    bodies, per iteration) make, which is then dropped after its last reader unless kept; outer(name): an enclosing scope's value;
    dies: drop_after(graph, keep), when the caller runs the graph many times (a Loop's body);
    consts: the constants made contiguous so far, shared with the bodies (a bundle stores every
    weight contiguous; a pass may have left one a transposed view, slow to gather from)."""
    env = dict(feeds)
    consts = {} if consts is None else consts
    wanted = list(graph.outputs if keep is None else keep)
    dies = drop_after(graph, wanted) if dies is None else dies

    def read(name, wide: bool = False):
        if name in env:
            return env[name]
        v = graph.lookup(name)
        if v is not None and v.const is not None:
            key = (id(v), wide)   # wide: as a kernel's loads widen it (float16 -> float32), once
            if key not in consts:
                consts[key] = _widen(np.ascontiguousarray(v.const)) if wide else np.ascontiguousarray(v.const)
            return consts[key]
        if outer is not None:
            return outer(name, wide)
        raise KeyError(f"value '{name}' is read before it is made")

    def write(name, arr):
        env[name] = arr
        if on_value is not None:
            on_value(name, arr)

    for i, node in enumerate(graph.nodes):
        if node.op == "If":
            _run_if(node, read, write, consts, on_value)
        elif node.op == "Loop":
            _run_loop(node, read, write, graph, consts, on_value)
        else:
            write(node.outputs[0], run_node(node, read, graph.lookup(node.outputs[0])))
        for name in dies[i]:
            env.pop(name, None)
    return [read(o) for o in wanted]


def run_node(node, read, out):
    """A Kernel, Library or View node's output value `out`, as the CPU backend computes it into its
    buffer: a library op through its operands' and output's views (runtime/cpu/runner.py), every
    result stored in the value's type."""
    if node.op == "Kernel":
        k = node.attrs["kernel"]
        kind = getattr(k, "kind", None)
        # the kernel IR widens every load; a small GEMM computes with its weight widened (a constant:
        # widened once, not at every call, as in every step of a generation loop); other kinds as stored
        wide = [kind is None or (kind == SMALL_GEMM and i == k.a_slots) for i in range(len(node.inputs))]
        return run_kernel(k, [read(n, wide=w) for n, w in zip(node.inputs, wide)])
    if node.op == "View":
        src = read(node.inputs[0])
        if node.attrs.get("pitch"):
            src = src.reshape(-1, node.attrs["pitch"])[:, :out.shape[-1]]
        return src.reshape(out.shape)
    if node.op != "Library":
        raise ValueError(f"cannot evaluate node kind {node.op}")
    buf = np.zeros(out.shape, dtypes.np_dtype(out.dtype))
    run_library_into(node.attrs, [read(n) if n else None for n in node.inputs], buf)
    return buf


def _run_if(node, read, write, consts, on_value):
    cond = bool(np.asarray(read(node.inputs[0])).reshape(-1)[0])
    branch = node.subgraphs["then_branch" if cond else "else_branch"]
    for name, arr in zip(node.outputs, run_graph(branch, {}, on_value, outer=read, consts=consts)):
        write(name, arr)


def _run_loop(node, read, write, graph: Graph, consts, on_value):
    """ONNX Loop: for (i = 0; i < M && cond; ++i); a missing M or cond does not stop it. Scan
    outputs stack each iteration's value."""
    body = node.subgraphs["body"]
    n = node.attrs["n_carried"]
    ins = list(node.inputs) + [""] * (2 - len(node.inputs))
    trip = int(np.asarray(read(ins[0])).reshape(-1)[0]) if ins[0] else None
    cond = bool(np.asarray(read(ins[1])).reshape(-1)[0]) if ins[1] else True
    carried = [read(x) for x in node.inputs[2:2 + n]]
    scans: list = [[] for _ in body.outputs[1 + n:]]
    dies = drop_after(body, body.outputs)
    i = 0
    while cond and (trip is None or i < trip):
        feeds = {body.inputs[0]: np.full(body.lookup(body.inputs[0]).shape or (), i, np.int64),
                 body.inputs[1]: np.full(body.lookup(body.inputs[1]).shape or (), cond, bool)}
        feeds.update(zip(body.inputs[2:], carried))
        outs = run_graph(body, feeds, on_value, outer=read, dies=dies, consts=consts)
        cond = bool(np.asarray(outs[0]).reshape(-1)[0])
        carried = outs[1:1 + n]
        for acc, v in zip(scans, outs[1 + n:]):
            acc.append(v)
        i += 1
    for name, arr in zip(node.outputs, carried):
        write(name, arr)
    for name, acc in zip(node.outputs[n:], scans):   # M rows, the first i written (a counted Loop's bound)
        v = graph.lookup(name)
        rows = np.zeros(v.shape, dtypes.np_dtype(v.dtype))
        if acc:
            rows[:len(acc)] = np.stack(acc)
        write(name, rows)
    if node.attrs.get("iterations_output"):   # the rows written: ops/control.py counts scan outputs by it
        write(node.attrs["iterations_output"], np.array(i, np.int64))


def drop_after(graph: Graph, keep: list) -> list:
    """Per node of the graph, the values to drop once it has run: those it reads or makes last,
    but not the ones kept."""
    dies: list = [[] for _ in graph.nodes]
    kept = set(keep)
    for name, at in _last_reads(graph).items():
        if name not in kept:
            dies[at].append(name)
    return dies


def _last_reads(graph: Graph) -> dict:
    """value name -> index of the last node that reads it (a body's free names count for its node),
    or of the node that makes it where nothing reads it."""
    last = {}
    for i, node in enumerate(graph.nodes):
        for name in list(node.inputs) + sorted(set().union(*[_free_names(g) for g in node.subgraphs.values()])):
            if name:
                last[name] = i
        for name in node.outputs:
            if name:
                last.setdefault(name, i)
    return last


def _free_names(graph: Graph) -> set:
    """Names a graph (and its bodies) reads that it neither takes as inputs nor makes."""
    made = set(graph.inputs)
    free = set()
    for node in graph.nodes:
        for name in list(node.inputs) + sorted(set().union(*[_free_names(g) for g in node.subgraphs.values()])):
            if name and name not in made:
                free.add(name)
        made.update(o for o in node.outputs if o)
    return {n for n in free | (set(graph.outputs) - made) if graph.values.get(n) is None or graph.values[n].const is None}
