"""Inputs that set shape parameters ("shape inputs"): named by the compiler, fixed with --value,
checked at run time. And `grapec check`'s allclose-style comparison."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import grapec
from grapec.bundle.format import Bundle
from grapec.compiler.accuracy import compare
from grapec.errors import GrapecError, InputError, NeedsValueError

from helpers import model, ort_run, tinfo
from test_cli import assert_user_error, grapec as grapec_cli


def reshape_model():
    """y = Reshape(x, shape) * 2, where `shape` is a graph input computed on (Add 0)."""
    zero = helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("z", TensorProto.INT64, [1], [0]))
    return model([zero, helper.make_node("Add", ["shape", "zero"], ["target"]),
                  helper.make_node("Reshape", ["x", "target"], ["r"]),
                  helper.make_node("Add", ["r", "r"], ["y"])],
                 [tinfo("x", shape=[2, 6]), tinfo("shape", TensorProto.INT64, [2])], [tinfo("y")])


def test_shape_input_is_named_with_the_fix():
    with pytest.raises(NeedsValueError) as e:
        grapec.compile(reshape_model(), targets=[])
    assert e.value.graph_inputs == ("shape",)
    assert "Reshape" in str(e.value) and "--value shape=" in str(e.value)


def test_fixed_value_specializes_and_is_checked_at_run_time():
    m = reshape_model()
    b = grapec.compile(m, values={"shape": [3, 4]}, targets=[])
    sess = grapec.load(Bundle.from_bytes(b.to_bytes()), backend="cpu")
    assert [i.name for i in sess.get_inputs()] == ["x"]
    x = np.random.default_rng(0).standard_normal((2, 6)).astype(np.float32)
    ref = ort_run(m, {"x": x, "shape": np.array([3, 4], np.int64)})["y"]
    for feeds in ({"x": x}, {"x": x, "shape": np.array([3, 4], np.int64)}):
        got = sess.run(feeds)["y"]
        assert got.shape == (3, 4)
        np.testing.assert_allclose(got, ref, rtol=1e-6)
    with pytest.raises(InputError, match=r"'shape' was fixed at compile time to \[3, 4\].*got \[4, 3\]"):
        sess.run({"x": x, "shape": np.array([4, 3], np.int64)})


def test_value_that_does_not_fit_is_refused():
    with pytest.raises(GrapecError, match=r"input .shape. dim 0: --value has 3, the model fixes it to 2"):
        grapec.compile(reshape_model(), values={"shape": [3, 4, 1]}, targets=[])
    with pytest.raises(GrapecError, match="model's inputs"):
        grapec.compile(reshape_model(), values={"nope": [1]}, targets=[])


def test_parameter_computed_from_data_says_so():
    """A Reshape target computed from a big input's data has no compile-time value: no --value hint."""
    m = model([helper.make_node("ReduceMax", ["d"], ["mx"], keepdims=0),
               helper.make_node("Cast", ["mx"], ["n"], to=TensorProto.INT64),
               helper.make_node("Unsqueeze", ["n", "ax"], ["t"]),
               helper.make_node("Reshape", ["x", "t"], ["y"])],
              [tinfo("x", shape=[6]), tinfo("d", shape=[100, 100])], [tinfo("y")],
              [onnx.numpy_helper.from_array(np.array([0], np.int64), "ax")])
    with pytest.raises(NeedsValueError) as e:
        grapec.compile(m, targets=[])
    assert not e.value.graph_inputs and "data of graph input(s) 'd'" in str(e.value)


def test_cli_value(tmp_path):
    p = tmp_path / "reshape.onnx"
    onnx.save(reshape_model(), str(p))
    assert_user_error(*grapec_cli("compile", p, "-o", tmp_path / "a.grape"), "--value shape=")
    rc, out, err = grapec_cli("compile", p, "-o", tmp_path / "a.grape", "--value", "shape=4,3")
    assert rc == 0, err
    rc, out, err = grapec_cli("run", tmp_path / "a.grape", "--backend", "cpu")
    assert rc == 0 and "y: float32[4, 3]" in out, out + err
    rc, out, err = grapec_cli("check", p, "--value", "shape=12,1")
    assert rc == 0 and "PASS" in out, out + err
    assert_user_error(*grapec_cli("compile", p, "--value", "shape=a,b"), "--value shape")


# --- grapec check: per element, atol + rtol * |ref| -------------------------------------------------

def test_near_zero_output_is_judged_by_atol():
    rng = np.random.default_rng(3)
    ref = rng.standard_normal(1000) * 1e-6          # an output that is zero up to rounding
    got = ref + rng.standard_normal(1000) * 1e-7
    r = compare("y", got, ref, atol=1e-5, rtol=1e-3)
    assert r.ok and r.rel > 0.05 and r.max_rel > 0.1    # the relative measures alone would call it a mismatch


def test_real_mismatch_is_caught_and_located():
    ref = np.linspace(1, 2, 100).reshape(10, 10)
    got = ref.copy()
    got[3, 7] += 0.01
    r = compare("y", got, ref, atol=1e-5, rtol=1e-3)
    assert not r.ok and r.bad == 1 and "[3, 7]" in r.note
    assert r.max_abs == pytest.approx(0.01) and r.rel < 1e-3   # the L2 measure alone would have passed it


def test_cli_check_reports_polygraphy_columns_and_takes_inputs(tmp_path):
    m = model([helper.make_node("Sub", ["x", "x"], ["z"]), helper.make_node("Add", ["z", "x"], ["y"])],
              [tinfo("x", shape=["n", 4])], [tinfo("y"), tinfo("z")])
    p = tmp_path / "m.onnx"
    onnx.save(m, str(p))
    x = tmp_path / "x.npy"
    np.save(x, np.arange(12, dtype=np.float32).reshape(3, 4))
    rc, out, err = grapec_cli("check", p, "--input", f"x={x}")
    assert rc == 0, out + err
    assert "max-rel" in out and "rel-L2" in out and "[3, 4]" in out and "PASS" in out
