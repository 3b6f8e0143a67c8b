"""cuBLASLt algorithm tuning at load, and GEMMs as plain kernel nodes, each on and off: one process,
one GPU, the same bundles.

    python benchmarks/gemm_nodes.py [--only gpt2-s8,bert-s128] [--iterations 200] [--out DIR]

For each zoo configuration (fp16, batch 1) the bundle is compiled once and loaded four times:
GRAPEC_GEMM_TUNING (time cuBLASLt's top candidates at load, runtime/cuda/blas.py) and
GRAPEC_FLAT_GEMMS (add a captured cuBLASLt call as a kernel node instead of a child graph,
runtime/cuda/graph.py) off and on. Prints the median replay of each and the ratio to the
baseline (both off), and the load time (tuning runs at load); writes DIR/gemm_nodes.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

VARIANTS = [("baseline", "0", "0"), ("tuned", "1", "0"), ("flat", "0", "1"), ("tuned+flat", "1", "1")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="")
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--out", default=os.path.join(ROOT, "out", "bench"))
    a = ap.parse_args()
    import grapec
    from grapec.bench import bench_grapec
    from grapec.inputs import bundle_inputs
    from zoo import CONFIGS
    only = set(filter(None, a.only.split(",")))
    results = {}
    print("| model | " + " | ".join(f"{v} ms (ratio)" for v, _, _ in VARIANTS) + " | load s (baseline / tuned) |")
    print("|---|" + "---|" * (len(VARIANTS) + 1))
    for label, name, dims in CONFIGS:
        if only and label not in only:
            continue
        bundle = grapec.compile(os.path.join(ROOT, "models", "full", f"{name}.onnx"), dims=dims, precision="fp16")
        feeds = bundle_inputs(bundle.manifest, 0, 0)
        row = {}
        for variant, tuning, flat in VARIANTS:
            os.environ["GRAPEC_GEMM_TUNING"], os.environ["GRAPEC_FLAT_GEMMS"] = tuning, flat
            res = bench_grapec(bundle, feeds, a.iterations)
            row[variant] = {"ms": res["replay"]["median_ms"], "load_s": res["load_and_first_run_s"]}
        results[label] = row
        base = row["baseline"]["ms"]
        cells = [f"{row[v]['ms']:.3f} ({base / row[v]['ms']:.2f}x)" for v, _, _ in VARIANTS]
        print(f"| {label} | " + " | ".join(cells) + f" | {row['baseline']['load_s']:.2f} / {row['tuned']['load_s']:.2f} |",
              flush=True)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "gemm_nodes.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
