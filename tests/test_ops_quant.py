"""ops/quant.py against references on fresh random inputs: the dynamic-quantization pattern of
quantized transformers (DynamicQuantizeLinear -> MatMulInteger -> rescale) and QLinearConv with a
bias and per-channel weight scales.

The u8 x s8 product is checked against ONNX's reference evaluator: onnxruntime's x86 CPU kernel
sums pairs of u8*s8 products in int16 with saturation (vpmaddubsw), so with full-range int8 weights
its MatMulInteger is not exact (which is why its quantizer offers reduce_range)."""
import numpy as np
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from helpers import compile_and_run, init, model, ort_run, tinfo


def test_dynamic_quantized_matmul_matches_onnxruntime():
    """What onnxruntime's quantize_dynamic writes for a MatMul: x quantized at run time to uint8,
    the int8 weight per column, the int32 product rescaled by x_scale * w_scale."""
    rng = np.random.default_rng(0)
    w = rng.integers(-127, 128, (16, 8)).astype(np.int8)
    w_scale = (rng.random(8) * 0.02 + 0.01).astype(np.float32)
    m = model([helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
               helper.make_node("MatMulInteger", ["xq", "w", "xz"], ["acc"]),
               helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
               helper.make_node("Mul", ["xs", "ws"], ["s"]),
               helper.make_node("Mul", ["accf", "s"], ["y"])],
              [tinfo("x", shape=[3, 16])], [tinfo("y"), tinfo("xq", TensorProto.UINT8), tinfo("xz", TensorProto.UINT8)],
              [init("w", w), init("ws", w_scale)])
    x = rng.standard_normal((3, 16)).astype(np.float32)
    got, _ = compile_and_run(m, {"x": x})
    ref = dict(zip(["y", "xq", "xz"], ReferenceEvaluator(m).run(None, {"x": x})))
    assert ort_run(m, {"x": x})["xz"] == ref["xz"]
    np.testing.assert_array_equal(got["xq"], ref["xq"])
    np.testing.assert_array_equal(got["xz"], ref["xz"])
    np.testing.assert_allclose(got["y"], ref["y"], rtol=1e-6, atol=1e-6)


def test_qlinear_conv_with_bias_and_per_channel_scales():
    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, (1, 4, 7, 7)).astype(np.uint8)
    w = rng.integers(-127, 128, (6, 4, 3, 3)).astype(np.int8)
    b = rng.integers(-500, 500, 6).astype(np.int32)
    m = model([helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"],
                                pads=[1, 1, 1, 1], strides=[2, 1])],
              [tinfo("x", TensorProto.UINT8, [1, 4, 7, 7])], [tinfo("y", TensorProto.UINT8)],
              [init("xs", np.float32(0.02)), init("xz", np.uint8(120)), init("w", w),
               init("ws", (rng.random(6) * 0.01 + 0.005).astype(np.float32)), init("wz", np.zeros(6, np.int8)),
               init("ys", np.float32(0.05)), init("yz", np.uint8(128)), init("b", b)])
    got, _ = compile_and_run(m, {"x": x})
    np.testing.assert_array_equal(got["y"], ReferenceEvaluator(m).run(None, {"x": x})[0])
