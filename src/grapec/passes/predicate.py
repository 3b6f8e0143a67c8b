"""predicate: control flow. An If whose condition is known at compile time is replaced by the
branch it takes; the rest stay region nodes (lowered by ops/control.py) and are listed in the
compile report with how they run.
"""
from __future__ import annotations

from ..ir.graph import Graph, Node


def predicate(g: Graph) -> Graph:
    nodes = []
    for n in g.nodes:
        cond = g.lookup(n.inputs[0]) if n.op == "If" else None
        if cond is not None and cond.const is not None and cond.const.size == 1:
            branch = n.subgraphs["then_branch" if bool(cond.const.reshape(-1)[0]) else "else_branch"]
            nodes.extend(_inline(branch, n, g))
        else:
            nodes.append(n)
    return Graph(nodes, list(g.inputs), list(g.outputs), g.values, g.name, g.parent, g.opset)


def _inline(branch: Graph, if_node: Node, g: Graph) -> list:
    for name, v in branch.values.items():
        g.values.setdefault(name, v)
    out = [Node(m.op, list(m.inputs), list(m.outputs), m.name, m.attrs, m.subgraphs, m.domain) for m in branch.nodes]
    for src, dst in zip(branch.outputs, if_node.outputs):
        if dst:
            out.append(Node("Identity", [src], [dst], f"{if_node.name}/out", {}, {}, ""))
    return out


def regions(g: Graph) -> list:
    """(node name, op) of every If/Loop that remains, for the report."""
    return [(n.name, n.op) for n in g.nodes if n.op in ("If", "Loop")]
