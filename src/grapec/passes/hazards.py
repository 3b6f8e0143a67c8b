"""hazards: which steps of a plan touch the same arena bytes, and whether the plan's edges order them.

Two steps conflict when one writes bytes the other reads or writes (read after write, write after
read, write after write). Every conflicting pair must be ordered by the plan's edges (`deps`),
directly or through other steps: then every order the edges allow, and the CUDA graph that runs
unordered steps at once, computes what the plan's own order computes. Conflicts come from data
(a step reads what another wrote) and from memory reuse (plan_memory gave two values the same
bytes, so the second's writer must wait for the first's last reader).

    footprint(step, buffers)         the arena bytes a step reads and writes; a region (If/Loop)
                                     touches what its bodies touch, and its control's scalars
    conflict_deps(steps, buffers)    for each step, the earlier steps of the list it conflicts with
    unordered_conflicts(...)         conflicting pairs the stored edges leave unordered (the
                                     happens-before checker; a sound plan has none)
    reduce_deps(deps)                the transitive reduction: the fewest edges with the same order
    random_order(steps, rng)         a topological order the edges allow (the CPU backend's test)

Weights are never written while a plan runs, so only arena buffers count.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .. import dtypes
from ..plan import IfStep, KernelStep, LibraryStep, LoopStep, ScanStoreStep, child_step_lists, dependents, step_deps


@dataclass
class Footprint:
    reads: list     # [(start, end)] arena byte intervals, merged
    writes: list

    def bounds(self) -> tuple:
        spans = self.reads + self.writes
        return (min(s for s, _ in spans), max(e for _, e in spans)) if spans else (0, 0)


def _merge(spans: list) -> list:
    out: list = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        elif e > s:
            out.append((s, e))
    return out


def _span(buffers: list, b: int, view=None) -> list:
    """The bytes of buffer b (or of the strided view of it a library step reads or writes)."""
    if b < 0 or buffers[b].space != "arena":
        return []
    buf = buffers[b]
    if view is None:
        return [(buf.offset, buf.offset + buf.nbytes)]
    offset, batch_stride, ld, shape = view
    size = dtypes.itemsize(buf.dtype)
    rows, cols = (shape[-2], shape[-1]) if len(shape) >= 2 else (1, shape[-1])
    batches = math.prod(shape[:-2])
    last = offset + (batches - 1) * batch_stride + (rows - 1) * ld + cols   # one past the last element
    return [(buf.offset + offset * size, buf.offset + last * size)]


def footprint(step, buffers: list) -> Footprint:
    reads, writes = [], []
    if isinstance(step, KernelStep):
        for a in step.args:
            reads += _span(buffers, a)
        writes += _span(buffers, step.out)
    elif isinstance(step, LibraryStep):
        views = step.attrs.get("views") or {}
        for i, a in enumerate(step.args):
            reads += _span(buffers, a, views.get(str(i)))
        writes += _span(buffers, step.out, views.get("out"))
    elif isinstance(step, ScanStoreStep):
        reads += _span(buffers, step.src) + _span(buffers, step.counter)
        writes += _span(buffers, step.dst)
    else:
        if isinstance(step, IfStep):
            reads += _span(buffers, step.cond)
        elif isinstance(step, LoopStep):
            reads += _span(buffers, step.trip) + _span(buffers, step.cond) + _span(buffers, step.cond_out)
            writes += _span(buffers, step.counter) + _span(buffers, step.cond_in)
        for sub in child_step_lists(step):
            for st in sub:
                f = footprint(st, buffers)
                reads += f.reads
                writes += f.writes
    return Footprint(_merge(reads), _merge(writes))


def _overlap(a: list, b: list) -> bool:
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i][1] <= b[j][0]:
            i += 1
        elif b[j][1] <= a[i][0]:
            j += 1
        else:
            return True
    return False


def conflicts(a: Footprint, b: Footprint) -> str:
    """'' when the two steps may run at once; else the kind of conflict (a before b)."""
    if _overlap(a.writes, b.reads):
        return "read after write"
    if _overlap(a.reads, b.writes):
        return "write after read"
    if _overlap(a.writes, b.writes):
        return "write after write"
    return ""


def conflict_deps(steps: list, buffers: list) -> list:
    """For each step, the earlier steps of the list it conflicts with (the order of the list decides
    which of a pair comes first)."""
    prints = [footprint(st, buffers) for st in steps]
    bounds = [p.bounds() for p in prints]
    deps = []
    for j, pj in enumerate(prints):
        lo, hi = bounds[j]
        deps.append([i for i in range(j) if bounds[i][0] < hi and lo < bounds[i][1] and conflicts(prints[i], pj)])
    return deps


def ancestors(deps: list) -> list:
    """anc[j]: a bitset of every step that happens-before step j through the edges."""
    anc = []
    for d in deps:
        bits = 0
        for i in d:
            bits |= (1 << i) | anc[i]
        anc.append(bits)
    return anc


def reduce_deps(deps: list) -> list:
    """Drop every edge implied by the others (the transitive reduction of a DAG in topological order)."""
    anc = ancestors(deps)
    out = []
    for d in deps:
        kept, cover = [], 0
        for i in sorted(set(d), reverse=True):   # a later dependency may imply an earlier one, never the reverse
            if not (cover >> i) & 1:
                kept.append(i)
                cover |= anc[i]
        out.append(sorted(kept))
    return out


def unordered_conflicts(steps: list, buffers: list, where: str = "") -> list:
    """Every pair of steps that touch the same arena bytes (one writing) with no path of edges
    between them, in this list and in every region body: [message]. Empty for a sound plan."""
    problems = []
    anc = ancestors(step_deps(steps))
    prints = [footprint(st, buffers) for st in steps]
    for j in range(len(steps)):
        for i in range(j):
            if (anc[j] >> i) & 1:   # ordered: the common case, and a bit test, not a walk over byte spans
                continue
            kind = conflicts(prints[i], prints[j])
            if kind:
                problems.append(f"{where}steps {i} ({_name(steps[i])}) and {j} ({_name(steps[j])}): {kind} on "
                                f"arena bytes, but no edge orders them")
    for k, st in enumerate(steps):
        for n, sub in enumerate(child_step_lists(st)):
            problems += unordered_conflicts(sub, buffers, f"{where}step {k} ({st.op}) body {n}: ")
    return problems


def _name(step) -> str:
    return f"{step.op} {step.origin[0]}" if step.origin else step.op


def random_order(steps: list, rng) -> list:
    """A topological order of the steps' edges, each ready step picked at random."""
    users, waiting = dependents(step_deps(steps))
    ready = [j for j, w in enumerate(waiting) if w == 0]
    order = []
    while ready:
        j = ready.pop(int(rng.integers(len(ready))))
        order.append(j)
        for u in users[j]:
            waiting[u] -= 1
            if waiting[u] == 0:
                ready.append(u)
    return order
