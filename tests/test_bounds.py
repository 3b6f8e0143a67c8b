"""--bound NAME=N (issue 36): an integer tensor read from the data that sets sizes nothing else bounds
(a Range limit, a shape, a Loop's trip count) gets an upper bound; what it sizes is allocated at the
bound and counted at run time, and a run where it goes past the bound is refused by name. Each model
is compiled, written and read back, and run on values in random order (0, a few, the bound) against
onnxruntime on the CPU."""
import numpy as np
import pytest
from onnx import TensorProto, helper

import grapec
from grapec.bundle.format import Bundle
from grapec.errors import InputError
from grapec.runtime.session import Session

from helpers import init, model, ort_run, tinfo
from test_cli import assert_user_error, grapec as grapec_cli

I64 = TensorProto.INT64
BOUND = 16


def range_model():
    """The first n rows of x, n a graph input: Range(0, n) -> Gather, and their column sums."""
    nodes = [helper.make_node("Range", ["zero", "n", "one"], ["idx"]),
             helper.make_node("Gather", ["x", "idx"], ["rows"], axis=0),
             helper.make_node("Mul", ["rows", "two"], ["doubled"]),
             helper.make_node("ReduceSum", ["rows", "axis0"], ["sums"], keepdims=0)]
    return model(nodes, [tinfo("x", shape=[32, 4]), tinfo("n", I64, [])],
                 [tinfo("doubled", shape=["k", 4]), tinfo("sums", shape=[4])],
                 [init("zero", np.array(0, np.int64)), init("one", np.array(1, np.int64)),
                  init("two", np.array(2.0, np.float32)), init("axis0", np.array([0], np.int64))])


def mask_length_model():
    """A tensor as long as a mask has ones (a length computed inside the graph): ReduceSum(mask) ->
    Concat with 4 -> ConstantOfShape, then a sum over it."""
    nodes = [helper.make_node("ReduceSum", ["mask"], ["length"], keepdims=1),
             helper.make_node("Concat", ["length", "four"], ["shape"], axis=0),
             helper.make_node("ConstantOfShape", ["shape"], ["filled"],
                              value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.5])),
             helper.make_node("Mul", ["filled", "w"], ["scaled"]),
             helper.make_node("ReduceSum", ["scaled"], ["total"], keepdims=0)]
    return model(nodes, [tinfo("mask", I64, [24])], [tinfo("scaled", shape=["k", 4]), tinfo("total", shape=[])],
                 [init("four", np.array([4], np.int64)), init("w", np.arange(4, dtype=np.float32))])


def loop_model():
    """A Loop of M iterations, M a graph input, with a scan output (a row per iteration)."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c_out"]),
         helper.make_node("Add", ["acc", "x"], ["acc_out"]),
         helper.make_node("Cast", ["i"], ["fi"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["acc_out", "fi"], ["row"])], "body",
        [tinfo("i", I64, []), tinfo("c", TensorProto.BOOL, []), tinfo("acc", shape=[3])],
        [tinfo("c_out", TensorProto.BOOL, []), tinfo("acc_out", shape=[3]), tinfo("row", shape=[3])])
    return model([helper.make_node("Loop", ["M", "", "a0"], ["a", "rows"], body=body)],
                 [tinfo("M", I64, []), tinfo("a0", shape=[3]), tinfo("x", shape=[3])],
                 [tinfo("a", shape=[3]), tinfo("rows", shape=["k", 3])])


def _mask(rng, ones):
    m = np.zeros(24, np.int64)
    m[rng.permutation(24)[:ones]] = 1
    return m


# (model, the --bound it needs, feeds for a value of it)
CASES = {
    "range": (range_model, "n", lambda rng, v: {"x": rng.standard_normal((32, 4)).astype(np.float32), "n": np.array(v)}),
    "mask_length": (mask_length_model, "length", lambda rng, v: {"mask": _mask(rng, v)}),
    "loop": (loop_model, "M", lambda rng, v: {"M": np.array(v), "a0": rng.standard_normal(3).astype(np.float32),
                                              "x": rng.standard_normal(3).astype(np.float32)}),
}


def bounded_session(case, backend="cpu"):
    make, name, _ = CASES[case]
    b = grapec.compile(make(), targets=[] if backend == "cpu" else "auto", bounds={name: BOUND})
    return Session(Bundle.from_bytes(b.to_bytes()), backend=backend)


def check_bounded_runs(case, sess):
    """Values of the bounded tensor in random order, 0 and the bound among them: onnxruntime's outputs
    and shapes each time."""
    make, name, feeds_for = CASES[case]
    m, rng = make(), np.random.default_rng(36)
    values = [0, BOUND, 1] + list(rng.integers(0, BOUND + 1, 5))
    for v in rng.permutation(values):
        feeds = feeds_for(rng, int(v))
        got, ref = sess.run(feeds), ort_run(m, feeds)
        for out, r in ref.items():
            assert got[out].shape == r.shape, (case, v, out, got[out].shape, r.shape)
            np.testing.assert_allclose(got[out], r, rtol=1e-5, atol=1e-5, err_msg=f"{case} {name}={v} {out}")
    return feeds_for


@pytest.mark.parametrize("case", ["range", "loop", pytest.param("mask_length", marks=pytest.mark.no_round_trip(
    "random masks have more ones than the bound: a run the session refuses by design (tested below)"))])
def test_bounded_sizes_match_onnxruntime(case):
    check_bounded_runs(case, bounded_session(case))


@pytest.mark.parametrize("case,flag,node", [("range", "--bound n=N", "node 'Range_0' (Range)"),
                                            # the length, not the [length, 4] shape it is concatenated into
                                            ("mask_length", "--bound length=N", "(ConstantOfShape)"),
                                            ("loop", "--bound M=N", "node 'Loop_0' (Loop)")])
def test_a_missing_bound_names_the_op_and_the_flag(tmp_path, case, flag, node):
    path = tmp_path / "m.onnx"
    path.write_bytes(CASES[case][0]().SerializeToString())
    assert_user_error(*grapec_cli("compile", path, "--no-gpu", "-q"), node, flag)


@pytest.mark.no_round_trip("random masks have more ones than the bound: the refusal this test checks")
def test_a_value_past_its_bound_is_refused_by_name(tmp_path):
    """A bounded graph input is checked before the run; a bounded value computed inside the graph (or
    fed from a device buffer) after it, from a copy the graph makes: both name it, its bound, what
    reads it and how to raise it, and the session runs on."""
    sess = bounded_session("range")
    feeds = CASES["range"][2](np.random.default_rng(0), BOUND + 1)
    with pytest.raises(InputError, match=r"input 'n' = 17, outside the valid range 0..16 \(--bound n=16, which sizes "
                                         r"node 'Range_0' \(Range\); compile with a larger bound"):
        sess.run(feeds)
    feeds["n"] = np.array(-1)
    with pytest.raises(InputError, match="input 'n' = -1"):
        sess.run(feeds)
    check_bounded_runs("range", sess)

    sess = bounded_session("mask_length")
    feeds = CASES["mask_length"][2](np.random.default_rng(0), BOUND + 4)
    with pytest.raises(InputError, match=r"'length' is 20 in this run, outside its bound 0..16 \(--bound length=16\), "
                                         r"read by node 'Concat_1' \(Concat\): compile again with a larger bound, "
                                         r"e.g. --bound length=40"):
        sess.run(feeds)
    binding = sess.io_binding()   # through an IOBinding too
    binding.bind_cpu_input("mask", feeds["mask"])
    binding.bind_output("total")
    with pytest.raises(InputError, match="'length' is 20"):
        sess.run_with_iobinding(binding)
    check_bounded_runs("mask_length", sess)

    path, bundle = tmp_path / "m.onnx", tmp_path / "m.grape"
    path.write_bytes(range_model().SerializeToString())
    rc, out, err = grapec_cli("compile", path, "-o", bundle, "--no-gpu", "-q", "--bound", "n=16")
    assert rc == 0, err
    assert_user_error(*grapec_cli("run", bundle, "--backend", "cpu", "--input", "n=40"), "'n' = 40", "--bound n=16")
    rc, out, err = grapec_cli("run", bundle, "--backend", "cpu", "--input", "n=9")
    assert rc == 0 and "doubled: float32[9, 4]" in out, (out, err)
    rc, out, err = grapec_cli("inspect", bundle)
    assert rc == 0 and "--bound n=16: read by node 'Range_0' (Range)" in out and "n::bound" not in out, out
    assert "output doubled: float32[<=16, 4]" in out, out


def test_bound_usage_errors(tmp_path):
    path, bundle = tmp_path / "m.onnx", tmp_path / "m.grape"
    path.write_bytes(range_model().SerializeToString())
    assert_user_error(*grapec_cli("compile", path, "--no-gpu", "--bound", "nn=16"), "no value 'nn'")
    assert_user_error(*grapec_cli("compile", path, "--no-gpu", "--bound", "x=16"), "'x' is float32")
    assert_user_error(*grapec_cli("compile", path, "--no-gpu", "--bound", "n=lots"), "expected NAME=N")
    grapec_cli("compile", path, "-o", bundle, "--no-gpu", "-q", "--bound", "n=16")
    assert_user_error(*grapec_cli("run", bundle, "--backend", "cpu", "--bound", "n=8"), "--bound applies when running an .onnx")


@pytest.mark.parametrize("case", ["range", "loop"])
def test_a_bound_holds_in_half_precision(case):
    """fp16's calibration evaluates the bounded graph too (the Loop's counted rows included): the
    outputs keep onnxruntime's shapes and are within fp16's tolerance."""
    make, name, feeds_for = CASES[case]
    b = grapec.compile(make(), targets=[], precision="fp16", bounds={name: BOUND})
    sess = Session(Bundle.from_bytes(b.to_bytes()), backend="cpu")
    rng = np.random.default_rng(5)
    for v in (0, 7, BOUND):
        feeds = feeds_for(rng, v)
        got, ref = sess.run(feeds), ort_run(make(), feeds)
        for out, r in ref.items():
            assert got[out].shape == r.shape, (case, v, out)
            assert np.linalg.norm(got[out] - r) <= 1e-2 * max(np.linalg.norm(r), 1e-6), (case, v, out)
