"""schedule: the order (and later the parallel branches) in which lowered nodes run.

Now a stable topological order; plan_memory already plans for any order the DAG allows, so a
parallel scheduler can slot in without touching memory safety.
"""
from __future__ import annotations

from ..ir.graph import Graph, outer_reads


def schedule(g: Graph) -> Graph:
    prod = {o: i for i, n in enumerate(g.nodes) for o in n.outputs if o}
    deps = [{prod[x] for x in list(n.inputs) + sorted(outer_reads(n)) if x in prod and prod[x] != i}
            for i, n in enumerate(g.nodes)]
    done, order = set(), []
    pending = list(range(len(g.nodes)))
    while pending:
        rest = []
        for i in pending:
            if deps[i] <= done:
                order.append(i)
                done.add(i)
            else:
                rest.append(i)
        if len(rest) == len(pending):
            raise AssertionError("cycle in lowered graph")
        pending = rest
    # reorder in place: region bodies keep a reference to this graph as their enclosing scope
    g.nodes = [g.nodes[i] for i in order]
    return g
