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
The report compares the arena with the sum of all intermediates and with the live-set lower bound:
the most bytes simultaneously live (each tensor rounded up to the 256-byte alignment every plan
gives it) in any of several orders the DAG allows — the schedule's own, breadth-first and
depth-first. A plan that is valid under every allowed order can beat none of these peaks, so the
bound is honest; it is not always tight (the exact worst order is a hard search).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..ir.graph import Graph, outer_reads
from ..ir.kernel import Kernel, walk

ALIGN = 256


def aligned_bytes(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass
class MemoryPlan:
    offsets: dict                   # value name -> arena byte offset (aliases included)
    weights: dict                   # value name -> weight value name it aliases
    outer: dict                     # value name -> enclosing-scope value it is a View of
    arena_bytes: int
    sum_bytes: int                  # all intermediates laid end to end
    lower_bound: int                # live-set lower bound over the orders the DAG allows
    schedule_peak: int              # live-set peak in the schedule's own order
    workspaces: dict = field(default_factory=dict)   # region node index -> (offset, [body MemoryPlans])

    def report(self) -> dict:
        return {"arena_bytes": self.arena_bytes, "sum_intermediate_bytes": self.sum_bytes,
                "live_lower_bound_bytes": self.lower_bound, "schedule_order_peak_bytes": self.schedule_peak,
                "ratio_to_lower_bound": round(self.arena_bytes / self.lower_bound, 3) if self.lower_bound else 1.0}


def _place(order, conflicts, size, best_fit: bool):
    offsets: dict = {}
    for s in order:
        sz = aligned_bytes(max(size[s], 1))
        busy = sorted((offsets[c], offsets[c] + aligned_bytes(max(size[c], 1))) for c in conflicts[s] if c in offsets)
        off, best, best_gap = 0, None, None
        for o, e in busy:
            if off + sz <= o:
                if not best_fit:
                    break
                if best_gap is None or o - off < best_gap:
                    best, best_gap = off, o - off
            off = max(off, e)
        offsets[s] = best if best_fit and best is not None else off
    arena = max((offsets[s] + aligned_bytes(max(size[s], 1)) for s in order), default=0)
    return offsets, arena


def _best_placement(storages, conflicts, size, writer, readers):
    """Greedy placement under several orders (first and best fit); keep the smallest arena.
    Greedy by decreasing size alone fragments badly when tensors are few and small."""
    def last_use(s):
        return max((r for r in readers.get(s, ()) if r >= 0), default=writer[s])
    orders = [
        sorted(storages, key=lambda s: (-size[s], writer[s])),
        sorted(storages, key=lambda s: (writer[s], -size[s])),
        sorted(storages, key=lambda s: (-(last_use(s) - writer[s]), -size[s])),
        sorted(storages, key=lambda s: (-size[s] * (last_use(s) - writer[s] + 1), writer[s])),
    ]
    best = None
    for order in orders:
        for best_fit in (False, True):
            offsets, arena = _place(order, conflicts, size, best_fit)
            if best is None or arena < best[1]:
                best = (offsets, arena)
    return best


def _kahn(preds, succ, breadth_first: bool) -> list:
    """A topological order: FIFO (breadth-first, many branches in flight) or LIFO (depth-first)."""
    indeg = [len(p) for p in preds]
    ready = [i for i, d in enumerate(indeg) if d == 0]
    order = []
    while ready:
        i = ready.pop(0) if breadth_first else ready.pop()
        order.append(i)
        for j in sorted(succ[i]):
            indeg[j] -= 1
            if indeg[j] == 0:
                ready.append(j)
    return order


def _peak_live(order, storages, writer, readers, size, sink) -> int:
    pos = {node: t for t, node in enumerate(order)}
    pos[sink] = len(order)
    events: dict = {}
    for s in storages:
        start = pos[writer[s]] if writer[s] >= 0 else 0
        end = max((pos[r] for r in readers.get(s, ()) if r >= 0), default=start)
        sz = aligned_bytes(max(size[s], 1))
        events[start] = events.get(start, 0) + sz
        events[end + 1] = events.get(end + 1, 0) - sz
    live = peak = 0
    for t in sorted(events):
        live += events[t]
        peak = max(peak, live)
    return peak


def plan_memory(g: Graph, pinned: dict | None = None, loop_body: bool = False, held: tuple = ()) -> MemoryPlan:
    """pinned: body value -> value of the enclosing scope whose bytes it is given (an If branch's
    outputs, a Loop's carried values): those storages are placed by the parent, not here.
    loop_body: g is a Loop body; its inputs (iteration, condition, carried values) stay live to its
    end, because the loop writes them between iterations, and a carried output takes its input's
    bytes where every other use of the input happens-before it is written (an in-place update).
    held: outputs a caller reads while the run goes on (a generation's tokens, streamed as a Loop
    rewrites them): their bytes are theirs from the first step, never another value's before it."""
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

    # happens-before: desc[i] = nodes reachable from i (excluding i); the source reaches all
    prod = {}
    for i, node in enumerate(nodes):
        for o in node.outputs:
            if o:
                prod[o] = i
    succ = [set() for _ in range(n)]
    for i, node in enumerate(nodes):
        for name in _reads(node):
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

    if loop_body:
        n_carried = len(g.inputs) - 2
        for vin, vout in zip(g.inputs[2:], g.outputs[1:1 + n_carried]):
            if _updates_in_place(g, find, prod, desc, vin, vout):
                root[find(vout)] = find(vin)

    writer: dict = {}
    readers: dict = {}
    size: dict = {}
    for i, node in enumerate(nodes):
        if node.op != "View":
            for o in node.outputs:
                if o:
                    writer[find(o)] = i
        for name in _reads(node):
            if name and local(find(name)):
                readers.setdefault(find(name), set()).add(i)
    for name in g.inputs:
        # Inputs stay live to the end: a caller may bind an input buffer once and run many times
        # (session.input_buffer, a benchmark's replays), and a Loop body's inputs are rewritten
        # between iterations.
        writer[find(name)] = -1
        readers.setdefault(find(name), set()).add(SINK)
    for o in g.outputs:
        if local(find(o)):
            readers.setdefault(find(o), set()).add(SINK)
    for o in held:
        if o in g.outputs and local(find(o)):
            writer[find(o)] = -1
    outside = {}   # storage root -> the enclosing-scope value whose bytes it takes
    for name, parent_name in (pinned or {}).items():
        r = find(name)
        assert local(r) and outside.get(r, parent_name) == parent_name, f"{name}: cannot take {parent_name}'s bytes"
        outside[r] = parent_name

    # regions: body plans live in a workspace read and written by the region node only
    workspace_of: dict = {}
    body_plans: dict = {}
    for i, node in enumerate(nodes):
        if node.subgraphs:
            plans = _region_plans(node)
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
    storages = [r for r in writer if not is_weight(r) and r not in outside]

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

    conflicts = {x: [] for x in storages}
    for i, a in enumerate(storages):
        for b in storages[i + 1:]:
            if not (before(a, b) or before(b, a)):
                conflicts[a].append(b)
                conflicts[b].append(a)
    offsets, arena = _best_placement(storages, conflicts, size, writer, readers)

    # lower bounds: the peak of bytes live at once in the schedule's order, and in other orders the
    # DAG allows. A plan valid under every order can beat none of them, so the bound is their max.
    preds = [set() for _ in range(n)]
    for i in range(n):
        for j in succ[i]:
            preds[j].add(i)
    orders = [list(range(n)), _kahn(preds, succ, breadth_first=True), _kahn(preds, succ, breadth_first=False)]
    peaks = [_peak_live(o, storages, writer, readers, size, SINK) for o in orders]
    schedule_peak, peak = peaks[0], max(peaks)

    all_offsets: dict = {}
    weights: dict = {}
    outer: dict = {}
    names = set(g.values) | set(root)
    for name in names:
        r = find(name)
        if r in outside:
            outer[name] = outside[r]
        elif r in offsets:
            all_offsets[name] = offsets[r]
        elif is_weight(r):
            weights[name] = r
        elif not local(r) and r != name:
            outer[name] = r
    workspaces = {i: (offsets[workspace_of[i]], body_plans[i]) for i in body_plans}
    return MemoryPlan(all_offsets, weights, outer, arena, sum(size[s] for s in storages), peak, schedule_peak, workspaces)


def _reads(node) -> list:
    return list(node.inputs) + sorted(outer_reads(node))


def _region_plans(node) -> list:
    """Memory plans of a region's bodies, each told which of its values take the region's bytes:
    an If branch writes its results straight into the If's outputs; a Loop's carried values live
    in the Loop's outputs (the last iteration leaves them there)."""
    if node.op == "If":
        return [plan_memory(b, pinned={bo: po for bo, po in zip(b.outputs, node.outputs) if po})
                for b in node.subgraphs.values()]
    body = node.subgraphs["body"]
    n_carried = node.attrs["n_carried"]
    pins = {body.inputs[2 + k]: node.outputs[k] for k in range(n_carried) if node.outputs[k]}
    return [plan_memory(body, pinned=pins, loop_body=True)]


def _updates_in_place(g, find, prod, desc, vin: str, vout: str) -> bool:
    """Can a carried output share its input's bytes? Only if it is computed by one kernel or GEMM
    here, every other reader of the input happens-before that node, and the node itself reads the
    input, if at all, only element by element at the position it writes (each thread reads its own
    element before writing it)."""
    r_in, r_out = find(vin), find(vout)
    p = prod.get(r_out)
    if r_out == r_in or p is None or g.nodes[p].op not in ("Kernel", "Library"):
        return False
    aliases = {name for name in set(g.values) | {vin} if find(name) == r_in}
    for m, node in enumerate(g.nodes):
        if m != p and aliases & set(_reads(node)) and not (desc[m] >> p) & 1:
            return False
    writer = g.nodes[p]
    slots = [s for s, name in enumerate(writer.inputs) if name in aliases]
    if not slots:
        return True
    k = writer.attrs.get("kernel")
    if not isinstance(k, Kernel):   # a library call or an attention kernel: its reads are not element-wise
        return False
    for e in walk(k.body):
        if e.op == "load" and e.args[0] in slots:
            index = e.args[1]
            if k.inputs[e.args[0]][0] != tuple(k.shape) or len(index) != len(k.shape) or not all(
                    _own_position(i, axis, n) for axis, (i, n) in enumerate(zip(index, k.shape))):
                return False
    return True


def _own_position(i, axis: int, n: int) -> bool:
    """Does index expression i, on an axis of n, name the thread's own position along it? Its index
    there, or 0 where the axis has one position only (a batch of 1: the lowering writes the constant)."""
    return (i.op == "idx" and i.args[0] == axis) or (n == 1 and i.op == "const" and i.args[0] == 0)
