"""What the GPU backend lacks is known at compile time: the bundle is refused (or, --no-gpu,
marked CPU-only), never a failure at load. ConvTranspose is a GEMM plus a kernel, so it has GPU code;
TopK is a kernel of its own (ir/selection.py), so it has too."""
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


def int_matmul_model():
    """A MatMul of int32 operands: cuBLASLt takes floating point only here, so it has no GPU code."""
    return model([helper.make_node("MatMul", ["x", "w"], ["y"])],
                 [tinfo("x", TensorProto.INT32, [2, 16])], [tinfo("y", TensorProto.INT32)],
                 [init("w", np.arange(48, dtype=np.int32).reshape(16, 3))])


def conv_transpose_model():
    rng = np.random.default_rng(0)
    return model([helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1],
                                   output_padding=[1, 1]),
                  helper.make_node("Relu", ["y"], ["z"])],
                 [tinfo("x", shape=[1, 8, 6, 6])], [tinfo("z")],
                 [init("w", rng.standard_normal((8, 4, 4, 4)).astype(np.float32)),
                  init("b", rng.standard_normal(4).astype(np.float32))])


def test_gap_refused_with_gpu_targets_and_noted_without():
    with pytest.raises(UnsupportedError, match=r"library op 'matmul' on int32 has no GPU implementation.*MatMul_0") as e:
        grapec.compile(int_matmul_model(), targets=["sm_90"])
    assert "--no-gpu" in str(e.value)
    b = grapec.compile(int_matmul_model(), targets=[])
    assert any(n.startswith("CPU backend only: library op 'matmul' on int32") for n in b.manifest["notes"])


def test_cli_gap_is_a_usage_error(tmp_path):
    p = tmp_path / "int_matmul.onnx"
    onnx.save(int_matmul_model(), str(p))
    if nvrtc_here():
        assert_user_error(*grapec_cli("compile", p, "-o", tmp_path / "t.grape", "--target", "sm_90"), "MatMul_0", "--no-gpu")
    rc, _, err = grapec_cli("compile", p, "-o", tmp_path / "t.grape", "--no-gpu")
    assert rc == 0 and "CPU backend only" in err, err


@needs_nvrtc
def test_conv_transpose_has_gpu_code():
    b = grapec.compile(conv_transpose_model(), targets=["sm_90"])
    assert b.manifest["targets"] == ["sm_90"] and not any("CPU backend only" in n for n in b.manifest["notes"])
    assert sum(b.manifest["buckets"][0]["steps"].values()) <= 3   # GEMM, col2im (+ bias + relu fused in)
