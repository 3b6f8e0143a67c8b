"""What a new user met on other tools' ONNX files and onnxruntime-style calls (issue 31's list):
each of these failed on the main before it and passes now."""
import os
import subprocess
import sys
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import grapec
from grapec.compiler.accuracy import TOLERANCES, compare, half_limit
from grapec.tools.check import check_model
from grapec.errors import IndexRangeError, NeedsValueError
from helpers import init, model, ort_run, tinfo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPT2 = os.path.join(ROOT, "models", "tiny", "gpt2.onnx")


def cli(*args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.path.join(ROOT, "src"), os.environ.get("PYTHONPATH")])))
    env.pop("GRAPEC_DEBUG", None)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "grapec.tools.cli", *map(str, args)], capture_output=True, text=True, env=env,
                       timeout=120)
    return p.returncode, p.stdout + p.stderr, time.perf_counter() - t0


def _signature_model(path, dim_value):
    """Relu over x[?, 4], the unknown dim written as paddle2onnx writes it (dim_value -1) or as 0."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, None)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    for v in (x, y):
        v.type.tensor_type.shape.dim.add().dim_value = dim_value
        v.type.tensor_type.shape.dim.add().dim_value = 4
    m = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))


@pytest.mark.parametrize("dim_value", [-1, 0])
def test_a_signature_with_unknown_dims_compiles_writes_and_loads(tmp_path, dim_value):
    _signature_model(tmp_path / "m.onnx", dim_value)
    grapec.compile(str(tmp_path / "m.onnx"), shapes={"x": (3, 4)}).write(str(tmp_path / "m.grape"))
    sess = grapec.load(str(tmp_path / "m.grape"))
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_array_equal(sess.run({"x": x})["y"], np.maximum(x, 0))
    assert sess.get_inputs()[0].shape[0] in (None, 0) and sess.get_inputs()[0].shape[1] == 4


def test_positions_past_the_table_are_refused_at_compile_time():
    with pytest.raises(IndexRangeError, match=r"index 64 reaches past 'model.transformer.wpe.weight', which has 64"):
        grapec.compile(GPT2, dims={"batch": 1, "seq": 65}, targets=[])
    grapec.compile(GPT2, dims={"batch": 1, "seq": 64}, targets=[])   # the last length that fits


@pytest.mark.parametrize("name,why", [("gpt2", "index 99 reaches past 'model.transformer.wpe.weight'"),
                                      ("bert", "node 'node_expand_1' (Expand)")])
def test_a_dynamic_range_past_the_table_names_the_largest_size_that_fits(name, why):
    """GPT-2 gathers its positions (a table of 64); BERT slices a buffer of 64 token types, which
    ONNX's Slice clamps, and the Expand to the sequence's length is what fails: both name the node."""
    rc, out, _ = cli("compile", os.path.join(ROOT, "models", "tiny", f"{name}.onnx"), "--dim", "batch=1",
                     "--dynamic", "seq=1:100", "--no-gpu", "-o", os.devnull + ".grape")
    assert rc == 2 and "The largest seq that fits is 64: use --dynamic seq=1:64" in out and why in out, out
    assert "internal error" not in out


@pytest.mark.parametrize("op,table,indices", [
    ("Gather", np.ones((5, 3), np.float32), np.array([0, 5], np.int64)),
    ("GatherElements", np.ones((5, 3), np.float32), np.array([[0, 1, 2], [5, 0, 0]], np.int64)),
    ("GatherND", np.ones((5, 3), np.float32), np.array([[0, 1], [1, 3]], np.int64)),
    ("Gather", np.ones((5, 3), np.float32), np.array([-6], np.int64)),
])
def test_constant_indices_out_of_range_name_the_node_and_table(op, table, indices):
    m = model([helper.make_node("Identity", ["t"], ["x"]), helper.make_node(op, ["x", "i"], ["y"], name="the_gather")],
              [tinfo("t", shape=list(table.shape))], [tinfo("y")], [init("i", indices)])
    with pytest.raises(IndexRangeError, match="node 'the_gather'.*reaches past 'x'"):
        grapec.compile(m, shapes={"t": table.shape}, targets=[])
    assert "Gather" in op   # onnxruntime refuses the same model at run time:
    with pytest.raises(Exception):
        ort_run(m, {"t": table})


@pytest.mark.parametrize("batch", [5, 17, 64])
def test_a_batch_of_decode_steps_compiles(batch):
    """batch >= 5 at seq 1 crashed the compiler ('value matmul_1 has no storage')."""
    results, _ = check_model(GPT2, dims={"batch": batch, "seq": 1})
    assert all(r.ok for r in results), [(r.name, r.rel, r.note) for r in results]


def test_output_into_a_missing_directory_is_a_user_error(tmp_path):
    rc, out, _ = cli("compile", GPT2, "--dim", "batch=1,seq=8", "--no-gpu", "-o", tmp_path / "nope" / "m.grape")
    assert rc == 2 and f"the directory {tmp_path / 'nope'} does not exist" in out, out


def test_the_cuda_backend_without_a_driver_is_a_user_error(tmp_path):
    from grapec.runtime.devices import gpu_count
    if gpu_count():
        pytest.skip("this machine has a GPU")
    rc, out, _ = cli("run", GPT2, "--dim", "batch=1,seq=8", "--backend", "cuda")
    assert rc == 2 and "needs an NVIDIA GPU and its driver" in out and "internal error" not in out, out
    from grapec.errors import BackendError
    with pytest.raises(BackendError, match="needs an NVIDIA GPU"):
        grapec.load(grapec.compile(GPT2, dims={"batch": 1, "seq": 8}, targets=[]), backend="cuda")


def test_a_size_beyond_the_gpu_is_refused_within_seconds(tmp_path):
    """seq=100000000 ran for 10 minutes and 1.6 GB before it was stopped."""
    rc, out, dt = cli("compile", GPT2, "--dim", "batch=1,seq=100000000", "--no-gpu", "-o", tmp_path / "m.grape")
    assert rc == 2 and "need" in out and "GiB" in out and "has 79.6 GiB" in out, out
    assert dt < 20, f"took {dt:.1f}s"
    m = model([helper.make_node("Relu", ["x"], ["y"])], [tinfo("x", shape=["n", 1000])], [tinfo("y")])
    onnx.save(m, str(tmp_path / "relu.onnx"))
    rc, out, dt = cli("compile", tmp_path / "relu.onnx", "--dim", "n=100000000", "--no-gpu", "-o", tmp_path / "r.grape")
    assert rc == 2 and "activations 745.1 GiB" in out, out
    assert not (tmp_path / "r.grape").exists()


def _if_on_input(tmp_path, same_shapes: bool):
    """silero VAD's shape: an If on `sr == 16000` whose branches reshape differently."""
    def branch(name, n):
        return helper.make_graph(
            [helper.make_node("Reshape", ["x", f"s_{name}"], [f"r_{name}"]),
             helper.make_node("MatMul", [f"r_{name}", f"w_{name}"], [f"y_{name}"])], name, [],
            [tinfo(f"y_{name}", TensorProto.FLOAT, None)],
            [init(f"s_{name}", np.array([-1, n], np.int64)), init(f"w_{name}", np.full((n, 4), 0.5, np.float32))])
    m = model([helper.make_node("Equal", ["sr", "k"], ["c"]),
               helper.make_node("If", ["c"], ["y"], then_branch=branch("a", 8), else_branch=branch("b", 8 if same_shapes else 4))],
              [tinfo("x", TensorProto.FLOAT, [2, 8]), tinfo("sr", TensorProto.INT64, [])], [tinfo("y", TensorProto.FLOAT, None)],
              [init("k", np.array(16000, np.int64))])
    onnx.save(m, str(tmp_path / "if.onnx"))
    return tmp_path / "if.onnx"


def test_an_if_on_an_input_names_the_input_and_value(tmp_path):
    path = _if_on_input(tmp_path, same_shapes=False)
    with pytest.raises(NeedsValueError, match=r"condition 'c' is known only at run time.*graph input\(s\) 'sr'.*--value sr="):
        grapec.compile(str(path), targets=[])
    for sr in (16000, 8000):   # with the value, the taken branch alone is compiled, and matches onnxruntime
        results, _ = check_model(str(path), values={"sr": np.array(sr)})
        assert all(r.ok for r in results)


def test_an_if_on_an_input_whose_branches_agree_is_one_conditional_node(tmp_path):
    path = _if_on_input(tmp_path, same_shapes=True)
    b = grapec.compile(str(path), targets=[])
    sess = grapec.load(b)
    x = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)
    for sr in (16000, 8000):
        want = ort_run(onnx.load(str(path)), {"x": x, "sr": np.array(sr)})["y"]
        np.testing.assert_allclose(sess.run({"x": x, "sr": np.array(sr)})["y"], want, rtol=1e-5, atol=1e-6)


def test_onnxruntime_calling_convention():
    b = grapec.compile(os.path.join(ROOT, "models", "tiny", "bert.onnx"), dims={"batch": 2, "seq": 8}, targets=[])
    sess = grapec.load(b)
    ids = np.random.default_rng(0).integers(0, 100, (2, 8)).astype(np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones((2, 8), np.int64)}
    by_name = sess.run(feeds)
    every = sess.run(None, feeds)
    assert isinstance(every, list) and [o.name for o in sess.get_outputs()] == list(by_name)
    for got, name in zip(every, by_name):
        np.testing.assert_array_equal(got, by_name[name])
    last_first = sess.run(["pooler_output", "last_hidden_state"], feeds)
    np.testing.assert_array_equal(last_first[0], by_name["pooler_output"])
    np.testing.assert_array_equal(last_first[1], by_name["last_hidden_state"])
    i = sess.get_inputs()[0]
    assert (i.name, i.type, i.shape) == ("input_ids", "tensor(int64)", ["batch", "seq"])
    assert sess.get_outputs()[0].type == "tensor(float)"
    from grapec.errors import InputError
    with pytest.raises(InputError, match="unknown output"):
        sess.run(["nope"], feeds)
    with pytest.raises(InputError, match="output_names must be a list"):
        sess.run("pooler_output", feeds)


def test_trtexec_shapes_are_read(tmp_path):
    rc, out, _ = cli("compile", GPT2, "--shapes", "input_ids:1x8", "--no-gpu", "-o", tmp_path / "m.grape")
    assert rc == 0, out
    assert "input_ids=1x8" in out


def test_half_precision_is_accepted_with_a_margin_on_several_draws(tmp_path):
    """y = (x + 40) - 40 in float16 is off by about ulp(40) / sqrt(12) = 9e-3 in ||out-ref||/||ref||:
    inside check's 1e-2, so one draw without a margin (compile's old rule) shipped it on the edge,
    where a fresh draw can fall past it. Calibration judges by check's measure within 0.8 of it on
    4 draws, so the add and subtract stay float32, and check passes on inputs calibration never saw."""
    m = model([helper.make_node("Add", ["x", "c"], ["shifted"], name="shift"),
               helper.make_node("Sub", ["shifted", "c"], ["y"], name="unshift")],
              [tinfo("x", shape=[64, 64])], [tinfo("y")], [init("c", np.float32(40.0))])
    onnx.save(m, str(tmp_path / "m.onnx"))
    x = np.random.default_rng(5).standard_normal((64, 64)).astype(np.float32)
    half = ((x.astype(np.float16) + np.float16(40)) - np.float16(40)).astype(np.float32)
    edge = compare("y", half, x, *TOLERANCES["fp16"], half_limit("fp16"), elementwise=False)
    assert edge.ok and 0.8e-2 < edge.rel < 1e-2   # what half alone gives: passes check, not the margin
    b = grapec.compile(str(tmp_path / "m.onnx"), precision="fp16", targets=[])
    mixed = b.manifest["mixed_precision"]
    assert {k["node"] for k in mixed["kept_fp32"]} >= {"unshift"}
    assert mixed["calibration"]["samples"] == "4 random samples"
    for seed in (0, 7):   # inputs calibration never saw
        results, _ = check_model(str(tmp_path / "m.onnx"), precision="fp16", seed=seed)
        assert all(r.ok and r.rel < 0.8e-2 for r in results), [(r.rel, r.note) for r in results]


def test_check_judges_half_by_the_measure_compile_accepts_by():
    """A half GEMM's output near zero carries its whole dot product's rounding: allclose fails such
    elements on a right model, so in fp16 they are counted and rel-L2 judges (unless --atol is given)."""
    ref = np.array([1.0, -1.0, 0.002, 2.0], np.float32)
    got = np.array([1.0, -1.0, 0.02, 2.0], np.float32)    # 1 element outside allclose(1e-2, 1e-2), rel-L2 7e-3
    judged = compare("y", got, ref, *TOLERANCES["fp16"], half_limit("fp16"), elementwise=False)
    assert judged.ok and judged.bad == 1 and "not judged" in judged.note
    assert not compare("y", got, ref, *TOLERANCES["fp16"], half_limit("fp16"), elementwise=True).ok
    assert not compare("y", got * 1.02, ref, *TOLERANCES["fp16"], half_limit("fp16"), elementwise=False).ok


def test_classical_ml_ops_are_refused_by_name():
    """onnxruntime ships logreg_iris.onnx (onnxmltools): ai.onnx.ml ops, which grapec does not run."""
    import importlib.util
    from grapec.errors import UnsupportedError
    path = os.path.join(os.path.dirname(importlib.util.find_spec("onnxruntime").origin), "datasets", "logreg_iris.onnx")
    rc, out, _ = cli("compile", path, "--no-gpu", "-o", os.devnull + ".grape")
    assert rc == 2 and "op LinearClassifier (domain ai.onnx.ml)" in out and "op ZipMap (domain ai.onnx.ml)" in out, out
    with pytest.raises(UnsupportedError, match="Normalizer"):
        grapec.compile(path, targets=[])


def test_nodes_inside_a_known_branch_can_stay_float32(tmp_path):
    """An If on a --value input is its taken branch at compile time; calibration sees that branch's
    nodes as the model's own, so one that breaks in half stays float32 (silero VAD's layout: the
    whole model inside an If on `sr`)."""
    then = helper.make_graph([helper.make_node("Add", ["x", "c"], ["shifted"], name="shift"),
                              helper.make_node("Sub", ["shifted", "c"], ["y_then"], name="unshift")], "then", [],
                             [tinfo("y_then", TensorProto.FLOAT, None)], [init("c", np.float32(40.0))])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["y_else"])], "else", [],
                              [tinfo("y_else", TensorProto.FLOAT, None)])
    m = model([helper.make_node("Equal", ["sr", "k"], ["cond"]),
               helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)],
              [tinfo("x", shape=[64, 64]), tinfo("sr", TensorProto.INT64, [])], [tinfo("y")],
              [init("k", np.array(16000, np.int64))])
    onnx.save(m, str(tmp_path / "m.onnx"))
    b = grapec.compile(str(tmp_path / "m.onnx"), precision="fp16", values={"sr": np.array(16000)}, targets=[])
    assert "unshift" in {k["node"] for k in b.manifest["mixed_precision"]["kept_fp32"]}
    results, _ = check_model(str(tmp_path / "m.onnx"), precision="fp16", values={"sr": np.array(16000)}, seed=3)
    assert all(r.ok for r in results), [(r.rel, r.note) for r in results]
