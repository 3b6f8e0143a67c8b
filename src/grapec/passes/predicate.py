"""predicate: control flow.

(An If whose condition is known at compile time is already gone: `specialize` put the branch it
takes in its place.) `form_regions` puts the remaining If/Loop region nodes into the form both
backends run (plan.py, LoopStep/IfStep):

  - every value a body hands back (an If branch's results, a Loop's carried values and scan rows)
    is computed by the body itself, once, so the memory planner can give it its destination's bytes:
    an If's branches then write the If's outputs directly (no select copy), and a carried value is
    updated in its slot. Where a body passes through an enclosing value, a constant, one of its own
    inputs or a value it already returns, a copy kernel is added for it;
  - each region is marked `graphed` (a CUDA conditional IF / WHILE node: the device evaluates the
    condition, nothing returns to the host) or host-driven, with the reason; the compiler reports
    the host-driven ones and `--strict` refuses them.
"""
from __future__ import annotations

from ..ir.graph import Graph, Node, view_source
from .build_plan import copy_kernel


HOST_CONTROL = "--host-control asked for the control on the host"


def form_regions(g: Graph, host_control: bool = False) -> Graph:
    """Every region node of g, nested ones included, in the form described above."""
    for node in g.nodes:
        if node.op not in ("If", "Loop"):
            continue
        if node.op == "If":
            for key in ("then_branch", "else_branch"):
                _own_outputs(node.subgraphs[key], first=0)
        else:
            _own_outputs(node.subgraphs["body"], first=1)   # output 0, the condition, is only read
        node.attrs["graphed"] = not host_control
        node.attrs["host_reason"] = HOST_CONTROL if host_control else ""
        for body in node.subgraphs.values():
            form_regions(body, host_control)
    return g


def _own_outputs(body: Graph, first: int):
    produced = {o: n for n in body.nodes for o in n.outputs if o}
    root = view_source(body)
    taken = set()
    for k in range(first, len(body.outputs)):
        name = body.outputs[k]
        r = root(name)
        if r in produced and r not in body.inputs and r not in taken:
            taken.add(r)
            continue
        v = body.lookup(name)
        fresh = body.add_value(f"{name}_out", v.dtype, v.shape)
        body.nodes.append(Node("Kernel", [name], [fresh.name], name=f"{body.name}/{name}/copy",
                               attrs={"kernel": copy_kernel(v.shape, v.dtype)}, origin=[body.name]))
        body.outputs[k] = fresh.name
        taken.add(fresh.name)


def regions(g: Graph) -> list:
    """Every If/Loop node of g, nested ones included: (node, depth)."""
    out = []
    for n in g.nodes:
        if n.op in ("If", "Loop"):
            out.append(n)
            for body in n.subgraphs.values():
                out.extend(regions(body))
    return out
