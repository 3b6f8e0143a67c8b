"""Where a peer spends its time: torch.compile (reduce-overhead) on a zoo model, kernel by kernel,
beside grapec's own steps timed alone. One process, one GPU.

    python benchmarks/peer_kernels.py --model gpt2 --batch 16 --seq 128 [--precision fp16] [--top 20]

Prints torch.compile's CUDA kernels from torch.profiler over 20 calls, grouped by kernel name, with
the microseconds per call each takes, next to grapec's steps grouped by kind (kernel, matmul,
attention) from its per-step timing. What the two spend on GEMMs, attention and the rest is then
side by side.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))


def torch_kernels(module, feeds, precision: str, calls: int = 20) -> tuple:
    """-> ({kernel name: us per call}, torch.compile's total us per call from the profile)."""
    import numpy as np
    import torch
    from torch.profiler import ProfilerActivity, profile
    dev = torch.device("cuda")
    module = module.to(dev).eval()
    args = [torch.from_numpy(np.ascontiguousarray(v)).to(dev) for v in feeds.values()]
    if precision == "fp16":
        module = module.half()
        args = [a.half() if a.is_floating_point() else a for a in args]
    cm = torch.compile(module, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(5):
            cm(*args)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                cm(*args)
            torch.cuda.synchronize()
    per = collections.Counter()
    for ev in prof.key_averages():
        if ev.device_type.name == "CUDA" and ev.device_time_total > 0:
            per[ev.key] += ev.device_time_total / calls
    return per, sum(per.values())


def grapec_steps(path, dims, precision, half_outputs) -> tuple:
    import grapec
    from grapec.tools.bench import bench_grapec
    from grapec.bundle.inputs import bundle_inputs
    calibration = {"batch": 1} if dims["batch"] > 1 and precision in ("fp16", "bf16") else None
    bundle = grapec.compile(path, dims=dims, precision=precision, calibration_dims=calibration,
                            half_outputs=half_outputs)
    feeds = bundle_inputs(bundle.manifest, 0, 0)
    r = bench_grapec(bundle, feeds, 100, per_step=True)
    per = collections.Counter()
    for st in r["steps"]:
        per[st["kind"]] += st["us"]
    return per, r["replay"]["median_ms"] * 1e3, feeds, sorted(r["steps"], key=lambda s: -s["us"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--half-outputs", action="store_true")
    ap.add_argument("--top", type=int, default=20)
    a = ap.parse_args()
    import importlib.util
    from grapec.tools.bench import zoo_module
    spec = importlib.util.spec_from_file_location("zoo_bench", os.path.join(ROOT, "benchmarks", "zoo.py"))
    zoo_bench = importlib.util.module_from_spec(spec)   # benchmarks/zoo.py: models/zoo.py is the other `zoo`
    spec.loader.exec_module(zoo_bench)
    full_model = zoo_bench.full_model
    dims = {"batch": a.batch, **({"seq": a.seq} if a.model in ("gpt2", "bert") else {})}   # the CNNs have no seq
    kinds, replay_us, feeds, steps = grapec_steps(full_model(a.model), dims, a.precision,
                                                  a.half_outputs and a.precision in ("fp16", "bf16"))
    per, total = torch_kernels(zoo_module(a.model, "full"), feeds, a.precision)
    print(f"\n{a.model} batch {a.batch} seq {a.seq} {a.precision}: grapec replay {replay_us:.1f} us; "
          f"torch.compile kernels {total:.1f} us a call (profiled)\n")
    print("| torch.compile kernel | us a call |\n|---|---|")
    for name, us in per.most_common(a.top):
        print(f"| {name[:110]} | {us:.1f} |")
    print("\n| grapec step kind | us (steps timed alone) |\n|---|---|")
    for kind, us in kinds.most_common():
        print(f"| {kind} | {us:.1f} |")
    print("\n| grapec step | kind | origin | us |\n|---|---|---|---|")
    for st in steps[:a.top]:
        print(f"| {st['index']} | {st['kind']} | {', '.join(st['origin'][:2])} | {st['us']:.1f} |")


if __name__ == "__main__":
    main()
