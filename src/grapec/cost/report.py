"""The planner's account of a plan: each step (a fusion group) with its stitch scheme, thread
mapping, estimated time and the alternatives that lost. Stored in the bundle's manifest and shown
by `grapec inspect --fusion`."""
from __future__ import annotations

from ..codegen.launch import mapped_launch, plan_launch
from ..ir.kinds import kernel_from_json
from ..plan import IfStep, KernelStep, LoopStep
from .device import DeviceProfile
from .model import estimate, price_mappings, price_small_gemm
from .work import step_work

MAX_ALTERNATIVES = 4
SMALL_GEMM_PLANS = {"prologue": "one small GEMM kernel, A computed in it",
                    "kernel": "A's producer a kernel of its own, then the small GEMM kernel",
                    "cuBLASLt": "A's producer (if any) a kernel of its own, then cuBLASLt"}


def plan_report(kernels: list, plan, profile: DeviceProfile, alternatives: bool = True) -> list:
    """[{step, kind, ops, origin, scheme, mapping, us, bound, alternatives}] for every step the model
    prices (kernels: the bundle's kernel JSON entries). A top-level step's `step` is its index; a
    step inside a region is labelled by its path, as "2/5" (step 5 of the body of the Loop at step 2)
    or "3/then/0" (an If's branch), so a generation's decode step is shown too. alternatives=False:
    no losing mappings (a range of sizes keeps only each size's estimate)."""
    rows: list = []
    _report_steps(plan.steps, None, kernels, plan, profile, alternatives, {}, rows)
    return rows


def top_level_us(rows: list) -> float:
    """The estimate of one run's top-level steps (a region's body runs an unknown number of times)."""
    return sum(r["us"] for r in rows if isinstance(r["step"], int))


def _regions(st) -> list:
    """(name, steps) of a region step's nested lists, as labels show them."""
    if isinstance(st, LoopStep):
        return [("enter", st.enter), ("", st.body.steps), ("exit", st.exit)]
    if isinstance(st, IfStep):
        return [("then", st.then.steps), ("else", st.else_.steps)]
    return []


def _report_steps(steps, prefix, kernels, plan, profile, alternatives, priced, rows):
    for i, st in enumerate(steps):
        label = i if prefix is None else f"{prefix}/{i}"
        for name, sub in _regions(st):
            _report_steps(sub, f"{label}/{name}" if name else str(label), kernels, plan, profile, alternatives, priced, rows)
        if isinstance(st, KernelStep) and st.kernel in priced:
            work, est = priced[st.kernel]
        else:
            work = step_work(kernels, plan, st)
            if work is None:
                continue
            est = estimate(work, profile)
            if isinstance(st, KernelStep):
                priced[st.kernel] = work, est
        row = {"step": label, "kind": work.kind, "ops": len(st.origin), "origin": st.origin[:3],
               "scheme": _scheme(work, st), "mapping": work.mapping, "us": round(est.us, 2), "bound": est.bound,
               "alternatives": []}
        if alternatives:
            row["alternatives"] = _alternatives(kernels, st, work, profile)
        rows.append(row)


def _alternatives(kernels, st, work, profile) -> list:
    """The mappings (or plans) that lost to the step's, each with its estimate."""
    if isinstance(st, KernelStep) and work.kind == "small_gemm" and profile.coefficients.get("small_gemm"):
        k = kernel_from_json(kernels[st.kernel])
        chosen = "prologue" if k.prologue is not None else "kernel"
        # priced with the node gap of each node; shown less one, like this row's own estimate
        return [{"mapping": p, "scheme": SMALL_GEMM_PLANS[p], "us": round(us - profile.node_gap_us, 2)}
                for p, us in price_small_gemm(k, profile) if p != chosen]
    if work.kind == "sdpa" and "kernel" in (st.attrs.get("priced") or {}):
        us = st.attrs["priced"]["kernel"] - profile.node_gap_us   # priced with its node gap
        return [{"mapping": "generated kernel", "scheme": _ATTENTION_KERNEL, "us": round(us, 2)}]
    if isinstance(st, KernelStep) and work.kind == "kernel":
        k = kernel_from_json(kernels[st.kernel])
        chosen = plan_launch(k)
        return [{"mapping": e.work.mapping, "scheme": _scheme(e.work, st), "us": round(e.us, 2)}
                for m, e in price_mappings(k, profile) if mapped_launch(k, *m) != chosen][:MAX_ALTERNATIVES]
    return []


_ATTENTION_KERNEL = "flash attention: scores in registers, keys and values through shared memory"


def _scheme(work, step) -> str:
    """How the group's intermediate values meet: FusionStitching's stitch schemes."""
    if work.kind == "gemm" and step.attrs.get("op") == "conv":   # x, w, bias, residual
        args = list(step.args) + [-1, -1]
        epilogue = (["bias"] if args[2] >= 0 else []) + (["residual"] if args[3] >= 0 else [])
        epilogue += [step.attrs["act"]] if step.attrs.get("act") not in (None, "", "none") else []
        return "cuDNN convolution, NHWC" + (f" + epilogue ({', '.join(epilogue)})" if epilogue else "")
    if work.kind == "gemm":
        args = list(step.args) + [-1, -1]
        epilogue = (["residual"] if args[2] >= 0 else []) + (["bias"] if args[3] >= 0 else [])
        epilogue += [step.attrs["act"]] if step.attrs.get("act") not in (None, "", "none") else []
        return "cuBLASLt" + (f" + epilogue ({', '.join(epilogue)})" if epilogue else "")
    if work.kind == "small_gemm":
        if "prologue" in work.mapping:
            return "A's rows computed into shared memory (prologue), weights streamed to tensor cores"
        return "A's rows read in place, weights streamed to tensor cores"
    if work.kind == "attention":
        return _ATTENTION_KERNEL
    if work.kind == "sdpa":
        return "cuDNN SDPA (flash attention)" + (", additive mask as its bias" if "bias" in step.attrs else "")
    if work.block_syncs:
        return "shared memory (block reductions)"
    if work.warp_syncs:
        return "warp shuffle"
    if work.serial > 1:
        return "registers (each thread loops over its reduction)"
    return "registers"
