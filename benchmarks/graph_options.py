"""The CUDA runtime's graph-building options, each turned off in turn: one process, one GPU, the
same bundles.

    python benchmarks/graph_options.py [--only gpt2-s8,bert-s128] [--iterations 200] [--out DIR]

For each zoo configuration (fp16, batch 1) the bundle is compiled once and loaded once per variant:
    default                 everything on
    no-dependent-launch     GRAPEC_DEPENDENT_LAUNCH=0: no programmatic edges between kernel nodes
                            (runtime/cuda/graph.py); each kernel starts when the one before has ended
    gemm-child-graphs       GRAPEC_FLAT_GEMMS=0: a captured cuBLASLt call stays a child graph
    no-gemm-tuning          GRAPEC_GEMM_TUNING=0: cuBLASLt's first heuristic choice, untimed
Prints the median replay of each, its ratio to the default (above 1: the option pays), the
programmatic edges of the default's graph and the load times; writes DIR/graph_options.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

VARIANTS = {"default": {}, "no-dependent-launch": {"GRAPEC_DEPENDENT_LAUNCH": "0"},
            "gemm-child-graphs": {"GRAPEC_FLAT_GEMMS": "0"}, "no-gemm-tuning": {"GRAPEC_GEMM_TUNING": "0"}}
SWITCHES = sorted({k for env in VARIANTS.values() for k in env})


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, from: " + ", ".join(VARIANTS))
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--device-profile", default="h100")
    ap.add_argument("--out", default=os.path.join(ROOT, "out", "bench"))
    a = ap.parse_args()
    variants = ["default"] + [v for v in a.variants.split(",") if v and v != "default"]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    import grapec
    from grapec.tools.bench import bench_grapec
    from grapec.bundle.inputs import bundle_inputs
    from zoo import CONFIGS, full_model
    only = set(filter(None, a.only.split(",")))
    results = {}
    print("| model | " + " | ".join(f"{v} ms (ratio)" for v in variants) + " | programmatic edges | load s |")
    print("|---|" + "---|" * (len(variants) + 2))
    for label, name, dims in CONFIGS:
        if only and label not in only:
            continue
        bundle = grapec.compile(full_model(name), dims=dims, precision="fp16",
                                device_profile=a.device_profile)
        feeds = bundle_inputs(bundle.manifest, 0, 0)
        row = {}
        for v in variants:
            for k in SWITCHES:
                os.environ[k] = VARIANTS[v].get(k, "1")
            res = bench_grapec(bundle, feeds, a.iterations)
            row[v] = {"ms": res["replay"]["median_ms"], "load_s": res["load_and_first_run_s"],
                      "edges": res.get("graph_edges")}
        results[label] = row
        base = row["default"]["ms"]
        cells = [f"{row[v]['ms']:.3f} ({row[v]['ms'] / base:.2f}x)" for v in variants]
        loads = " / ".join(f"{row[v]['load_s']:.2f}" for v in variants)
        edges = (row["default"]["edges"] or {}).get("programmatic", "?")
        print(f"| {label} | " + " | ".join(cells) + f" | {edges} | {loads} |", flush=True)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "graph_options.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
