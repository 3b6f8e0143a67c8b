"""Where the time of one generation goes, kernel by kernel: grapec's one-launch generation and the
torch.compile peer, traced by CUPTI (torch.profiler) in one process on one GPU.

    python tools/profile_generation.py --size full --precision fp16 [--bundle B.grape] [--out DIR]

Prints, for each: kernels per generated token, summed kernel time per token, the idle gap between
kernels per token (launch latency inside the graph), and the kernels ranked by total time. Writes the
raw kernel list of each run as CSV under --out. A development tool: it explains a benchmark, it does
not replace one (benchmarks/generation.py times without a profiler attached).
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
from collections import defaultdict

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "src"), os.path.join(ROOT, "models")]


def traced_kernels(fn, warm: int = 2):
    """[(name, start_us, duration_us)] of every CUDA kernel fn launches, in start order."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    rows = [(e.name, e.time_range.start, e.time_range.end - e.time_range.start)
            for e in prof.events() if e.device_type.name == "CUDA" and "memcpy" not in e.name.lower()
            and "memset" not in e.name.lower()]
    return sorted(rows, key=lambda r: r[1])


def summarize(label: str, rows, tokens: int, out_dir: str | None):
    if not rows:
        print(f"{label}: no kernels traced")
        return
    busy = sum(d for _, _, d in rows)
    span = rows[-1][1] + rows[-1][2] - rows[0][1]
    print(f"\n== {label}: {len(rows)} kernels, {len(rows) / tokens:.1f} per token; per token: span "
          f"{span / tokens:.1f} us, kernel time {busy / tokens:.1f} us, gaps {(span - busy) / tokens:.1f} us")
    by_name = defaultdict(lambda: [0, 0.0])
    for n, _, d in rows:
        by_name[n][0] += 1
        by_name[n][1] += d
    print(f"{'us/token':>9} {'count/token':>11} {'us each':>8}  kernel")
    for n, (c, t) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:25]:
        print(f"{t / tokens:9.2f} {c / tokens:11.2f} {t / c:8.2f}  {n[:110]}")
    if out_dir:
        path = os.path.join(out_dir, label.split()[0].replace("/", "_") + "_kernels.csv")
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["name", "start_us", "duration_us"])
            w.writerows(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="full", choices=["tiny", "full"])
    ap.add_argument("--precision", default="fp16", choices=["fp32", "fp16"])
    ap.add_argument("--bundle", help="a compiled bundle of the model (default: compile it here)")
    ap.add_argument("--peers", action="store_true", help="also trace the torch.compile peer")
    ap.add_argument("--out", help="write the kernel lists here as CSV")
    args = ap.parse_args()
    if args.out:
        os.makedirs(args.out, exist_ok=True)

    import torch
    import zoo
    import grapec
    from grapec.bundle.format import Bundle

    zm = zoo.get("gpt2_generate", args.size)
    path = os.path.join(ROOT, "models", args.size, "gpt2_generate.onnx")
    if not os.path.exists(path):
        zm.export(path)
    feeds = zm.random_inputs(0)
    bundle = Bundle.read(args.bundle) if args.bundle else grapec.compile(path, precision=args.precision,
                                                                                strict=args.precision != "fp32")
    sess = grapec.load(bundle, backend="cuda")
    r = sess._runner
    bucket = sess.select_bucket({k: np.asarray(v).shape for k, v in feeds.items()})
    first = sess.run(feeds)
    tokens = int(np.asarray(first["num_generated"]).reshape(-1)[0])
    steps = feeds["prompt_ids"].shape[1] + tokens - 1
    rows = traced_kernels(lambda: r.execute(bucket, bundle.plans[bucket].steps))
    print(f"grapec: {tokens} tokens, {steps} loop iterations")
    summarize("grapec one-launch", rows, steps, args.out)

    if args.peers:
        peers = zm.module.generation_peers(feeds, half=args.precision == "fp16")
        fn = peers["static cache, torch.compile"]
        with torch.no_grad():
            rows = traced_kernels(fn)
        summarize("torch.compile static-cache", rows, tokens, args.out)


if __name__ == "__main__":
    main()
