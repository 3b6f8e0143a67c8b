"""--precision: fp16 keeps the model's interface and computes inside in float16 (float32
accumulation); tf32 is recorded for the GPU runtime; a bad value is a usage error."""
import os

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

import grapec
from grapec.check import check_model
from grapec.cli import main
from grapec.frontend.precision import to_fp16
from helpers import compile_and_run, init, model, ort_run, rel_err, tinfo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def masked_softmax_model():
    nodes = [helper.make_node("Add", ["x", "mask"], ["s"]), helper.make_node("Softmax", ["s"], ["y"], axis=-1)]
    mask = np.triu(np.full((8, 8), np.finfo(np.float32).min, np.float32), 1)   # how exporters spell -inf
    return model(nodes, [tinfo("x", shape=[2, 8, 8])], [tinfo("y")], [init("mask", mask)])


def test_fp16_keeps_the_interface_and_computes_in_half():
    m = masked_softmax_model()
    b = grapec.compile(m, shapes={"x": (2, 8, 8)}, precision="fp16", targets=[])
    assert b.manifest["precision"] == "fp16"
    assert [i["dtype"] for i in b.manifest["inputs"]] == ["float32"]
    assert [o["dtype"] for o in b.manifest["outputs"]] == ["float32"]
    weights = [row for row in b.plans[0].buffers if row.space == "weight"]
    assert weights and all(row.dtype == "float16" for row in weights)
    x = np.random.default_rng(0).standard_normal((2, 8, 8)).astype(np.float32)
    got = grapec.load(b, backend="cpu").run({"x": x})["y"]
    ref = ort_run(m, {"x": x})["y"]
    assert got.dtype == np.float32 and np.isfinite(got).all()
    assert rel_err(got, ref) <= 1e-2 and rel_err(got, ref) > 1e-6   # really computed in half


def test_fp16_clamps_float32_extremes_to_finite_half():
    conv = to_fp16(masked_softmax_model())
    mask = onnx.numpy_helper.to_array(next(t for t in conv.graph.initializer if t.name == "mask"))
    assert mask.dtype == np.float16 and np.isfinite(mask).all() and mask.min() == -65504


def test_fp16_rewrites_casts_and_constants_inside_bodies():
    then_g = helper.make_graph([helper.make_node("Constant", [], ["c"], value_float=2.0),
                                helper.make_node("Mul", ["x", "c"], ["t"])], "then", [], [tinfo("t")])
    else_g = helper.make_graph([helper.make_node("Cast", ["x"], ["e"], to=TensorProto.FLOAT)], "else", [], [tinfo("e")])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["cond"]),
             helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g)]
    m = model(nodes, [tinfo("x", shape=[4])], [tinfo("y")], [init("zero", np.array(0, np.float32))])
    for sign in (1, -1):
        x = sign * np.abs(np.random.default_rng(1).standard_normal(4)).astype(np.float32)
        got, _ = compile_and_run(m, {"x": x}, precision="fp16")
        assert got["y"].dtype == np.float32
        np.testing.assert_allclose(got["y"], ort_run(m, {"x": x})["y"], rtol=2e-3)


@pytest.mark.parametrize("name,dims", [("gpt2", {"batch": 1, "seq": 8}), ("bert", {"batch": 2, "seq": 8}),
                                       ("wav2vec2", {"batch": 1, "samples": 1600})])
def test_fp16_transformers_match_fp32_onnxruntime_within_1e2(name, dims):
    results, _ = check_model(os.path.join(ROOT, "models", "tiny", f"{name}.onnx"), dims=dims, rtol=1e-2,
                             seed=3, precision="fp16")
    for r in results:
        assert r.ok, f"{name}/{r.name}: rel {r.rel:.3g}"


def test_tf32_is_recorded_and_bad_precision_is_a_usage_error(tmp_path):
    m = masked_softmax_model()
    b = grapec.compile(m, shapes={"x": (2, 8, 8)}, precision="tf32", targets=[])
    assert b.manifest["precision"] == "tf32"
    path = tmp_path / "m.onnx"
    onnx.save(m, path)
    r = CliRunner().invoke(main, ["compile", str(path), "--precision", "fp8", "--shapes", "x=2x8x8"])
    assert r.exit_code == 2 and "fp8" in r.output and "Traceback" not in r.output
