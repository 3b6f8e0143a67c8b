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
    fasterrcnn_tiny  torchvision's FasterRCNN over a 1/8-width MobileNetV3 with a 16-channel FPN (two
                   levels), RPN and box head of the same parts as fasterrcnn_mobilenet_v3_large_320_fpn,
                   4 classes, images resized to 128..160
    retinanet_tiny torchvision's RetinaNet (its head, anchors, per-level top-k and batched NMS) over the
                   same backbone, 4 classes, images resized to 128..160
    yolov8_tiny    ultralytics' YOLOv8 at 1/16 width, 8 classes, exported by ultralytics itself with NMS
                   in the graph (`export(format="onnx", nms=True)`: TopK, NonMaxSuppression, then the
                   detections padded to 300 rows by an amount the data decides); needs `pip install
                   ultralytics` (a model from its config: nothing downloaded)
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
    if name in ("fasterrcnn_tiny", "retinanet_tiny"):
        return _tiny_two_stage(name), torch.rand(3, 96, 128)
    ctor = {"ssdlite": D.ssdlite320_mobilenet_v3_large, "fasterrcnn": D.fasterrcnn_mobilenet_v3_large_320_fpn,
            "retinanet": D.retinanet_resnet50_fpn}[name]
    m = ctor(weights=None, weights_backbone=None, num_classes=91)
    if name == "ssdlite":
        calibrate_batch_norm(m, [torch.rand(4, 3, 320, 320) * 2 - 1 for _ in range(4)])
    return m.eval(), torch.rand(3, 320, 320)


def _tiny_two_stage(name: str):
    """Faster R-CNN or RetinaNet of torchvision's own parts over a small backbone: the post-processing
    (RPN proposals, RoiAlign, per-class NMS; RetinaNet's per-level top-k) is the full models', the
    convolutions are few and narrow (a few MB)."""
    import torch
    from torchvision.models import mobilenet_v3_large
    from torchvision.models.detection import FasterRCNN, RetinaNet
    from torchvision.models.detection.anchor_utils import AnchorGenerator
    from torchvision.models.detection.backbone_utils import BackboneWithFPN
    from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead
    from torchvision.models.detection.retinanet import RetinaNetHead
    from torchvision.ops import MultiScaleRoIAlign
    features = mobilenet_v3_large(weights=None, width_mult=0.125).features
    stages = [i for i, b in enumerate(features) if getattr(b, "_is_cn", False)] + [len(features) - 1]
    returned = [stages[-2], stages[-1]]
    channels = [features[i].out_channels for i in returned]
    backbone = BackboneWithFPN(features, {str(i): str(j) for j, i in enumerate(returned)}, channels, 16)
    calibrate = [torch.rand(2, 3, 128, 160) * 2 - 1 for _ in range(3)]
    sizes = ((32,), (64,), (128,))   # the FPN's two levels and its max-pooled third
    anchors = AnchorGenerator(sizes, ((0.5, 1.0, 2.0),) * len(sizes))
    common = dict(min_size=128, max_size=160)
    if name == "fasterrcnn_tiny":
        m = FasterRCNN(backbone, num_classes=None, rpn_anchor_generator=anchors,
                       box_roi_pool=MultiScaleRoIAlign(["0", "1"], 7, 2), box_head=TwoMLPHead(16 * 7 * 7, 64),
                       box_predictor=FastRCNNPredictor(64, 4), rpn_pre_nms_top_n_test=150, rpn_post_nms_top_n_test=60,
                       box_score_thresh=0.6, box_detections_per_img=30, **common)
    else:
        m = RetinaNet(backbone, num_classes=4, anchor_generator=anchors,
                      head=RetinaNetHead(16, anchors.num_anchors_per_location()[0], 4), score_thresh=0.8,
                      topk_candidates=200, detections_per_img=30, **common)
        with torch.no_grad():   # no 1% prior and weights 30000x: scores spread about 0.5, so the threshold
            m.head.classification_head.cls_logits.bias.zero_()   # passes some boxes and not others
            m.head.classification_head.cls_logits.weight.mul_(30000.0)
    norms = [x for x in m.modules() if isinstance(x, torch.nn.BatchNorm2d)]
    for bn in norms:
        bn.reset_running_stats()
        bn.momentum = None
    m.train()
    with torch.no_grad():
        for batch in calibrate:
            m.backbone(batch)
    return m.eval()


def export_yolov8_tiny(out_dir: str) -> str:
    """ultralytics' own ONNX export with NMS, of YOLOv8 at 1/16 width with random weights: the class prior
    off and the logits scaled to a spread of 0.3, so that the threshold 0.62 passes none, a few or many
    boxes as the image's contrast grows."""
    import shutil
    import tempfile

    import torch
    import yaml
    import ultralytics
    from ultralytics import YOLO
    torch.manual_seed(0)
    with open(os.path.join(os.path.dirname(ultralytics.__file__), "cfg", "models", "v8", "yolov8.yaml")) as f:
        cfg = yaml.safe_load(f)
    cfg["scales"], cfg["nc"] = {"n": [0.33, 0.0625, 1024]}, 8
    work = tempfile.mkdtemp()
    with open(os.path.join(work, "yolov8n_t.yaml"), "w") as f:   # the n in the name picks the scale
        yaml.safe_dump(cfg, f)
    model = YOLO(os.path.join(work, "yolov8n_t.yaml"))
    head = model.model.model[-1]
    with torch.no_grad():
        for seq in head.cv3:
            seq[-1].bias.zero_()
        p = model.model.eval()(torch.rand(1, 3, 320, 320))[0][0, 4:].clamp(1e-7, 1 - 1e-7)
        spread = torch.log(p / (1 - p)).std().item()
        for seq in head.cv3:
            seq[-1].weight.mul_(0.3 / spread)
    made = model.export(format="onnx", nms=True, imgsz=320, opset=17, simplify=False, dynamic=False, conf=0.62)
    path = os.path.join(out_dir, "yolov8_tiny.onnx")
    shutil.move(made, path)
    return path


def export(name: str, out_dir: str) -> str:
    import torch
    if name == "yolov8_tiny":
        return export_yolov8_tiny(out_dir)
    model, image = build(name)
    path = os.path.join(out_dir, f"{name}.onnx")
    torch.onnx.export(model, ([image],), path, opset_version=17, input_names=["image"],
                      output_names=output_names(name), dynamo=False, dynamic_axes={"image": {1: "height", 2: "width"}})
    return path


def output_names(name: str) -> list:
    """torchvision's detection dicts in their own key order (Faster R-CNN's roi heads put labels second)."""
    return ["boxes", "labels", "scores"] if name.startswith("fasterrcnn") else ["boxes", "scores", "labels"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="+", choices=["ssdlite_tiny", "fasterrcnn_tiny", "retinanet_tiny", "yolov8_tiny", "ssdlite",
                                                 "fasterrcnn", "retinanet"])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for name in args.names:
        print(export(name, args.out))


if __name__ == "__main__":
    main()
