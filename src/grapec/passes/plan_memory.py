"""plan_memory: one arena; a byte offset for every intermediate, reusing bytes where it is safe.

Safety does not rest on the schedule's linear order, because later passes run independent kernels
concurrently: two tensors may share bytes only if every use of one happens-before the other's
writer in the dependency DAG (reachability), i.e. in every order the graph allows.

Terms:
  storage   a set of values sharing bytes: a value and its Views (Reshape & co. are free aliases)
  writer    the node producing the storage (graph inputs: a virtual source before every node)
  readers   nodes reading any alias; graph outputs are read by a virtual sink after every node
  region    an If/Loop node: its bodies get their own plan inside a workspace storage of the node

Placement is greedy by decreasing size, at the lowest offset free of every conflicting storage.
The report compares the arena with the sum of all intermediates and with the live-set lower bound
(the most bytes simultaneously live in the schedule's order, each tensor rounded up to the
256-byte alignment every plan gives it), which no valid plan can beat.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..ir.graph import Graph, outer_reads

ALIGN = 256


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass
class MemoryPlan:
    offsets: dict                   # value name -> arena byte offset (aliases included)
    weights: dict                   # value name -> weight value name it aliases
    outer: dict                     # value name -> enclosing-scope value it is a View of
    arena_bytes: int
    sum_bytes: int                  # all intermediates laid end to end
    lower_bound: int                # live-set lower bound in schedule order
    workspaces: dict = field(default_factory=dict)   # region node index -> (offset, [body MemoryPlans])

    def report(self) -> dict:
        return {"arena_bytes": self.arena_bytes, "sum_intermediate_bytes": self.sum_bytes,
                "live_lower_bound_bytes": self.lower_bound,
                "ratio_to_lower_bound": round(self.arena_bytes / self.lower_bound, 3) if self.lower_bound else 1.0}


def plan_memory(g: Graph) -> MemoryPlan:
    nodes = g.nodes
    n = len(nodes)
    SINK = n

    # storages: union views with their source
    root: dict = {}

    def find(name):
        while root.get(name, name) != name:
            name = root[name]
        return name
    for node in nodes:
        if node.op == "View":
            root[node.outputs[0]] = find(node.inputs[0])

    def is_weight(name):
        v = g.lookup(name)
        return v is not None and v.const is not None

    def local(name):
        return name in g.values and g.values[name].const is None

    writer: dict = {}
    readers: dict = {}
    size: dict = {}
    for name in g.inputs:
        r = find(name)
        writer[r] = -1
    for i, node in enumerate(nodes):
        if node.op != "View":
            for o in node.outputs:
                if o:
                    writer[find(o)] = i
        for name in list(node.inputs) + sorted(outer_reads(node)):
            if name and local(find(name)):
                readers.setdefault(find(name), set()).add(i)
    for o in g.outputs:
        if local(find(o)):
            readers.setdefault(find(o), set()).add(SINK)

    # regions: body plans live in a workspace read and written by the region node only
    workspace_of: dict = {}
    body_plans: dict = {}
    for i, node in enumerate(nodes):
        if node.subgraphs:
            plans = [plan_memory(b) for b in node.subgraphs.values()]
            body_plans[i] = plans
            ws = f"__workspace_{i}"
            workspace_of[i] = ws
            writer[ws] = i
            readers[ws] = {i}
            size[ws] = max((p.arena_bytes for p in plans), default=0)

    for r in writer:
        if r not in size:
            v = g.lookup(r)
            size[r] = v.nbytes
    storages = [r for r in writer if not is_weight(r)]

    # happens-before: desc[i] = nodes reachable from i (excluding i); the source reaches all
    prod = {}
    for i, node in enumerate(nodes):
        for o in node.outputs:
            if o:
                prod[o] = i
    succ = [set() for _ in range(n)]
    for i, node in enumerate(nodes):
        for name in list(node.inputs) + sorted(outer_reads(node)):
            p = prod.get(name)
            if p is not None and p != i:
                succ[p].add(i)
    desc = [0] * (n + 1)
    for i in range(n - 1, -1, -1):
        d = 1 << SINK
        for s in succ[i]:
            d |= (1 << s) | desc[s]
        desc[i] = d
    everything = (1 << (n + 1)) - 1

    after: dict = {}
    for s in storages:
        rs = readers.get(s) or {writer[s]}
        acc = everything
        for r in rs:
            acc &= desc[r] if r >= 0 else everything & ~0  # source precedes all
            if r == SINK:
                acc = 0
        after[s] = acc

    def before(a, b):
        """Every use of a happens-before b is written."""
        wb = writer[b]
        return wb >= 0 and (after[a] >> wb) & 1

    placed: list = []   # (offset, end, storage)
    offsets: dict = {}
    order = sorted(storages, key=lambda s: (-size[s], writer[s]))
    for s in order:
        sz = _align(max(size[s], 1))
        busy = sorted((o, e) for o, e, p in placed if not (before(p, s) or before(s, p)))
        off = 0
        for o, e in busy:
            if off + sz <= o:
                break
            off = max(off, e)
        offsets[s] = off
        placed.append((off, off + sz, s))
    arena = max((e for _, e, _ in placed), default=0)

    # lower bound: peak of bytes live at once in the schedule's order
    events: dict = {}
    for s in storages:
        start = max(writer[s], 0)
        end = max((r for r in readers.get(s, {writer[s]}) if r >= 0), default=start)
        events.setdefault(start, []).append(_align(max(size[s], 1)))
        events.setdefault(end + 1, []).append(-_align(max(size[s], 1)))
    live = peak = 0
    for t in sorted(events):
        live += sum(events[t])
        peak = max(peak, live)

    all_offsets: dict = {}
    weights: dict = {}
    outer: dict = {}
    names = set(g.values) | set(root)
    for name in names:
        r = find(name)
        if r in offsets:
            all_offsets[name] = offsets[r]
        elif is_weight(r):
            weights[name] = r
        elif not local(r) and r != name:
            outer[name] = r
    workspaces = {i: (offsets[workspace_of[i]], body_plans[i]) for i in body_plans}
    return MemoryPlan(all_offsets, weights, outer, arena, sum(size[s] for s in storages), peak, workspaces)
