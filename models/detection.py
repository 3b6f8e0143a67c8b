"""Detection models with their post-processing in the graph (issue 36): torchvision's detectors exported
by torch.onnx, with random weights (nothing downloaded).

    python models/detection.py ssdlite_tiny --out models/detection   # the CI model (2 MB)
    python models/detection.py ssdlite fasterrcnn retinanet --out /tmp/det

Needs torch and torchvision that import together (this project's CPU torch does not load PyPI's
torchvision: see the README; `pip install torch==2.14.1 torchvision==0.29.1` in a venv of its own
does, and so does the GPU machine's).

Random weights give degenerate scores (every class alike, nothing above a threshold). So the
batch-norm statistics are first taken from random images (train mode, a cumulative average), and
the tiny model's background class is pushed down, so that a threshold passes none, a few or many
boxes depending on the image: the counts the tests need to vary.

    ssdlite_tiny   ssdlite320_mobilenet_v3_large at 1/8 width, 4 classes, score threshold 0.55,
                   40 candidates a class, 25 detections; the image 3 x H x W (dynamic H, W)
    ssdlite        ssdlite320_mobilenet_v3_large, 91 classes, torchvision's defaults
    fasterrcnn     fasterrcnn_mobilenet_v3_large_320_fpn, 91 classes
    retinanet      retinanet_resnet50_fpn, 91 classes
"""
from __future__ import annotations

import argparse
import os


def calibrate_batch_norm(model, images):
    """Batch-norm statistics from `images`, as training would leave them (a random init's are degenerate)."""
    import torch
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    for bn in norms:
        bn.reset_running_stats()
        bn.momentum = None   # a cumulative average over the batches below
    model.train()
    with torch.no_grad():
        for batch in images:
            features = model.backbone(batch)
            if hasattr(model, "head"):
                model.head(list(features.values()))
    model.eval()


def build(name: str):
    import torch
    from torchvision.models import detection as D
    torch.manual_seed(0)
    if name == "ssdlite_tiny":
        m = D.ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=4, width_mult=0.125)
        calibrate_batch_norm(m, [torch.rand(4, 3, 320, 320) * 2 - 1 for _ in range(4)])
        m.score_thresh, m.topk_candidates, m.detections_per_img = 0.55, 40, 25
        with torch.no_grad():
            for seq in m.head.classification_head.module_list:
                seq[-1].bias.zero_()
                seq[-1].bias[0::4] -= 4.0   # the background class low: the others pass the threshold
        return m.eval(), torch.rand(3, 96, 128)
    ctor = {"ssdlite": D.ssdlite320_mobilenet_v3_large, "fasterrcnn": D.fasterrcnn_mobilenet_v3_large_320_fpn,
            "retinanet": D.retinanet_resnet50_fpn}[name]
    m = ctor(weights=None, weights_backbone=None, num_classes=91)
    if name == "ssdlite":
        calibrate_batch_norm(m, [torch.rand(4, 3, 320, 320) * 2 - 1 for _ in range(4)])
    return m.eval(), torch.rand(3, 320, 320)


def export(name: str, out_dir: str) -> str:
    import torch
    model, image = build(name)
    path = os.path.join(out_dir, f"{name}.onnx")
    torch.onnx.export(model, ([image],), path, opset_version=17, input_names=["image"],
                      output_names=output_names(name), dynamo=False, dynamic_axes={"image": {1: "height", 2: "width"}})
    return path


def output_names(name: str) -> list:
    """torchvision's detection dicts in their own key order (Faster R-CNN's roi heads put labels second)."""
    return ["boxes", "labels", "scores"] if name == "fasterrcnn" else ["boxes", "scores", "labels"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="+", choices=["ssdlite_tiny", "ssdlite", "fasterrcnn", "retinanet"])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for name in args.names:
        print(export(name, args.out))


if __name__ == "__main__":
    main()
