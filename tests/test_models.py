"""Acceptance on the CPU backend: every committed zoo model and the nine light models that ship
with onnx compile, run, and match onnxruntime to 1e-4 relative error in fp32."""
import glob
import os
import sys

import onnx
import pytest

from grapec.tools.check import check_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import corpus  # noqa: E402
TINY = os.path.join(ROOT, "models", "tiny")
LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
JUDGED_AT = {f.id: f.judged_at for f in corpus.FILES if f.judged_at}

ZOO_DIMS = {
    "gpt2": {"batch": 1, "seq": 8},
    "bert": {"batch": 2, "seq": 8},
    "wav2vec2": {"batch": 1, "samples": 1600},
    "resnet50": {"batch": 1},
    "googlenet": {"batch": 2},
    "inception_v3": {"batch": 2},
    "control_flow": {},
    "gpt2_generate": {},
}
LIGHT_MODELS = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet",
                "squeezenet", "vgg19", "zfnet512"]


def test_zoo_is_complete():
    assert sorted(os.path.basename(p)[:-5] for p in glob.glob(os.path.join(TINY, "*.onnx"))) == sorted(ZOO_DIMS)
    for p in glob.glob(os.path.join(TINY, "*.onnx")):
        assert os.path.getsize(p) <= 2 * 2**20, p


@pytest.mark.parametrize("name", sorted(ZOO_DIMS))
def test_zoo_model_matches_onnxruntime(name):
    results, _ = check_model(os.path.join(TINY, f"{name}.onnx"), dims=ZOO_DIMS[name], rtol=1e-4, seed=11)
    for r in results:
        assert r.ok, f"{name}/{r.name}: rel {r.rel:.3g} max-abs {r.max_abs:.3g} {r.note}"


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_model_matches_onnxruntime(name, tmp_path):
    path = os.path.join(LIGHT, f"light_{name}.onnx")
    judged_at = JUDGED_AT.get(f"light_{name}")
    if judged_at:   # where float32 cannot decide the model's output (the corpus file says why)
        path = corpus.model_judged_at(path, judged_at, str(tmp_path / f"{name}.onnx"))
    results, _ = check_model(path, rtol=1e-4, seed=5)
    for r in results:
        assert r.ok, f"{name}/{r.name}: rel {r.rel:.3g} max-abs {r.max_abs:.3g} {r.note}"
