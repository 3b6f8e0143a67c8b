"""streams: the launch order of a plan's steps, and the parallel branches of its CUDA graph (Opara).

The edges first: a step waits for every earlier step it conflicts with on arena bytes
(hazards.py: the data it reads, and the bytes plan_memory let it reuse), reduced to the fewest
edges that give the same order. Steps no edge orders may run at once.

Then the branches. A CUDA graph runs every node whose predecessors are done, so an unbounded
graph would launch a whole inception block's convolutions together and let them fight for the
SMs. The scheduler instead assigns each step to one of at most `max_branches` chains (a chain's
steps wait for each other: the resource cap), in a launch order it picks among
    graph           the topological order the earlier passes left (the serial plan's order)
    opara           Opara's resource-aware order: among the ready steps, alternate compute-bound and
                    memory-bound ones, smallest SM demand first, so that kernels that run together
                    use different resources
    critical path   the ready step with the longest path to the end first (list scheduling)
by list scheduling: a step goes to the chain where it can start soonest, its predecessor's chain on
a tie. Every (order, chain count) is simulated (cost/simulate.py: kernels that run together share
SMs and bandwidth, each node pays the node gap after its predecessors), and concurrency is kept only
where it shortens the simulated replay by MIN_GAIN over one chain in the graph order; else the plan
stays one chain. Memory is unaffected: plan_memory gave bytes to two values only where every order
the data allows keeps them apart, so any branch assignment is as small as the serial plan.

Region bodies (If/Loop) stay one chain each, and a plan with host-driven regions stays one chain
(its graph is cut at each region). `grapec inspect --schedule` shows the choice and its simulated
timeline.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..cost.model import estimate
from ..cost.simulate import Task, Timeline, simulate
from ..cost.work import step_work
from .hazards import conflict_deps, reduce_deps, unordered_conflicts
from ..plan import REGIONS, chain_deps, child_step_lists, dependents, walk_steps

MAX_BRANCHES = 4
MIN_GAIN = 0.03
UNPRICED_US = 2.0   # a step the cost model does not price (a scan store): about one small kernel
ORDERS = ("graph", "opara", "critical path")


@dataclass
class StreamSchedule:
    branches: int               # chains in use (1: serial)
    order: str                  # the launch order chosen (ORDERS), or "serial"
    serial_us: float            # simulated replay of one chain in the graph order
    simulated_us: float         # simulated replay of the chosen schedule
    edges: int
    cross_branch_edges: int     # edges between steps of different chains (each a wait across branches)
    reason: str                 # why this choice, in words
    timeline: list = field(default_factory=list)   # [[start, end, branch]] per step, microseconds
    candidates: list = field(default_factory=list)  # [{order, branches, us}] every simulated choice
    applied: tuple = ()         # (order, branch, deps) as applied to the plan's steps in their built order

    def to_json(self) -> dict:
        return {"branches": self.branches, "order": self.order, "serial_us": round(self.serial_us, 2),
                "simulated_us": round(self.simulated_us, 2), "edges": self.edges,
                "cross_branch_edges": self.cross_branch_edges, "reason": self.reason, "timeline": self.timeline,
                "candidates": self.candidates}


def step_task(kernels: list, plan, step, profile) -> Task:
    """What the simulation knows of a step: its time alone and its share of the GPU."""
    work = step_work(kernels, plan, step) if not isinstance(step, REGIONS) else None
    if work is None:
        inner = [step_task(kernels, plan, s, profile).us for sub in child_step_lists(step) for s in sub]
        # a region's bodies may fill the GPU: nothing runs beside it in the simulation
        return Task(sum(inner) or UNPRICED_US, 1.0 if inner else 0.05, 0.0, False)
    est = estimate(work, profile)
    sm = work.active(profile.sms)
    memory = est.terms.get("dram_mb", 0.0) + est.terms.get("cache_mb", 0.0)
    compute = work.kind in ("gemm", "small_gemm", "attention") or est.bound == "compute"
    return Task(max(est.us, 0.1), sm, min(1.0, sm * memory / max(est.us, 1e-9)), compute)


@dataclass
class Candidate:
    order_name: str
    order: list         # the launch order: old step indices
    branch: dict        # old step index -> chain
    deps: list          # the edges, in the new order
    line: Timeline      # its simulated replay


def candidates(steps: list, buffers: list, tasks: list, gap: float, max_branches: int) -> list:
    """Every (launch order, chain count) the scheduler weighs, each with its simulated replay."""
    deps = reduce_deps(conflict_deps(steps, buffers))
    out = []
    for name in ORDERS:
        order = launch_order(name, deps, tasks, gap)
        for k in range(2, max_branches + 1):
            branch = assign_branches(order, deps, tasks, k, gap)
            new_deps = _edges(order, deps, branch)
            out.append(Candidate(name, order, branch, new_deps, simulate([tasks[i] for i in order], new_deps, gap)))
    return out


def apply_candidate(plan, cand: Candidate):
    """Reorder the plan's top-level steps and give them the candidate's edges and chains."""
    steps = plan.steps
    plan.steps = [steps[i] for i in cand.order]
    for j, st in enumerate(plan.steps):
        st.deps, st.branch = cand.deps[j], cand.branch[cand.order[j]]


def schedule_streams(plan, kernels: list, profile, max_branches: int = MAX_BRANCHES, like: tuple = ()) -> StreamSchedule:
    """Order the plan's steps and give them edges and branches (in place); the report says why.
    like: another size's `applied` (order, branch, deps), taken where the plan's steps are as many
    and it orders every reuse of their bytes (a size of a range repeating its launch structure's)."""
    for st in walk_steps(plan.steps):
        for sub in child_step_lists(st):
            _as_chain(sub)
    steps = plan.steps
    tasks = [step_task(kernels, plan, st, profile) for st in steps]
    gap = profile.node_gap_us
    serial_line = simulate(tasks, chain_deps(len(steps)), gap)
    if like and len(like[0]) == len(steps) and _replayed(plan, Candidate("pinned", *like, None)):
        line = simulate([tasks[i] for i in like[0]], like[2], gap)
        return _applied(_report(plan.steps, "pinned", serial_line, line, "its launch structure's schedule", []), like)
    serial = (list(range(len(steps))), {i: 0 for i in range(len(steps))}, chain_deps(len(steps)))
    if max_branches <= 1 or any(isinstance(st, REGIONS) and not st.graphed for st in steps):
        _as_chain(steps)
        why = "--serial: one chain" if max_branches <= 1 else "host-driven control flow cuts the graph: one chain"
        return _applied(_report(steps, "serial", serial_line, serial_line, why, []), serial)
    weighed = candidates(steps, plan.buffers, tasks, gap, max_branches)
    table = [{"order": c.order_name, "branches": len(set(c.branch.values())), "us": round(c.line.makespan, 2)}
             for c in weighed]
    best = min(weighed, key=lambda c: c.line.makespan)
    gain = 1 - best.line.makespan / serial_line.makespan if serial_line.makespan else 0.0
    if gain < MIN_GAIN:
        _as_chain(steps)
        return _applied(_report(steps, "serial", serial_line, serial_line,
                                f"no parallel schedule beats one chain by {MIN_GAIN:.0%} in simulation "
                                f"(best: {best.order_name}, {gain:+.1%})", table), serial)
    apply_candidate(plan, best)
    used = len(set(best.branch.values()))
    return _applied(_report(plan.steps, best.order_name, serial_line, best.line,
                            f"{best.order_name} order on {used} branches: {gain:.0%} shorter than one chain in "
                            f"simulation", table), (best.order, best.branch, best.deps))


def _applied(sched: StreamSchedule, applied: tuple) -> StreamSchedule:
    sched.applied = applied
    return sched


def _replayed(plan, cand: Candidate) -> bool:
    """Apply cand where it orders every reuse of the plan's bytes; else leave the plan as it was."""
    steps, kept = list(plan.steps), [(st.deps, st.branch) for st in plan.steps]
    if sorted(cand.order) != list(range(len(steps))):
        return False
    apply_candidate(plan, cand)
    if not unordered_conflicts(plan.steps, plan.buffers):
        return True
    plan.steps = steps
    for st, (deps, branch) in zip(steps, kept):
        st.deps, st.branch = deps, branch
    return False


def _as_chain(steps: list):
    for st, deps in zip(steps, chain_deps(len(steps))):
        st.deps, st.branch = deps, 0


def _edges(order: list, deps: list, branch: dict) -> list:
    """The edges in the new order: the conflicts, and each chain's steps one after another."""
    pos = {old: new for new, old in enumerate(order)}
    last: dict = {}
    out = []
    for new, old in enumerate(order):
        d = {pos[i] for i in deps[old]}
        if branch[old] in last:
            d.add(last[branch[old]])
        last[branch[old]] = new
        out.append(sorted(d))
    return reduce_deps(out)


def launch_order(name: str, deps: list, tasks: list, gap: float) -> list:
    """A topological order of the steps (ORDERS says how each picks among the ready ones)."""
    n = len(tasks)
    users, waiting = dependents(deps)
    if name == "graph":
        return list(range(n))
    rank = [0.0] * n   # the longest path from a step to the end, itself included
    for i in range(n - 1, -1, -1):
        rank[i] = tasks[i].us + max((gap + rank[u] for u in users[i]), default=0.0)
    ready = [j for j in range(n) if not waiting[j]]
    order, last_compute = [], None
    while ready:
        if name == "opara":
            other = [j for j in ready if tasks[j].compute != last_compute] or ready
            pick = min(other, key=lambda j: (tasks[j].sm, tasks[j].us, j))
            last_compute = tasks[pick].compute
        else:
            pick = max(ready, key=lambda j: (rank[j], -j))
        ready.remove(pick)
        order.append(pick)
        for u in users[pick]:
            waiting[u] -= 1
            if not waiting[u]:
                ready.append(u)
    return order


def assign_branches(order: list, deps: list, tasks: list, k: int, gap: float) -> dict:
    """List scheduling: each step, in launch order, joins the chain where it can start soonest (the
    chain of a predecessor on a tie, which saves an edge), by times alone (no sharing)."""
    finish: dict = {}
    branch: dict = {}
    tail_end = [None] * k
    for i in order:
        ready = max((finish[p] + gap for p in deps[i]), default=0.0)
        own = {branch[p] for p in deps[i]}

        def start_on(c):
            return ready if tail_end[c] is None else max(ready, tail_end[c] + gap)
        c = min(range(k), key=lambda c: (start_on(c), c not in own, c))
        finish[i] = start_on(c) + tasks[i].us
        tail_end[c] = finish[i]
        branch[i] = c
    return branch


def _report(steps, name, serial_line: Timeline, line: Timeline, reason, candidates):
    branches = [st.branch for st in steps]
    edges = sum(len(st.deps) for st in steps)
    cross = sum(1 for st in steps for d in st.deps if steps[d].branch != st.branch)
    timeline = [[round(s, 2), round(e, 2), b] for s, e, b in zip(line.start, line.end, branches)]
    return StreamSchedule(len(set(branches)) or 1, name, serial_line.makespan, line.makespan, edges, cross, reason,
                          timeline, candidates)
