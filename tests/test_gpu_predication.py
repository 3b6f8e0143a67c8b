"""GPU: data-dependent sizes (issue 36) on the CUDA backend, one graph launch a run: NonZero and
NonMaxSuppression against onnxruntime as their counts vary between runs of one session."""
import numpy as np
import pytest

import grapec
from grapec.bundle.format import Bundle
from grapec.runtime.devices import gpu_count
from grapec.runtime.session import Session

from helpers import ort_run
from test_predication import _check_same, detection_head_model, detection_inputs, masked_values_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_count(), reason="needs an NVIDIA GPU")]


def _cuda_session(m):
    b = grapec.compile(m, strict=True)
    assert not b.manifest["notes"]
    return Session(Bundle.from_bytes(b.to_bytes()), backend="cuda")


def test_masked_values_on_the_gpu():
    m = masked_values_model()
    sess = _cuda_session(m)
    rng = np.random.default_rng(11)
    for t in (2.0, 0.9, 0.5, 0.1, -1.0, 0.7):
        feeds = {"x": rng.random((4, 6)).astype(np.float32), "t": np.array(t, np.float32)}
        _check_same(sess.run(feeds), ort_run(m, feeds))


def test_detection_head_on_the_gpu():
    m = detection_head_model(batches=2, boxes=600, classes=5, max_out=50)
    sess = _cuda_session(m)
    rng = np.random.default_rng(12)
    counts = []
    for level in (0.0, 0.4, 1.0, 0.7, 1.0):
        feeds = detection_inputs(rng, b=2, n=600, c=5, level=level)
        ref = ort_run(m, feeds)
        if len(ref["label"]) == 0:
            ref.pop("best")
        _check_same(sess.run(feeds), ref)
        counts.append(len(ref["label"]))
    assert counts[0] == 0 and len(set(counts)) >= 3


def test_topk_on_the_gpu_every_path():
    """Rows of 300 and 8000 ranked a warp per element (k at run time, its bound the row), and a row of
    200000 with k = 1000 by the block's radix select (codegen/selection.py topk_selects); keys with
    many ties, so the cut falls among equal keys."""
    from helpers import init, model, tinfo
    from onnx import TensorProto, helper
    m = model([helper.make_node("TopK", ["a", "k"], ["av", "ai"], axis=1),
               helper.make_node("TopK", ["b", "k"], ["bv", "bi"], axis=1, largest=0),
               helper.make_node("TopK", ["c", "kc"], ["cv", "ci"], axis=1)],
              [tinfo("a", shape=[4, 300]), tinfo("b", shape=[2, 8000]), tinfo("c", shape=[2, 200000]),
               tinfo("k", TensorProto.INT64, [1])],
              [tinfo("av"), tinfo("ai", TensorProto.INT64), tinfo("bv"), tinfo("bi", TensorProto.INT64),
               tinfo("cv"), tinfo("ci", TensorProto.INT64)], [init("kc", np.array([1000], np.int64))])
    sess = _cuda_session(m)
    rng = np.random.default_rng(13)
    for k in (5, 300, 0, 64):
        feeds = {"a": rng.integers(0, 50, (4, 300)).astype(np.float32),
                 "b": rng.integers(0, 500, (2, 8000)).astype(np.float32),
                 "c": (rng.integers(-5000, 5000, (2, 200000)) / 7).astype(np.float32), "k": np.array([k], np.int64)}
        _check_same(sess.run(feeds), ort_run(m, feeds))


def test_ssdlite_on_the_gpu():
    """torchvision's SSDLite with its post-processing (models/detection/ssdlite_tiny.onnx), one launch a run."""
    import onnxruntime as ort
    from test_detection_models import SSDLITE, assert_same_detections, images
    b = grapec.compile(SSDLITE, shapes={"image": (3, 96, 128)}, strict=True)
    sess = Session(Bundle.from_bytes(b.to_bytes()), backend="cuda")
    ref = ort.InferenceSession(SSDLITE, providers=["CPUExecutionProvider"])
    counts = []
    for x in images(96, 128):
        x = x.astype(np.float32)
        expected = dict(zip(["boxes", "scores", "labels"], ref.run(None, {"image": x})))
        assert_same_detections(sess.run({"image": x}), expected)
        counts.append(len(expected["scores"]))
    assert min(counts) == 0 and max(counts) == 25


@pytest.mark.parametrize("name", ["fasterrcnn_tiny", "retinanet_tiny"])
def test_faster_rcnn_and_retinanet_on_the_gpu(name):
    from test_detection_models import check_two_stage
    check_two_stage(name, "cuda")


def test_ultralytics_yolov8_with_nms_on_the_gpu():
    from test_detection_models import check_yolov8
    check_yolov8("cuda")


def test_loop_that_may_stop_early_on_the_gpu():
    """Scan rows counted by the iterations the WHILE node ran (its counter copied out after it)."""
    from test_predication import check_early_stop_loop, early_stop_loop_model
    check_early_stop_loop(_cuda_session(early_stop_loop_model()))


@pytest.mark.parametrize("case", ["range", "loop", pytest.param("mask_length", marks=pytest.mark.no_round_trip(
    "random masks have more ones than the bound: a run the session refuses by design (checked here)"))])
def test_bounded_sizes_on_the_gpu(case):
    """--bound: sizes set by a value read at run time (a Range limit, a shape, a Loop's trip count), at
    the bound in one graph, counted by the run's value; a value computed past its bound is refused."""
    from grapec.errors import InputError
    from test_bounds import CASES, bounded_session, check_bounded_runs
    sess = bounded_session(case, backend="cuda")
    check_bounded_runs(case, sess)
    if case == "mask_length":
        with pytest.raises(InputError, match="'length' is 20 in this run, outside its bound 0..16"):
            sess.run(CASES[case][2](np.random.default_rng(0), 20))
