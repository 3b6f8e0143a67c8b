"""The stream scheduler's parallel branches against grapec's own serial graph and torch.compile:
one process, one GPU, the same weights and inputs.

    python benchmarks/streams.py [--only googlenet,inception_v3] [--iterations 200] [--no-compile]
                                 [--device-profile h100] [--max-branches 4] [--candidates] [--out DIR]

For each zoo configuration (fp16, batch 1) the model is compiled twice: as the scheduler chooses
(passes/streams.py) and with --serial (one chain). Both are checked against onnxruntime (CPU) and
timed as CUDA-graph replays, then torch.compile (reduce-overhead: CUDA graphs) on the same weights.
Prints one row per model: the replays, serial / parallel (above 1: the branches pay), torch.compile
/ parallel, the branches chosen and the simulation's own serial / parallel ratio; writes
DIR/streams.json and DIR/streams.md. --candidates: also time every (order, branches) the scheduler
weighed, next to its simulated replay: how well the simulation ranks them.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))

HEADER = ("| model | parallel ms | serial ms | serial / parallel | torch.compile ms | torch.compile / parallel "
          "| branches | simulated serial / parallel | rel err parallel, serial |\n|---|---|---|---|---|---|---|---|---|")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="")
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--device-profile", default="h100")
    ap.add_argument("--max-branches", type=int, default=4)
    ap.add_argument("--candidates", action="store_true",
                    help="also time every schedule the scheduler weighed (simulated vs measured)")
    ap.add_argument("--out", default=os.path.join(ROOT, "out", "bench"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    import grapec
    from grapec.tools.bench import bench_grapec, bench_torch, zoo_module
    from grapec.bundle.inputs import bundle_inputs
    zoo = _benchmarks_zoo()   # benchmarks/zoo.py, not models/zoo.py (zoo_module imports that one as `zoo`)
    CONFIGS, accuracy, full_model = zoo.CONFIGS, zoo.accuracy, zoo.full_model
    only = set(filter(None, a.only.split(",")))
    results, lines = {}, [HEADER]
    print(HEADER, flush=True)
    for label, name, dims in CONFIGS:
        if only and label not in only:
            continue
        path = full_model(name)
        compiled = {kind: grapec.compile(path, dims=dims, precision="fp16", device_profile=a.device_profile,
                                         max_branches=branches)
                    for kind, branches in (("parallel", a.max_branches), ("serial", 1))}
        feeds = bundle_inputs(compiled["parallel"].manifest, 0, 0)
        r = {}
        for kind, bundle in compiled.items():
            g = bench_grapec(bundle, feeds, a.iterations)
            r[kind] = {"ms": g["replay"]["median_ms"], "schedule": _summary(bundle), "graph_edges": g.get("graph_edges"),
                       "device_memory_mib": g["device_memory_mib"], "rel_err_vs_ort": accuracy(bundle, path, feeds)}
        if a.candidates:
            r["candidates"] = time_candidates(compiled["serial"], feeds, a)
            for c in r["candidates"]:
                print(f"  {c['order']:14s} {c['branches']} branches: simulated {c['simulated_us']:8.1f} us, "
                      f"measured {c['ms'] * 1e3:8.1f} us", flush=True)
        if not a.no_compile:
            t = bench_torch(zoo_module(name, "full"), feeds, a.iterations, modes=("compile",), say=print,
                            precision="fp16")
            r["torch.compile"] = {"ms": t["torch.compile + CUDA graph"]["median_ms"]} if "torch.compile + CUDA graph" in t \
                else {"error": str(t)}
        results[label] = r
        with open(os.path.join(a.out, "streams.json"), "w") as f:
            json.dump(results, f, indent=1)
        lines.append(_row(label, r))
        print(lines[-1], flush=True)
    with open(os.path.join(a.out, "streams.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def time_candidates(serial_bundle, feeds, a) -> list:
    """Every (order, branches) the scheduler weighs, applied to the serial plan and timed."""
    import copy

    from grapec.tools.bench import bench_grapec
    from grapec.cost.device import load_profile
    from grapec.passes.streams import apply_candidate, candidates, step_task
    profile = load_profile(a.device_profile)
    plan = serial_bundle.plans[0]
    tasks = [step_task(serial_bundle.kernels, plan, st, profile) for st in plan.steps]
    out = []
    for c in candidates(plan.steps, plan.buffers, tasks, profile.node_gap_us, a.max_branches):
        bundle = copy.copy(serial_bundle)
        bundle.plans = [copy.deepcopy(plan)]
        apply_candidate(bundle.plans[0], c)
        ms = bench_grapec(bundle, feeds, a.iterations)["replay"]["median_ms"]
        out.append({"order": c.order_name, "branches": len(set(c.branch.values())),
                    "simulated_us": round(c.line.makespan, 2), "ms": ms})
    return out


def _benchmarks_zoo():
    import importlib.util
    spec = importlib.util.spec_from_file_location("benchmarks_zoo", os.path.join(ROOT, "benchmarks", "zoo.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _summary(bundle) -> dict:
    s = dict(bundle.manifest["buckets"][0]["schedule"])
    s.pop("timeline", None)
    return s


def _row(label, r) -> str:
    par, ser = r["parallel"], r["serial"]
    tc = r.get("torch.compile", {}).get("ms")
    sim = par["schedule"]
    tc_cols = f"{tc:.4f} | {tc / par['ms']:.2f}x" if tc else "- | -"
    return (f"| {label} | {par['ms']:.4f} | {ser['ms']:.4f} | {ser['ms'] / par['ms']:.2f}x | {tc_cols} | "
            f"{sim['branches']} ({sim['order']}) | {sim['serial_us'] / sim['simulated_us']:.2f}x | "
            f"{par['rel_err_vs_ort']:.1e}, {ser['rel_err_vs_ort']:.1e} |")


if __name__ == "__main__":
    main()
