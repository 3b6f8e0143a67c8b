"""The real-model test set (models/real/, built by models/real.py with torch.onnx, onnxruntime's
quantizer and tf2onnx): `grapec check` in fp32, fp16 and bf16 on the CPU backend here, on the CUDA
backend in test_gpu.py. fp16/bf16 either agree within their tolerance or are refused, naming nodes."""
import os

import pytest

from grapec.compiler.mixed_precision import PrecisionError
from grapec.compiler.accuracy import TOLERANCES
from grapec.tools.check import check_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REAL = os.path.join(ROOT, "models", "real")

# name -> (dims, reference, (atol, rtol) for fp32 or None for the default)
REAL_MODELS = {
    "textdet_head": ({"batch": 2}, "onnxruntime", None),      # Conv + BN + ConvTranspose head (torch.onnx)
    "lstm_tagger": ({"batch": 2, "seq": 12}, "onnxruntime", None),   # bidirectional LSTM (torch.onnx)
    "keras_cnn": ({"unk__54": 2}, "onnxruntime", None),        # Keras 3 via tf2onnx (NHWC transposes)
    # int8 activations quantized at run time: a 1e-7 difference before DynamicQuantizeLinear can move
    # a value across a quantization step (1/255 of the tensor's range), so outputs differ by up to a
    # few 1e-3 from any other implementation; onnx.reference cannot run this model (GatherElements).
    "bert_int8": ({"batch": 2, "seq": 16}, "onnxruntime", (1e-2, 1e-2)),
    # onnxruntime's x86 u8s8 QLinearConv saturates its int16 pair sums (0.56 rel off onnx.reference
    # on this model); onnx.reference computes the integer arithmetic exactly.
    "resnet_qlinear": ({"batch": 1}, "onnx", None),
}


def real_check(name, precision, backend="cpu"):
    dims, reference, fp32_tol = REAL_MODELS[name]
    atol, rtol = fp32_tol if fp32_tol and precision == "fp32" else TOLERANCES[precision]
    if fp32_tol and precision != "fp32":
        atol, rtol = max(atol, fp32_tol[0]), max(rtol, fp32_tol[1])
    return check_model(os.path.join(REAL, f"{name}.onnx"), dims=dims, backend=backend, seed=21, precision=precision,
                       atol=atol, rtol=rtol, reference=reference)


def assert_real_model_passes(name, precision, backend="cpu"):
    try:
        results, _ = real_check(name, precision, backend)
    except PrecisionError as e:   # a refusal is allowed for half precisions, and must name nodes
        assert precision != "fp32" and ("diverging nodes" in str(e) or "grows most at" in str(e)), str(e)
        pytest.skip(f"{precision} refused with nodes named: {str(e).splitlines()[0][:120]}")
    for r in results:
        assert r.ok, f"{name}/{r.name} {precision} on {backend}: max-abs {r.max_abs:.3g} rel {r.rel:.3g} {r.note}"
        if precision != "fp32":
            assert r.rel <= 1e-2 if precision == "fp16" else r.rel <= 3e-2


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("name", sorted(REAL_MODELS))
def test_real_model_check(name, precision):
    assert_real_model_passes(name, precision)


def test_the_set_covers_what_the_issue_names():
    import onnx
    ops = {name: {n.op_type for n in onnx.load(os.path.join(REAL, f"{name}.onnx")).graph.node} for name in REAL_MODELS}
    assert "ConvTranspose" in ops["textdet_head"] and "LSTM" in ops["lstm_tagger"]
    assert {"MatMulInteger", "DynamicQuantizeLinear"} <= ops["bert_int8"] and "QLinearConv" in ops["resnet_qlinear"]
    producers = {name: onnx.load(os.path.join(REAL, f"{name}.onnx")).producer_name for name in REAL_MODELS}
    assert producers["keras_cnn"] == "tf2onnx" and producers["textdet_head"] == "pytorch"


def test_check_against_onnx_reference_from_the_cli():
    from click.testing import CliRunner
    from grapec.tools.cli import main
    r = CliRunner().invoke(main, ["check", os.path.join(REAL, "resnet_qlinear.onnx"), "--dim", "batch=1",
                                  "--reference", "onnx", "-q"])
    assert r.exit_code == 0 and "vs onnx.reference (fp32)" in r.output, r.output
