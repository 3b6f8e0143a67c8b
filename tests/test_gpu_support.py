"""What the GPU backend lacks is known at compile time: the bundle is refused (or, --no-gpu,
marked CPU-only), never a failure at load. ConvTranspose is a GEMM plus a kernel, so it has GPU code."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import grapec
from grapec.codegen.nvrtc import NvrtcUnavailable, nvrtc_version
from grapec.errors import UnsupportedError

from helpers import init, model, tinfo
from test_cli import assert_user_error, grapec as grapec_cli


def nvrtc_here():
    try:
        nvrtc_version()
        return True
    except NvrtcUnavailable:
        return False


needs_nvrtc = pytest.mark.skipif(not nvrtc_here(), reason="NVRTC is not installed here (pip install nvidia-cuda-nvrtc)")


def topk_model():
    return model([helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=-1)],
                 [tinfo("x", shape=[2, 16])], [tinfo("v"), tinfo("i", TensorProto.INT64)],
                 [init("k", np.array([3], np.int64))])


def conv_transpose_model():
    rng = np.random.default_rng(0)
    return model([helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1],
                                   output_padding=[1, 1]),
                  helper.make_node("Relu", ["y"], ["z"])],
                 [tinfo("x", shape=[1, 8, 6, 6])], [tinfo("z")],
                 [init("w", rng.standard_normal((8, 4, 4, 4)).astype(np.float32)),
                  init("b", rng.standard_normal(4).astype(np.float32))])


def test_gap_refused_with_gpu_targets_and_noted_without():
    with pytest.raises(UnsupportedError, match=r"library op 'topk_values' has no GPU implementation.*TopK_0") as e:
        grapec.compile(topk_model(), targets=["sm_90"])
    assert "--no-gpu" in str(e.value)
    b = grapec.compile(topk_model(), targets=[])
    assert any(n.startswith("CPU backend only: library op 'topk") for n in b.manifest["notes"])


def test_cli_gap_is_a_usage_error(tmp_path):
    p = tmp_path / "topk.onnx"
    onnx.save(topk_model(), str(p))
    if nvrtc_here():
        assert_user_error(*grapec_cli("compile", p, "-o", tmp_path / "t.grape", "--target", "sm_90"), "TopK_0", "--no-gpu")
    rc, _, err = grapec_cli("compile", p, "-o", tmp_path / "t.grape", "--no-gpu")
    assert rc == 0 and "CPU backend only" in err, err


@needs_nvrtc
def test_conv_transpose_has_gpu_code():
    b = grapec.compile(conv_transpose_model(), targets=["sm_90"])
    assert b.manifest["targets"] == ["sm_90"] and not any("CPU backend only" in n for n in b.manifest["notes"])
    assert sum(b.manifest["buckets"][0]["steps"].values()) <= 3   # GEMM, col2im (+ bias + relu fused in)
