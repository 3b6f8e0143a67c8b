"""Detection models end to end, post-processing in the graph (issue 36): grapec against onnxruntime's
CUDA provider, PyTorch eager and torch.compile, in one process on one GPU.

    python benchmarks/detection.py --models ssdlite,fasterrcnn,retinanet --out /tmp/det

Each model is torchvision's, built with random weights by models/detection.py (the score thresholds
set so that detections come out), exported by torch.onnx and compiled by grapec with --strict (the
whole model one graph launch, NMS and all). Every row times one request as a service sees it: an
image in host memory (numpy, or a CPU tensor) in, the boxes, scores and labels back in host memory;
median ms over --iterations after warm-up, the same images for every row. Before timing, grapec's
detections are checked against onnxruntime's on the CPU (the same detections, near-ties in either
order; `same_as_onnxruntime` says where not: random weights score near-uniformly, so a near-tie at a
cut can swap a box). Ratios are the peer's time over grapec's (above 1: grapec faster).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "src"), os.path.join(ROOT, "models"), os.path.join(ROOT, "tests")]

SCORE_THRESHOLDS = {"ssdlite": None, "fasterrcnn": 0.0109, "retinanet": 0.0109}   # 1/91 classes ~ 0.011


def median_ms(fn, iterations: int, sync=None) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(iterations):
        t = time.perf_counter()
        fn()
        if sync:
            sync()
        times.append((time.perf_counter() - t) * 1e3)
    return float(np.median(times))


def build_model(name: str, size: int):
    import torch
    from detection import build
    model, _ = build(name)
    thr = SCORE_THRESHOLDS.get(name)
    if thr is not None:
        if hasattr(model, "roi_heads"):
            model.roi_heads.score_thresh = thr
        else:
            model.score_thresh = thr
    return model, torch.rand(3, size, size)


def export(name: str, model, image, path: str):
    import torch
    from detection import output_names
    torch.onnx.export(model, ([image],), path, opset_version=17, input_names=["image"],
                      output_names=output_names(name), dynamo=False)


def run_model(name: str, args) -> dict:
    import onnxruntime as ort
    import torch

    import grapec
    from test_detection_models import assert_same_detections
    t0 = time.perf_counter()
    say = lambda what: print(f"[{name} {time.perf_counter() - t0:6.1f}s] {what}", file=sys.stderr, flush=True)  # noqa: E731
    model, image = build_model(name, args.size)
    path = os.path.join(args.out, f"{name}.onnx")
    export(name, model, image, path)
    say("exported")
    t = time.perf_counter()
    bundle = grapec.compile(path, shapes={"image": (3, args.size, args.size)}, strict=True, precision=args.precision)
    compile_s = time.perf_counter() - t
    say("compiled")
    sess = grapec.load(bundle, backend="cuda")
    rng = np.random.default_rng(0)
    images = [rng.random((3, args.size, args.size)).astype(np.float32) for _ in range(4)]
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    counts, agree = [], []
    for x in images:
        expected = dict(zip([o.name for o in ref.get_outputs()], ref.run(None, {"image": x})))
        try:
            assert_same_detections(sess.run({"image": x}), expected, score_tol=1e-4 if args.precision == "fp32" else 2e-2,
                                   box_tol=2e-2 if args.precision == "fp32" else 2.0)
            agree.append(True)
        except AssertionError as e:   # random weights score near-uniformly: a near-tie at the cut swaps a box
            agree.append(str(e)[:160])
        counts.append(len(expected["scores"]))
        say(f"image {len(counts)} checked against onnxruntime CPU")
    row = {"model": name, "detections": counts, "same_as_onnxruntime": agree, "compile_s": round(compile_s, 1),
           "predicated": len(bundle.manifest["buckets"][0].get("predicated", []))}
    which = iter(range(10 ** 9))

    def grapec_run():
        sess.run({"image": images[next(which) % len(images)]})
    row["grapec_ms"] = median_ms(grapec_run, args.iterations)
    say("grapec timed")
    peers = args.peers.split(",") if args.peers else []
    if "ort" in peers and "CUDAExecutionProvider" in ort.get_available_providers():
        cuda = ort.InferenceSession(path, providers=["CUDAExecutionProvider"])
        row["ort_cuda_ms"] = median_ms(lambda: cuda.run(None, {"image": images[next(which) % len(images)]}), args.iterations)
    elif "ort" in peers:
        row["ort_cuda_ms"] = None
        row["ort_note"] = f"no CUDAExecutionProvider (providers: {ort.get_available_providers()})"
    gpu_model = model.cuda().eval()
    tensors = [torch.from_numpy(x) for x in images]

    def torch_run(m):
        def go():
            with torch.no_grad():
                out = m([tensors[next(which) % len(tensors)].cuda()])[0]
                {k: v.cpu() for k, v in out.items()}
        return go
    if "torch" in peers:
        row["torch_ms"] = median_ms(torch_run(gpu_model), args.iterations, torch.cuda.synchronize)
    if "compile" in peers:
        try:
            compiled = torch.compile(gpu_model)
            row["compile_ms"] = median_ms(torch_run(compiled), args.iterations, torch.cuda.synchronize)
        except Exception as e:   # noqa: BLE001 - a peer's failure is a row, not the end of the run
            row["compile_ms"], row["compile_note"] = None, f"{type(e).__name__}: {str(e)[:200]}"
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="ssdlite,fasterrcnn,retinanet")
    ap.add_argument("--out", default="/tmp/det", help="where the exported ONNX files go")
    ap.add_argument("--size", type=int, default=320, help="the image's height and width")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--peers", default="ort,torch,compile")
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for name in args.models.split(","):
        rows.append(run_model(name, args))
        print(json.dumps(rows[-1]), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
    print(f"\n| model ({args.precision}, {args.size}x{args.size}) | detections | grapec ms | onnxruntime CUDA ms (x) "
          "| torch eager ms (x) | torch.compile ms (x) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        def cell(key):
            v = r.get(key)
            return "-" if v is None else f"{v:.2f} ({v / r['grapec_ms']:.2f}x)"
        print(f"| {r['model']} | {r['detections']} | {r['grapec_ms']:.2f} | {cell('ort_cuda_ms')} | {cell('torch_ms')} "
              f"| {cell('compile_ms')} |")


if __name__ == "__main__":
    main()
