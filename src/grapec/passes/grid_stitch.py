"""grid_stitch: FusionStitching's global-barrier scheme. A run of short kernel steps becomes one
cooperative kernel whose stages are the steps' kernels, a grid-wide barrier between each two.

Where kernels are short (a decode step, GPT-2 at seq 8: 63 kernels of 2-5 us each), a replay is
much of it the gaps between graph nodes: each node's launch, ramp-up and tail. The stitch trades
each gap for a barrier between the stages of one resident grid; a small GEMM's weights are loaded
before it waits at its barrier, so they fly while the stage before it ends (codegen/grid_stitch.py).

A run is stitched where the cost model says it pays: every stage priced under STAGE_MAX_US (a long
kernel gains nothing from a saved gap and may lose blocks), and (stages - 1) x (node gap - barrier)
above zero. Measured on an H100 (benchmarks/grid_stitch.py, 2026-11-25), it does not pay there: a
grid barrier of 132 blocks costs 1.6 us (2.2 us at 264; per-block flags and split counters were
slower still), while a node joined to its predecessor by a programmatic edge (runtime/cuda/graph.py)
adds 0.95 us to a replay (GPT-2 seq 8: 280 us a replay, 220 us its 63 steps timed alone), and the
stages ran no faster inside the stitch than as nodes: stitched, GPT-2 seq 8 took 326 us. So "auto"
stitches only where no programmatic edges join the kernels (before sm_90), and "on" stitches every
run it can (to measure, and for GPUs where the balance differs).
Only plans of one chain are stitched (a cooperative grid holds every SM it can get, so no branch
could run beside it), and steps that touch the graph's inputs or outputs stay nodes of
their own (zero-copy I/O repoints single nodes: runtime/cuda/binding.py).
The plan's steps do not change: `Plan.stitches` names the runs, and the CPU backend, the reports and
the hazard checks still see every step.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..codegen.attention import attention_launch
from ..codegen.small_gemm import is_split, small_gemm_launch
from ..cost.model import estimate
from ..cost.work import step_work
from ..ir.attention import AttentionKernel
from ..ir.kinds import kernel_from_json
from ..ir.selection import NmsKernel, NmsMaskKernel, NonZeroKernel, TopKKernel
from ..ir.small_gemm import SmallGemmKernel
from ..plan import KernelStep, Plan, Stitch

MODES = ("auto", "on", "off")
STAGE_MAX_US = 20.0        # a stage estimated longer than this keeps its own node
BARRIER_US = 1.6           # a grid barrier on an H100, 132 blocks arriving (measured 2026-11-25)
DEPENDENT_GAP_US = 0.95    # what a node adds to a replay when a programmatic edge joins it (H100, GPT-2 seq 8)
MIN_BLOCK = 256            # generated kernels stride over whatever block they get; 256 keeps 8 warps an SM busy
PARAM_BYTES = 4000         # a kernel's parameter space (4 KiB), the barrier's pointer taken out
SCALAR_HEADROOM = 64       # size arguments a stage function merged across buckets may add (codegen/module.py)


@dataclass
class StitchReport:
    first: int
    end: int
    block: int
    stages_us: float       # the stages' estimates, summed
    saved_us: float        # (stages - 1) x (node gap - barrier)

    def to_json(self) -> dict:
        return {"steps": [self.first, self.end], "block": self.block, "stages_us": round(self.stages_us, 2),
                "saved_us": round(self.saved_us, 2)}


def plan_stitches(plan: Plan, kernels: list, profile, mode: str = "auto", dependent_launch: bool = True) -> list:
    """-> [StitchReport] for the runs worth one cooperative kernel ("auto"), or every run that can be
    one ("on"); sets plan.stitches. dependent_launch: the target joins kernel nodes by programmatic
    edges (sm_90 and newer), which makes a node's gap the smaller one."""
    plan.stitches = []
    gap = min(profile.node_gap_us, DEPENDENT_GAP_US) if dependent_launch else profile.node_gap_us
    gain = gap - BARRIER_US
    if mode == "off" or (mode == "auto" and gain <= 0) or any(st.branch for st in plan.steps):
        return []
    root = plan.storage_of()
    io = {root[b] for _, b in plan.inputs + plan.outputs}
    reports, run = [], []

    def close():
        for chunk in _chunks(run):
            if len(chunk) >= 2:
                first, end = chunk[0][0], chunk[-1][0] + 1
                block = max([MIN_BLOCK] + [c[2] for c in chunk])
                reports.append(StitchReport(first, end, block, sum(c[1] for c in chunk), (len(chunk) - 1) * gain))
        run.clear()

    for i, st in enumerate(plan.steps):
        stage = _stage(plan, kernels, profile, st, root, io)
        if stage is None:
            close()
        else:
            run.append((i, *stage))
    close()
    plan.stitches = [Stitch(r.first, r.end, r.block) for r in reports]
    return reports


def _stage(plan, kernels, profile, st, root, io) -> tuple | None:
    """(estimated us, threads the stage needs, its pointers) of a step that can be a stage; None for
    one that cannot."""
    if not isinstance(st, KernelStep) or any(root[b] in io for b in [st.out] + list(st.args)):
        return None
    us = estimate(step_work(kernels, plan, st), profile).us
    if us > STAGE_MAX_US:
        return None
    k = kernel_from_json(kernels[st.kernel])
    if isinstance(k, (NonZeroKernel, NmsKernel, NmsMaskKernel, TopKKernel)):
        return None   # one block, or a block per class, looping with block barriers of its own
    if isinstance(k, AttentionKernel):
        block = attention_launch(k).block
    elif isinstance(k, SmallGemmKernel):
        if is_split(k):
            return None   # the split form: a cluster of blocks, which a cooperative kernel's stage is not
        block = small_gemm_launch(k).block
    else:
        block = 0   # generated element/row/warp kernels take the stitch's block
    return us, block, 1 + len(st.args)


def _chunks(run: list) -> list:
    """The run cut where its stages' arguments would overflow one kernel's parameter space."""
    chunks, cur, used = [], [], 0
    for item in run:
        need = 8 * item[3] + SCALAR_HEADROOM
        if cur and used + need > PARAM_BYTES:
            chunks.append(cur)
            cur, used = [], 0
        cur.append(item)
        used += need
    return chunks + ([cur] if cur else [])

