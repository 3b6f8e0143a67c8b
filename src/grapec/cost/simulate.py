"""A CUDA graph's replay, simulated: when each node starts and ends, given the edges between nodes,
each node's time alone (cost/model.py) and what share of the GPU it occupies.

The rules, kept few so that the stream scheduler (passes/streams.py) can run them many times:
  - a node starts a node gap after its last predecessor ends (what one more node adds to a chain,
    the device profile's node_gap_us), and no sooner than ISSUE_US after the node started before
    it (the graph executor hands out nodes one at a time);
  - nodes that run at once share the GPU: each uses `sm` of the SMs (its grid's blocks over the SM
    count) and `bw` of the DRAM bandwidth (its memory term's share of its time, scaled by sm);
    while the sums exceed 1, every running node slows down by the larger sum (processor sharing),
    so two memory-bound kernels gain little from running together and a compute-bound kernel
    beside a memory-bound one gains most (Opara's observation).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..plan import dependents

ISSUE_US = 0.5


@dataclass(frozen=True)
class Task:
    us: float        # time alone, as a graph node
    sm: float        # fraction of the SMs its grid occupies, 0..1
    bw: float        # fraction of the DRAM bandwidth it pulls while running, 0..1
    compute: bool    # compute-bound (GEMM-like) rather than memory- or latency-bound


@dataclass
class Timeline:
    start: list
    end: list

    @property
    def makespan(self) -> float:
        return max(self.end, default=0.0)


def simulate(tasks: list, deps: list, gap_us: float, issue_us: float = ISSUE_US) -> Timeline:
    """deps[j]: the nodes node j waits for (indices into tasks, a DAG; the list is a topological
    order, which is also the order the executor issues ready nodes in)."""
    n = len(tasks)
    users, waiting = dependents(deps)
    ready_at = {j: 0.0 for j in range(n) if waiting[j] == 0}
    start, end = [0.0] * n, [0.0] * n
    left = {}              # running node -> microseconds of work left at full speed
    now, last_issue = 0.0, -issue_us
    while ready_at or left:
        slow = max(1.0, sum(tasks[j].sm for j in left), sum(tasks[j].bw for j in left))
        next_done = min((now + w * slow for w in left.values()), default=float("inf"))
        nxt = min(ready_at, key=lambda j: (ready_at[j], j)) if ready_at else None
        next_start = max(ready_at[nxt], last_issue + issue_us) if nxt is not None else float("inf")
        t = min(next_done, next_start)
        # finished: those whose end is t (compared as times: at 1e12 us, work left after a subtraction
        # is rounding noise far above any absolute epsilon, and the loop would never end)
        done = [j for j, w in left.items() if now + w * slow <= t]
        for j in left:
            left[j] -= (t - now) / slow
        now = t
        if next_start <= next_done:
            del ready_at[nxt]
            start[nxt], last_issue = now, now
            left[nxt] = tasks[nxt].us
            continue
        for j in done:
            del left[j]
            end[j] = now
            for u in users[j]:
                waiting[u] -= 1
                if waiting[u] == 0:
                    ready_at[u] = max(end[i] for i in deps[u]) + gap_us
    return Timeline(start, end)
