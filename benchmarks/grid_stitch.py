"""Grid stitching (passes/grid_stitch.py) against one graph node per kernel: one process, one GPU.

    python benchmarks/grid_stitch.py [--only gpt2-s8,bert-s128] [--iterations 200] [--out DIR]

For each zoo configuration (fp16) the model is compiled twice, --grid-stitch on and off, and each
bundle is written and read back before it is loaded. The stitched bundle runs at one and at two
blocks per SM (GRAPEC_STITCH_BLOCKS_PER_SM). Every variant's outputs are compared with onnxruntime
(CPU, fp32) and with the unstitched bundle's, and the stitched one is replayed REPLAYS times more on
the same inputs: each replay must give the same bits (a barrier that let a stage read before its
producers finished would show here first). Prints the median replay of each and the ratio
off / stitched (above 1: stitching pays); writes DIR/grid_stitch.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

REPLAYS = 50
VARIANTS = (("off", "off", "1"), ("stitched-1", "on", "1"), ("stitched-2", "on", "2"))
DEFAULT_ONLY = "gpt2-s8,bert-s128,gpt2-s128"


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=DEFAULT_ONLY)
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--out", default=os.path.join(ROOT, "out", "bench"))
    a = ap.parse_args()
    import onnxruntime as ort

    import grapec
    from grapec.tools.bench import bench_grapec
    from grapec.bundle.format import Bundle
    from grapec.bundle.inputs import bundle_inputs
    from zoo import CONFIGS, full_model
    only = set(filter(None, a.only.split(",")))
    results = {}
    tmp = tempfile.mkdtemp()
    rows = []
    for label, name, dims in CONFIGS:
        if only and label not in only:
            continue
        path = full_model(name)
        bundles = {}
        for mode in ("on", "off"):
            b = grapec.compile(path, dims=dims, precision="fp16", grid_stitch=mode)
            out = os.path.join(tmp, f"{label}-{mode}.grape")
            b.write(out)
            bundles[mode] = Bundle.read(out)
        stitches = bundles["on"].plans[0].stitches
        feeds = bundle_inputs(bundles["on"].manifest, 0, 0)
        ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
        row = {"stitches": [s.to_json() for s in stitches], "steps": len(bundles["on"].plans[0].steps)}
        outs = {}
        for vname, mode, per_sm in VARIANTS:
            os.environ["GRAPEC_STITCH_BLOCKS_PER_SM"] = per_sm
            sess = grapec.load(bundles[mode], backend="cuda")
            first = sess.run(feeds)
            names = list(first)
            stable = all(all(np.array_equal(sess.run(feeds)[n], first[n]) for n in names) for _ in range(REPLAYS))
            sess.close()
            outs[vname] = first
            timed = bench_grapec(bundles[mode], feeds, a.iterations)
            row[vname] = {"ms": timed["replay"]["median_ms"], "rel_err_vs_ort": max(rel(first[n], r) for n, r in zip(names, ref)),
                          "bitwise_stable": stable, "device": timed["device"]}
        for vname, _, _ in VARIANTS[1:]:
            row[vname]["rel_vs_off"] = max(rel(outs[vname][n], outs["off"][n]) for n in outs["off"])
        results[label] = row
        base = row["off"]["ms"]
        cells = [f"{row[v]['ms']:.3f} ({base / row[v]['ms']:.2f}x)" for v, _, _ in VARIANTS]
        errs = " / ".join(f"{row[v]['rel_err_vs_ort']:.1e}" for v, _, _ in VARIANTS)
        stable = " / ".join("yes" if row[v]["bitwise_stable"] else "NO" for v, _, _ in VARIANTS)
        rows.append(f"| {label} | {sum(e - f for f, e, _ in row['stitches'])} of {row['steps']} in {len(row['stitches'])} | "
                    + " | ".join(cells) + f" | {errs} | {stable} |")
        print(rows[-1], flush=True)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "grid_stitch.json"), "w") as f:
        json.dump(results, f, indent=1)
    device = next((r["off"]["device"] for r in results.values()), "?")
    print(f"\n{device}: median replay ms (ratio = off / variant, above 1: stitching pays); rel err vs onnxruntime CPU fp32; "
          f"stable: {REPLAYS} more replays gave the same bits")
    print("| model | steps stitched (kernels) | " + " | ".join(f"{v} ms" for v, _, _ in VARIANTS) + " | rel err | stable |")
    print("|---|---|" + "---|" * (len(VARIANTS) + 2))
    print("\n".join(rows))


if __name__ == "__main__":
    main()
