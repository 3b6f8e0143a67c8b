"""`grapec calibrate`: measure this GPU and write a device profile for the cost model.

1. The calibration model (cost/suite.py: element-wise kernels, LayerNorms, softmaxes, reductions,
   gathers, aligned and unaligned GEMMs, batched GEMMs and attention, at shapes that are not the
   zoo's) is compiled in fp16, every small GEMM candidate built (not chosen by an older profile).
2. Each kernel that stitches a row reduction is added again in every other thread mapping it can
   take (a block, a warp or a thread per row: codegen/launch.py), so that the coefficients that
   decide between mappings are measured on the same kernels.
3. Every step of the plan is timed alone as a CUDA-graph node (runtime/cuda/profile.py).
4. The cost model's coefficients are fitted to those times (cost/fit.py), per kind of node.
5. The whole plan is replayed too: what it takes beyond the sum of its steps, per step, is the
   node gap (a node's cost in a chain that timing it alone does not see).

The profile is a small JSON file. Compilers on machines without a GPU read it
(`grapec compile --device-profile FILE`); the profiles shipped in cost/profiles/ were written this way.
"""
from __future__ import annotations

import datetime
from dataclasses import replace
import re
from typing import Callable

import numpy as np

from ..cost.device import DeviceProfile
from ..cost.fit import fit_coefficients, relative_errors
from ..cost.work import step_work

CALIBRATION_ITERATIONS = 20


def profile_name(device_name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100': the model number, lower case."""
    m = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Z]?)\b", device_name.replace("NVIDIA", ""))
    return (m.group(1) if m else re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-")).lower()


def measure_samples(device: int = 0, say: Callable = print) -> tuple:
    """-> (device name, SM count, [(Work, measured us)] for every step of the calibration model, the
    node gap: what the plan's replay takes beyond the sum of its steps alone, per step)."""
    from .. import compiler
    from ..cost.suite import calibration_model, sdpa_calibration_model
    say("compiling the calibration model (fp16) ...")
    bundle = compiler.compile_model(calibration_model(), precision="fp16", device_profile=unpriced_profile())
    added = add_mapping_variants(bundle)
    say(f"{added} more steps: the row kernels in their other thread mappings; building their GPU code ...")
    say(f"timing its {len(bundle.plans[0].steps)} steps one by one on GPU {device} ...")
    res, samples = _timed_steps(bundle, device)
    say("the same attention problems through cuDNN's SDPA ...")
    sdpa = compiler.compile_model(sdpa_calibration_model(), precision="fp16", attention="cudnn")
    samples += [(w, us) for w, us in _timed_steps(sdpa, device)[1] if w.kind == "sdpa"]
    from ..runtime.cuda.driver import Device
    alone = sum(m["us"] for m in res["steps"])
    gap = max(0.0, (res["replay"]["median_ms"] * 1000 - alone) / max(1, len(res["steps"])))
    return res["device"], Device(device).sms, samples, gap


def _timed_steps(bundle, device: int) -> tuple:
    """-> (bench_grapec's result, [(Work, measured us)] for every priced step of the bundle)."""
    from .bench import bench_grapec
    from ..bundle.inputs import bundle_inputs
    res = bench_grapec(bundle, bundle_inputs(bundle.manifest, 0, 0), CALIBRATION_ITERATIONS, device=device, per_step=True)
    plan = bundle.plans[0]
    works = [step_work(bundle.kernels, plan, st) for st in plan.steps]
    return res, [(w, m["us"]) for w, m in zip(works, res["steps"]) if w is not None]


def unpriced_profile() -> DeviceProfile:
    """The shipped profile without small_gemm and sdpa coefficients: with it every small GEMM
    candidate is built (passes/small_gemm.py) and every attention is the generated kernel
    (passes/sdpa.py; cuDNN's are measured apart), so the samples do not depend on the choices an
    older profile would make (which would hide exactly the shapes it misprices)."""
    from ..cost.device import load_profile
    shipped = load_profile(None)
    return replace(shipped, coefficients={k: v for k, v in shipped.coefficients.items()
                                          if k not in ("small_gemm", "sdpa")})


def add_mapping_variants(bundle) -> int:
    """Append to the plan a copy of every row kernel's step in each other mapping it can take (the
    copies rewrite the same output), and rebuild the GPU code. -> the number of steps added."""
    from ..codegen.build import build_gpu_code
    from ..codegen.launch import candidate_mappings, plan_launch, mapped_launch
    from ..ir.kernel import Kernel
    from ..plan import KernelStep
    plan = bundle.plans[0]
    extra = []
    for st in plan.steps:
        if not isinstance(st, KernelStep) or bundle.kernels[st.kernel].get("kind"):
            continue
        k = Kernel.from_json(bundle.kernels[st.kernel])
        for m in candidate_mappings(k):
            if mapped_launch(k, *m) != plan_launch(k):
                bundle.kernels.append(replace(k, mapping=m).to_json())
                extra.append(KernelStep(len(bundle.kernels) - 1, list(st.args), st.out, st.origin + [f"mapping {m[0]}/{m[1]}"]))
    plan.steps.extend(extra)
    if extra:
        sections, entry = build_gpu_code(bundle.kernels, bundle.plans, bundle.manifest["targets"])
        bundle.extra_sections.update(sections)
        bundle.manifest["cuda"] = entry
    return len(extra)


def fit_profile(device_name: str, sms: int, samples: list, name: str | None = None, node_gap_us: float = 0.0) -> DeviceProfile:
    coefficients = fit_coefficients(samples, sms)
    errors = relative_errors(samples, coefficients, sms)
    per_kind = {}
    for kind in coefficients:
        e = [x for x, (w, _) in zip(errors, samples) if w.kind == kind]
        per_kind[kind] = {"samples": len(e), "median_error": round(float(np.median(e)), 4),
                          "max_error": round(float(np.max(e)), 4)}
    measured = {"date": datetime.date.today().isoformat(), "fit": per_kind,
                "how": "grapec calibrate: the calibration model's steps, each timed alone as a graph node"}
    return DeviceProfile(name or profile_name(device_name), device_name, sms,
                         {k: {f: round(c, 6) for f, c in v.items()} for k, v in coefficients.items()}, measured,
                         round(node_gap_us, 4))


def calibrate(device: int = 0, name: str | None = None, say: Callable = print, samples_path: str | None = None) -> DeviceProfile:
    """samples_path: also write every (work, measured us) pair there, to refit or study offline."""
    device_name, sms, samples, gap = measure_samples(device, say)
    from ..runtime.cuda.driver import Device
    memory = Device(device).mem_info()[1]
    if samples_path:
        import dataclasses
        import json
        with open(samples_path, "w") as f:
            json.dump({"device": device_name, "sms": sms, "node_gap_us": gap, "memory_bytes": memory,
                       "samples": [{"work": dataclasses.asdict(w), "us": us} for w, us in samples]}, f)
    return replace(fit_profile(device_name, sms, samples, name, gap), memory_bytes=memory)


def refit(samples_path: str, name: str | None = None) -> DeviceProfile:
    """A profile fitted again to samples `calibrate(samples_path=...)` saved: no GPU needed."""
    import json
    from ..cost.work import Work
    from ..errors import InputError
    try:
        with open(samples_path) as f:
            d = json.load(f)
        samples = [(Work(**s["work"]), float(s["us"])) for s in d["samples"]]
        return replace(fit_profile(str(d["device"]), int(d["sms"]), samples, name, float(d.get("node_gap_us", 0.0))),
                       memory_bytes=int(d.get("memory_bytes", 0)))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InputError(f"{samples_path}: not a samples file from `grapec calibrate --save-samples` ({e})") from None
