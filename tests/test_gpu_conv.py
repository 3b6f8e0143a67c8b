"""Channels-last convolutions on the GPU (cuDNN through nvidia-cudnn-frontend, runtime/cuda/dnn.py),
against onnxruntime: every attribute swept, fp32 (no TF32) and fp16, alone, chained and in the CNN zoo."""
import os

import pytest

from conv_cases import CASES, check_conv, conv_model, ids, residual_blocks_model
from grapec.tools.check import check_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "models", "tiny")
pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_conv_on_the_gpu(case, precision, tmp_path):
    check_conv(tmp_path, conv_model(case), "cuda", 7, precision=precision)


@pytest.mark.parametrize("case", CASES[:6], ids=ids(CASES[:6]))
def test_conv_relu_conv_on_the_gpu(case, tmp_path):
    check_conv(tmp_path, conv_model(case, relu_chain=True), "cuda", 7)


def test_fp32_convolutions_do_not_use_tf32(tmp_path):
    """A 3x3 over 256 channels: TF32's 10-bit mantissa would leave ~3e-4 of relative error."""
    case = ("wide", 2, 256, (14, 14), 64, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, True)
    results = check_conv(tmp_path, conv_model(case), "cuda", 7)
    assert max(r.rel for r in results) < 2e-5, [(r.name, r.rel) for r in results]


@pytest.mark.parametrize("name,dims", [("resnet50", {"batch": 1}), ("resnet50", {"batch": 8}),
                                       ("googlenet", {"batch": 4}), ("inception_v3", {"batch": 2}),
                                       ("wav2vec2", {"batch": 2, "samples": 4000})])
def test_cnn_zoo_on_the_gpu(name, dims):
    results, _ = check_model(os.path.join(TINY, f"{name}.onnx"), dims=dims, backend="cuda", seed=11)
    assert all(r.ok for r in results), [(r.name, r.rel, r.note) for r in results]


def test_gemm_path_still_runs_on_the_gpu(tmp_path):
    check_conv(tmp_path, conv_model(CASES[0], relu_chain=True), "cuda", 7, conv="gemm")


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_a_shortcut_folded_into_the_convolution_on_the_gpu(precision, tmp_path):
    """cuDNN's graph with the residual as its second add (runtime/cuda/dnn.py) against onnxruntime."""
    check_conv(tmp_path, residual_blocks_model(), backend="cuda", precision=precision)
