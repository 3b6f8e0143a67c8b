"""If/Loop inside the CUDA graph against the same model with its control on the host (--host-control),
in one process on one GPU: the control_flow zoo model (greedy decoding of an RNN decoder: a Loop with a
data-dependent trip count, an If inside).

    python benchmarks/control_flow.py --size full [--iterations 200] [--json out.json]

Prints, per mode: median / p90 GPU ms of one run (CUDA events around it on grapec's stream; the host
mode's time includes its host round trips, since that is what a caller waits for), cuGraphLaunch
calls per run, decode steps the run made, ms per step, and the ratio host / graphed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "src"), os.path.join(ROOT, "models")]


def model_path(size: str) -> str:
    path = os.path.join(ROOT, "models", size, "control_flow.onnx")
    if not os.path.exists(path):
        import zoo
        os.makedirs(os.path.dirname(path), exist_ok=True)
        zoo.get("control_flow", size).export(path)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="full", choices=["tiny", "full"])
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()

    import grapec
    from grapec.tools.bench import bench_grapec
    import onnxruntime as ort
    path = model_path(args.size)
    rng = np.random.default_rng(0)
    import onnx
    m = onnx.load(path)
    h = [d.dim_value for d in m.graph.input[1].type.tensor_type.shape.dim][0]
    feeds = {"start_token": np.array([int(rng.integers(1, 16))], np.int64), "h0": rng.standard_normal(h).astype(np.float32)}
    ref = dict(zip([o.name for o in m.graph.output], ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)))
    rows = {}
    for mode, host in (("graphed", False), ("host control", True)):
        bundle = grapec.compile(path, host_control=host)
        sess = grapec.load(bundle, backend="cuda")
        out = sess.run(feeds)
        same = all(np.allclose(out[k], ref[k], rtol=1e-4, atol=1e-5) for k in ref)
        launches = sess._runner.launched
        sess._runner.close()
        r = bench_grapec(bundle, feeds, args.iterations, args.warmup)
        steps = int(out["count"])
        rows[mode] = {"median_ms": r["replay"]["median_ms"], "p90_ms": r["replay"]["p90_ms"], "launches": launches,
                      "steps": steps, "ms_per_step": r["replay"]["median_ms"] / max(steps, 1),
                      "matches_onnxruntime": bool(same), "device": r["device"]}
    base = rows["graphed"]["median_ms"]
    print(f"control_flow ({args.size}) on {rows['graphed']['device']}; one run = {rows['graphed']['steps']} decode steps")
    print(f"{'mode':14s} {'median ms':>10s} {'p90':>8s} {'launches':>9s} {'ms/step':>8s} {'vs graphed':>11s}  matches ort")
    for mode, r in rows.items():
        print(f"{mode:14s} {r['median_ms']:10.4f} {r['p90_ms']:8.4f} {r['launches']:9d} {r['ms_per_step']:8.4f} "
              f"{r['median_ms'] / base:10.2f}x  {r['matches_onnxruntime']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
