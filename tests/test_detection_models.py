"""torchvision's SSDLite (models/detection.py: ssdlite320_mobilenet_v3_large at 1/8 width, exported by
torch.onnx with its post-processing: per-class thresholds, NonZero, TopK, Concat of the classes'
detections, batched NMS behind an If, the best 25 kept) compiled with --strict, nothing on the host,
against onnxruntime on images that give none, a few and many detections, at two image sizes; and
torchvision's Faster R-CNN and RetinaNet over a small backbone (their RPN proposals, RoiAlign,
per-level top-k and batched NMS as the full models export them), the same way."""
import os

import numpy as np
import onnxruntime as ort
import pytest

import grapec
from grapec.bundle.format import Bundle
from grapec.runtime.session import Session

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SSDLITE = os.path.join(ROOT, "models", "detection", "ssdlite_tiny.onnx")
TWO_STAGE = {"fasterrcnn_tiny": ["boxes", "labels", "scores"], "retinanet_tiny": ["boxes", "scores", "labels"]}


def images(h: int, w: int) -> list:
    rng = np.random.default_rng(0)
    return [np.zeros((3, h, w)), np.ones((3, h, w)), rng.random((3, h, w)), rng.random((3, h, w)) * 50,
            rng.standard_normal((3, h, w)) * 20, np.tile(np.linspace(0, 30, w), (3, h, 1))]


def assert_same_detections(got: dict, ref: dict, score_tol=1e-4, box_tol=2e-2):
    """The same detections: row by row, except that rows whose scores differ by less than score_tol
    may come in either order (a near-tie the two runtimes' float sums order differently)."""
    n = len(ref["scores"])
    assert {k: v.shape for k, v in got.items()} == {k: v.shape for k, v in ref.items()}
    assert got["labels"].dtype == ref["labels"].dtype and got["boxes"].dtype == ref["boxes"].dtype
    free = list(range(n))
    for i in range(n):
        match = [j for j in free if got["labels"][j] == ref["labels"][i]
                 and abs(float(got["scores"][j]) - float(ref["scores"][i])) < score_tol
                 and np.allclose(got["boxes"][j], ref["boxes"][i], rtol=1e-4, atol=box_tol)]
        assert match, f"detection {i} of onnxruntime's ({ref['labels'][i]}, {ref['scores'][i]}, {ref['boxes'][i]}) not found"
        assert abs(match[0] - i) <= 2, (i, match[0])   # at most a near-tie's swap away
        free.remove(match[0])


@pytest.mark.parametrize("h,w", [(96, 128), (64, 64)])
def test_ssdlite_matches_onnxruntime_as_the_count_varies(h, w):
    b = grapec.compile(SSDLITE, shapes={"image": (3, h, w)}, targets=[], strict=True)
    sess = Session(Bundle.from_bytes(b.to_bytes()), backend="cpu")
    ref = ort.InferenceSession(SSDLITE, providers=["CPUExecutionProvider"])
    counts = []
    for x in images(h, w):
        x = x.astype(np.float32)
        expected = dict(zip(["boxes", "scores", "labels"], ref.run(None, {"image": x})))
        assert_same_detections(sess.run({"image": x}), expected)
        counts.append(len(expected["scores"]))
    assert min(counts) == 0 and max(counts) == 25 and len(set(counts)) >= 3, counts
    sizes = {d["op"] for d in b.manifest["buckets"][0]["predicated"]}
    assert sizes == {"NonZero", "TopK", "ConstantOfShape", "NonMaxSuppression"}   # the last inside the If


@pytest.mark.parametrize("name", sorted(TWO_STAGE))
def test_faster_rcnn_and_retinanet_match_onnxruntime_as_the_count_varies(name):
    check_two_stage(name, "cpu")


def check_two_stage(name: str, backend: str):
    path = os.path.join(ROOT, "models", "detection", f"{name}.onnx")
    h, w = 96, 128
    b = grapec.compile(path, shapes={"image": (3, h, w)}, targets=[] if backend == "cpu" else "auto", strict=True)
    sess = Session(Bundle.from_bytes(b.to_bytes()), backend=backend)
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    counts = []
    for x in images(h, w)[:3] + [np.random.default_rng(s).random((3, h, w)) for s in range(1, 4)]:
        x = x.astype(np.float32)
        expected = dict(zip(TWO_STAGE[name], ref.run(None, {"image": x})))
        assert_same_detections(sess.run({"image": x}), expected)
        counts.append(len(expected["scores"]))
    assert min(counts) == 0 and len(set(counts)) >= 3, counts
    assert {"NonZero", "NonMaxSuppression"} <= {d["op"] for d in b.manifest["buckets"][0]["predicated"]}


YOLO = os.path.join(ROOT, "models", "detection", "yolov8_tiny.onnx")


def test_ultralytics_yolov8_with_nms_in_the_graph_matches_onnxruntime():
    check_yolov8("cpu")


def check_yolov8(backend: str):
    """ultralytics' own export with nms=True (models/detection.py yolov8_tiny): its detections padded to
    300 rows by an amount the data decides, which grapec takes as valid rows then pad rows, and a
    Reshape of them to [300, 6] checked at run time; images that give none, one, some and 300."""
    b = grapec.compile(YOLO, targets=[] if backend == "cpu" else "auto", strict=True)
    sess = Session(Bundle.from_bytes(b.to_bytes()), backend=backend)
    ref = ort.InferenceSession(YOLO, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    counts = []
    for scale in (0.0, 0.25, 0.5, 1.0, 2.0):
        x = (rng.random((1, 3, 320, 320)) * scale).astype(np.float32)
        expected = ref.run(None, {"images": x})[0]
        got = sess.run({"images": x})["output0"]
        assert got.shape == expected.shape == (1, 300, 6)
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-3)
        counts.append(int((np.abs(expected[0]).sum(-1) > 0).sum()))
    assert counts[0] == 0 and 0 < min(counts[1:]) and max(counts) == 300 and len(set(counts)) >= 4, counts
