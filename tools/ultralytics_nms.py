"""ultralytics' own ONNX exports with NMS in the graph (`export(format="onnx", nms=True)`), every task,
compiled by grapec with --strict and compared with onnxruntime on the CPU (issue 36).

    pip install ultralytics          # in a venv whose torch and torchvision import together
    python tools/ultralytics_nms.py --out /tmp/ultralytics

Each model is built from its config with random weights (nothing downloaded); its class prior is
turned off and its class logits scaled to a spread of 0.3, so that the threshold 0.62 passes none,
some or all 300 boxes as the image's contrast grows. Images of five contrasts, each checked whole:
the same [batch, 300, K] output as onnxruntime's, within 1e-3, rows whose scores tie within 1e-5 in
either order.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (config, dynamic export, batch to run)
MODELS = [("yolov8n.yaml", False, 1), ("yolo11n.yaml", False, 1), ("yolov8n.yaml", True, 2),
          ("yolov8n-pose.yaml", False, 1), ("yolov8n-seg.yaml", False, 1), ("yolov8n-obb.yaml", False, 1)]

EXPORT = r'''
import sys, torch
from ultralytics import YOLO
torch.manual_seed(0)
m = YOLO(sys.argv[1])
head = m.model.model[-1]
with torch.no_grad():
    for seq in head.cv3:
        seq[-1].bias.zero_()
    p = m.model.eval()(torch.rand(1, 3, 320, 320))
    while isinstance(p, (list, tuple)):
        p = p[0]
    p = p[0, 4:4 + head.nc].clamp(1e-7, 1 - 1e-7)
    spread = torch.log(p / (1 - p)).std().item()
    for seq in head.cv3:
        seq[-1].weight.mul_(0.3 / spread)
print(m.export(format="onnx", nms=True, imgsz=320, opset=17, simplify=False, dynamic=sys.argv[2] == "1", conf=0.62))
'''


def export(config: str, dynamic: bool, out: str, python: str) -> str:
    """Export in `python` (a venv with ultralytics), in `out`; the ONNX file's path."""
    name = f"{os.path.splitext(config)[0]}{'-dynamic' if dynamic else ''}"
    work = os.path.join(out, name)   # a folder each: ultralytics names the file after the config
    os.makedirs(work, exist_ok=True)
    p = subprocess.run([python, "-c", EXPORT, config, "1" if dynamic else "0"], cwd=work, capture_output=True, text=True,
                       env=dict(os.environ, YOLO_OFFLINE="1"))
    if p.returncode:
        raise RuntimeError(f"{config}: export failed:\n{p.stderr[-2000:]}")
    final = os.path.join(out, f"{name}.onnx")
    os.replace(os.path.join(work, p.stdout.strip().splitlines()[-1]), final)
    return final


def check(path: str, batch: int) -> list:
    """[(contrast, rows onnxruntime kept, equal)] for images of five contrasts."""
    import numpy as np
    import onnxruntime as ort
    sys.path.insert(0, os.path.join(ROOT, "src"))
    import grapec
    shape = (batch, 3, 320, 320)
    sess = grapec.load(grapec.compile(path, shapes={"images": shape}, strict=True, targets=[]), backend="cpu")
    options = ort.SessionOptions()
    options.log_severity_level = 3
    ref = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    rows = []
    for contrast in (0.0, 0.25, 0.5, 1.0, 2.0):
        x = (rng.random(shape) * contrast).astype(np.float32)
        expected = dict(zip([o.name for o in ref.get_outputs()], ref.run(None, {"images": x})))
        got = sess.run({"images": x})
        same = all(got[k].shape == v.shape and _same_rows(got[k], v) for k, v in expected.items())
        first = next(iter(expected.values()))
        rows.append((contrast, int((np.abs(first).sum(-1) > 0).sum()), same))
    return rows


def _same_rows(got, ref) -> bool:
    """Row by row within 1e-3, except that a row may sit up to two places from onnxruntime's where its
    score ties another's within 1e-5 (the two runtimes' float sums order a near-tie differently)."""
    import numpy as np
    close = lambda a, b: np.allclose(a, b, rtol=1e-4, atol=1e-3)  # noqa: E731
    for b in range(ref.shape[0]):
        for i in range(ref.shape[1]):
            if close(got[b, i], ref[b, i]):
                continue
            near = [j for j in range(max(i - 2, 0), min(i + 3, ref.shape[1])) if close(got[b, j], ref[b, i])]
            if not near or abs(float(got[b, near[0], 4]) - float(got[b, i, 4])) > 1e-5:
                return False
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="where the exported ONNX files go")
    ap.add_argument("--python", default=sys.executable, help="a Python with ultralytics installed [default: this one]")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    failed = 0
    print("| export | batch | detections at contrast 0 / 0.25 / 0.5 / 1 / 2 | equal to onnxruntime |")
    print("|---|---|---|---|")
    for config, dynamic, batch in MODELS:
        path = export(config, dynamic, args.out, args.python)
        try:
            rows = check(path, batch)
        except Exception as e:   # noqa: BLE001 - a model's failure is a row, not the end of the run
            failed += 1
            print(f"| {os.path.basename(path)} | {batch} | {type(e).__name__}: {str(e)[:200]} | no |")
            continue
        failed += not all(r[2] for r in rows)
        print(f"| {os.path.basename(path)} | {batch} | {' / '.join(str(r[1]) for r in rows)} | "
              f"{'yes' if all(r[2] for r in rows) else 'no: ' + str([r[0] for r in rows if not r[2]])} |")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
