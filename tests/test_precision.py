"""--precision: fp16 keeps the model's interface and computes inside in float16 (float32
accumulation); tf32 is recorded for the GPU runtime; a bad value is a usage error."""
import os

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

import grapec
from grapec.tools.check import check_model
from grapec.tools.cli import main
from grapec.errors import GrapecError
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


# --- fp16 is never silently wrong: float32 islands found by calibration, or a refusal ---------

def decomposed_layernorm(scale=60.0):
    """LayerNorm as older exporters spell it (Pow, ReduceMean, Sqrt), after a GEMM whose outputs
    are large enough that their squares overflow float16."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("ReduceMean", ["h"], ["mu"], axes=[-1]),
             helper.make_node("Sub", ["h", "mu"], ["d"]),
             helper.make_node("Pow", ["d", "two"], ["sq"]),
             helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1]),
             helper.make_node("Add", ["var", "eps"], ["ve"]),
             helper.make_node("Sqrt", ["ve"], ["sd"]),
             helper.make_node("Div", ["d", "sd"], ["y"])]
    w = (np.random.default_rng(0).standard_normal((64, 64)) * scale).astype(np.float32)
    return model(nodes, [tinfo("x", shape=[4, 64])], [tinfo("y")],
                 [init("w", w), init("two", np.array(2, np.float32)), init("eps", np.array(1e-12, np.float32))], opset=13)


def _fp16_vs_ort(m, x):
    b = grapec.compile(m, precision="fp16", targets=[])
    got = grapec.load(b, backend="cpu").run({"x": x})["y"]
    return b, rel_err(got, ort_run(m, {"x": x})["y"])


def test_fp16_keeps_what_overflows_in_float32_and_says_so():
    x = np.random.default_rng(5).standard_normal((4, 64)).astype(np.float32)
    plain = grapec.load(grapec.compile(to_fp16(decomposed_layernorm()), targets=[]), backend="cpu").run({"x": x})["y"]
    ref = ort_run(decomposed_layernorm(), {"x": x})["y"]
    assert rel_err(plain, ref) > 0.5   # all-half really breaks: x^2 overflows float16, y collapses to 0
    b, err = _fp16_vs_ort(decomposed_layernorm(), x)
    kept = {k["node"]: k["why"] for k in b.manifest["mixed_precision"]["kept_fp32"]}
    assert {"Pow_3", "ReduceMean_4"} <= set(kept) and "65504" in kept["Pow_3"]
    assert "MatMul_0" not in kept   # the GEMM itself stays half
    assert err < 1e-2


def test_fp16_keeps_a_node_whose_error_jumps_and_its_producer():
    nodes = [helper.make_node("Mul", ["x", "k"], ["p"]), helper.make_node("Sin", ["p"], ["s"]),
             helper.make_node("Add", ["s", "x"], ["y"])]
    m = model(nodes, [tinfo("x", shape=[4, 64])], [tinfo("y")], [init("k", np.array(3000, np.float32))])
    x = np.random.default_rng(6).standard_normal((4, 64)).astype(np.float32)
    b, err = _fp16_vs_ort(m, x)
    kept = {k["node"] for k in b.manifest["mixed_precision"]["kept_fp32"]}
    assert kept == {"Mul_0", "Sin_1"} and err < 1e-2   # sin(3000x) is noise when 3000x is rounded to half


def _error_jump_model():
    nodes = [helper.make_node("Mul", ["x", "k"], ["p"]), helper.make_node("Sin", ["p"], ["s"]),
             helper.make_node("Add", ["s", "x"], ["y"])]
    return model(nodes, [tinfo("x", shape=[4, 64])], [tinfo("y")], [init("k", np.array(3000, np.float32))])


@pytest.mark.parametrize("make", [decomposed_layernorm, _error_jump_model], ids=["overflow", "error_jump"])
def test_fp16_calibration_draws_on_threads_decide_as_one_at_a_time(monkeypatch, make):
    """The draws run on threads (compiler/mixed_precision.py _each_draw), each measuring its own errors, merged
    after: the nodes kept in float32 (by an overflow, by an error's jump over rounds) and the errors reported
    are those of the draws one after another."""
    from grapec.compiler import mixed_precision
    seen = []
    real = mixed_precision._each_draw

    def counting(fn, feeds_list):
        seen.append(len(feeds_list))
        return real(fn, feeds_list)
    monkeypatch.setattr(mixed_precision, "_each_draw", counting)
    monkeypatch.setattr(mixed_precision.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    threaded = grapec.compile(make(), precision="fp16", targets=[]).manifest["mixed_precision"]
    assert seen and all(n > 1 for n in seen)   # more than one draw each time: the threads ran
    monkeypatch.setattr(mixed_precision, "MAX_DRAW_THREADS", 1)
    serial = grapec.compile(make(), precision="fp16", targets=[]).manifest["mixed_precision"]
    assert threaded["kept_fp32"] and threaded["kept_fp32"] == serial["kept_fp32"]
    assert threaded["output_rel_err"] == serial["output_rel_err"] and threaded["calibration"] == serial["calibration"]


def test_fp16_calibration_error_is_the_largest_over_the_draws():
    """Each draw on its thread measures its own errors; the probe's and the output's error is the largest of
    them, whichever thread finished first."""
    from grapec.compiler import mixed_precision as mp
    from grapec.compiler.pipeline import lowered_model
    from grapec.frontend.precision import to_half
    m = _error_jump_model()
    shapes = {"x": (4, 64)}
    types = {"p": TensorProto.FLOAT, "s": TensorProto.FLOAT, "x": TensorProto.FLOAT, "y": TensorProto.FLOAT}
    rng = np.random.default_rng(7)
    draws = [{"x": (rng.standard_normal((4, 64)) * scale).astype(np.float32)} for scale in (0.01, 1.0, 0.1)]
    refs, _ = mp._run(lowered_model(mp._exposing(m, ["p", "s"], types), shapes, {}), draws, [])
    half = lowered_model(mp._exposing(to_half(m, "fp16", set(), types), ["p", "s"], types, "fp16"), shapes, {})
    _, together, _ = mp._run_half(half, draws, refs, ["p", "s"], ["y"], [])
    alone = [mp._run_half(half, [d], [r], ["p", "s"], ["y"], [])[1] for d, r in zip(draws, refs)]
    for name in ("s", "y"):
        assert len({a[name] for a in alone}) == 3   # the draws differ, so a wrong merge shows
        assert together[name] == max(a[name] for a in alone)


def test_fp16_keeps_blocked_op_types():
    nodes = [helper.make_node("CumSum", ["x", "axis"], ["c"]), helper.make_node("Relu", ["c"], ["y"])]
    m = model(nodes, [tinfo("x", shape=[4, 64])], [tinfo("y")], [init("axis", np.array(1, np.int64))])
    b = grapec.compile(m, precision="fp16", targets=[])
    assert [(k["op"], k["why"].split(":")[0]) for k in b.manifest["mixed_precision"]["kept_fp32"]] == [("CumSum", "op type")]


def test_fp16_calibration_inputs_reach_what_random_inputs_do_not(tmp_path):
    nodes = [helper.make_node("Exp", ["x"], ["e"]), helper.make_node("Mul", ["e", "k"], ["y"])]
    m = model(nodes, [tinfo("x", shape=[2, 8])], [tinfo("y")], [init("k", np.array(1e-3, np.float32))])
    assert not grapec.compile(m, precision="fp16", targets=[]).manifest["mixed_precision"]["kept_fp32"]
    big = np.full((2, 8), 12.0, np.float32)   # exp(12) = 162755 > 65504
    b = grapec.compile(m, precision="fp16", targets=[], calibration_inputs=[{"x": big}])
    assert {k["node"] for k in b.manifest["mixed_precision"]["kept_fp32"]} == {"Exp_0", "Mul_1"}
    got = grapec.load(b, backend="cpu").run({"x": big})["y"]
    np.testing.assert_allclose(got, ort_run(m, {"x": big})["y"], rtol=1e-3)
    # the same through the CLI, and a sample that misses an input is named
    path, npz = tmp_path / "m.onnx", tmp_path / "calib.npz"
    onnx.save(m, path)
    np.savez(npz, x=big)
    r = CliRunner().invoke(main, ["compile", str(path), "-o", str(tmp_path / "m.grape"), "--precision", "fp16",
                                  "--no-gpu", "--calibration-inputs", str(npz)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["inspect", str(tmp_path / "m.grape")])
    assert "float32: 'Exp_0' (Exp)" in r.output and "1 given sample" in r.output
    np.savez(npz, y=big)
    r = CliRunner().invoke(main, ["compile", str(path), "--precision", "fp16", "--no-gpu", "--calibration-inputs", str(npz)])
    assert r.exit_code == 2 and "no array for input 'x'" in r.output


def test_fp16_that_cannot_be_fixed_is_refused_naming_the_node(tmp_path):
    then_g = helper.make_graph([helper.make_node("Mul", ["x", "big"], ["t"])], "then", [], [tinfo("t")])
    else_g = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [], [tinfo("e")])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0), helper.make_node("Greater", ["s", "lo"], ["c"]),
             helper.make_node("If", ["c"], ["f"], then_branch=then_g, else_branch=else_g, name="overflowing_if"),
             helper.make_node("Mul", ["f", "small"], ["y"])]
    m = model(nodes, [tinfo("x", shape=[4, 64])], [tinfo("y")],
              [init("big", np.array(1e5, np.float32)), init("small", np.array(1e-5, np.float32)),
               init("lo", np.array(-1e9, np.float32))])
    path, out = tmp_path / "m.onnx", tmp_path / "m.grape"
    onnx.save(m, path)
    r = CliRunner().invoke(main, ["compile", str(path), "-o", str(out), "--precision", "fp16", "--no-gpu"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "breaks this model's accuracy" in r.output and "'overflowing_if' (If)" in r.output and "'y'" in r.output
    assert not out.exists()
    assert CliRunner().invoke(main, ["compile", str(path), "-o", str(out), "--no-gpu"]).exit_code == 0   # fp32 is fine


def near_tie_argmax_model():
    """Two logits that differ by 2e-5 relative: float32 picks the second; half rounds their weights to
    the same values (the first column's are half values) and picks the first. The rest are half as large."""
    w = (np.abs(np.random.default_rng(3).standard_normal((32, 1))) + 0.1).astype(np.float16).astype(np.float32)
    cols = np.concatenate([w, w * np.float32(1 + 2e-5), 0.5 * w * np.ones((1, 6), np.float32)], axis=1)
    nodes = [helper.make_node("Abs", ["x"], ["a"]), helper.make_node("MatMul", ["a", "w"], ["logits"]),
             helper.make_node("ArgMax", ["logits"], ["y"], axis=1, keepdims=0)]
    return model(nodes, [tinfo("x", shape=[16, 32])], [tinfo("y", TensorProto.INT64)], [init("w", cols)])


def test_fp16_judges_a_flipped_decision_by_the_values_decided_on():
    """An ArgMax at a near-tie flips in half: its ids are then judged by the logits (within 1e-2), not
    by ||ids - ref|| / ||ref|| (1.0 here, which refused the model)."""
    m = near_tie_argmax_model()
    x = np.random.default_rng(0).standard_normal((16, 32)).astype(np.float32)
    assert (ort_run(m, {"x": x})["y"] == 1).all()
    b = grapec.compile(m, shapes={"x": (16, 32)}, precision="fp16", targets=[])
    assert (grapec.load(b, backend="cpu").run({"x": x})["y"] == 0).all()   # really flipped
    calib = b.manifest["mixed_precision"]["calibration"]
    assert calib["decisions_flipped"] and "ArgMax of 'logits' chose 0 at step 0, float32 1" in calib["decisions_flipped"][0]
    assert 0 < b.manifest["mixed_precision"]["output_rel_err"]["y"] < 1e-2


def test_fp16_refuses_decisions_made_on_values_beyond_the_tolerance():
    with pytest.raises(GrapecError) as e:
        grapec.compile(near_tie_argmax_model(), shapes={"x": (16, 32)}, precision="fp16", targets=[],
                       precision_tolerance=1e-7)
    assert "'y' off by" in str(e.value) and "judged by the values its decisions are made on" in str(e.value)


@pytest.mark.parametrize("name,dims", [("gpt2", {"batch": 1, "seq": 8}), ("bert", {"batch": 2, "seq": 8})])
def test_fp16_transformers_stay_all_half(name, dims):
    """Exporter attention masks (-3.4e38, added at run time in BERT) are not overflow: nothing of
    these models needs float32, so fp16 costs them nothing."""
    b = grapec.compile(os.path.join(ROOT, "models", "tiny", f"{name}.onnx"), dims=dims, precision="fp16", targets=[])
    mixed = b.manifest["mixed_precision"]
    assert mixed["kept_fp32"] == [] and all(e < 1e-2 for e in mixed["output_rel_err"].values())


@pytest.mark.parametrize("name,dims", [("gpt2", {"batch": 1, "seq": 8}), ("bert", {"batch": 2, "seq": 8})])
def test_bf16_computes_in_bfloat16_within_3e2(name, dims):
    path = os.path.join(ROOT, "models", "tiny", f"{name}.onnx")
    b = grapec.compile(path, dims=dims, precision="bf16", targets=[])
    weights = [row for row in b.plans[0].buffers if row.space == "weight" and row.dtype.startswith(("float", "bfloat"))]
    assert weights and {row.dtype for row in weights} == {"bfloat16"}
    assert b.manifest["mixed_precision"]["precision"] == "bf16"
    results, _ = check_model(path, dims=dims, seed=4, precision="bf16")
    for r in results:
        assert r.ok and 1e-4 < r.rel < 3e-2, f"{name}/{r.name}: rel {r.rel:.3g} {r.note}"   # really bfloat16, and close


def test_bf16_keeps_the_float32_range():
    """What overflows float16 fits bfloat16: the decomposed LayerNorm needs no float32 island."""
    m = decomposed_layernorm()
    b = grapec.compile(m, precision="bf16", targets=[])
    assert b.manifest["mixed_precision"]["kept_fp32"] == []
    x = np.random.default_rng(5).standard_normal((4, 64)).astype(np.float32)
    assert rel_err(grapec.load(b, backend="cpu").run({"x": x})["y"], ort_run(m, {"x": x})["y"]) < 3e-2


def test_half_precision_can_calibrate_at_a_smaller_batch(monkeypatch):
    """calibration_dims: a batch-8 bundle calibrated on batch-1 samples (each sample's arithmetic is
    the same; the CPU calibration 8 times cheaper), then right on batch 8 against onnxruntime."""
    import grapec.compiler.mixed_precision as mp
    seen = []
    choose = mp.choose_precision

    def spy(proto, graph, precision, input_shapes, *args, **kwargs):
        seen.append(dict(input_shapes))
        return choose(proto, graph, precision, input_shapes, *args, **kwargs)
    monkeypatch.setattr(mp, "choose_precision", spy)
    path = os.path.join(ROOT, "models", "tiny", "bert.onnx")
    b = grapec.compile(path, dims={"batch": 8, "seq": 16}, precision="fp16", calibration_dims={"batch": 1}, targets=[])
    assert seen == [{"input_ids": (1, 16), "attention_mask": (1, 16)}]
    assert b.manifest["buckets"][0]["shapes"]["input_ids"] == [8, 16]
    sess = grapec.load(b)
    from grapec.bundle.inputs import bundle_inputs
    feeds = bundle_inputs(b.manifest, 0, 5)
    want = ort_run(onnx.load(path), feeds)
    got = sess.run(feeds)
    assert all(rel_err(got[k], want[k]) < 1e-2 for k in want)


def test_calibration_dim_on_the_command_line(tmp_path):
    path = os.path.join(ROOT, "models", "tiny", "bert.onnx")
    r = CliRunner().invoke(main, ["compile", path, "--dim", "batch=4,seq=8", "--precision", "fp16", "--no-gpu",
                                  "--calibration-dim", "batch=1", "-o", str(tmp_path / "b.grape")])
    assert r.exit_code == 0, r.output
    assert "calibrated on 4 random samples" in r.output
    r = CliRunner().invoke(main, ["compile", path, "--dim", "batch=4,seq=8", "--precision", "fp16", "--no-gpu",
                                  "--calibration-dim", "beam=1", "-o", str(tmp_path / "c.grape")])
    assert r.exit_code == 2 and "--calibration-dim names 'beam'" in r.output, r.output


def test_calibration_lowers_the_batch_to_fit_in_memory_and_says_so(monkeypatch, tmp_path):
    """Calibration holds every intermediate of every draw: a batch-16 GPT-2 took over 24 GB and was
    killed. Where the memory available would not hold it, the batch is lowered to what fits (and
    the log says so); where even one sample would not fit, compilation is refused by name."""
    import grapec.compiler.mixed_precision as mp
    import grapec.runtime.devices as devices
    from grapec.frontend.onnx_import import import_model
    from grapec.frontend.shapes import resolve_input_shapes
    path = os.path.join(ROOT, "models", "tiny", "bert.onnx")
    graph = import_model(onnx.load(path))
    at = lambda b: resolve_input_shapes(graph, {}, {"batch": b, "seq": 16})
    per_sample = mp.CALIBRATION_BYTES_PER_FP32_BYTE * mp.intermediate_bytes(graph, at(1), {})
    assert mp.intermediate_bytes(graph, at(8), {}) > 7 * mp.intermediate_bytes(graph, at(1), {})
    room = int(3.5 * per_sample / mp.CALIBRATION_MEMORY_SHARE)      # room for 3 samples, not 8
    assert mp.calibration_memory(graph, at(2), {}, 10 * room, False) == (at(2), None)
    shapes, note = mp.calibration_memory(graph, at(8), {}, room, False)
    assert shapes == at(3) and "calibrating at batch=3, not 8" in note
    with pytest.raises(GrapecError, match=r"calibration at input_ids=8x16.*--calibration-dim"):
        mp.calibration_memory(graph, at(8), {}, room, True)     # the user's own choice is not overridden
    with pytest.raises(GrapecError, match="e.g. batch=1"):
        mp.calibration_memory(graph, at(8), {}, per_sample // 2, False)

    monkeypatch.setattr(devices, "host_memory_available", lambda: room)
    r = CliRunner().invoke(main, ["compile", path, "--dim", "batch=8,seq=16", "--precision", "fp16", "--no-gpu",
                                  "-o", str(tmp_path / "b.grape")])
    assert r.exit_code == 0, r.output
    assert "calibrating at batch=3, not 8" in r.output
    sess = grapec.load(str(tmp_path / "b.grape"))
    from grapec.bundle.inputs import bundle_inputs
    feeds = bundle_inputs(sess.bundle.manifest, 0, 7)
    assert feeds["input_ids"].shape == (8, 16)
    want = ort_run(onnx.load(path), feeds)
    assert all(rel_err(sess.run(feeds)[k], want[k]) < 1e-2 for k in want)


def test_calibrations_error_measure_matches_float64_on_every_path():
    """compiler/mixed_precision._rel_err: the float32 fast path (finiteness read from the sum of squares) gives
    float64's ||got - ref|| / ||ref||, and the exact path takes over for a non-finite got, a ref past half's
    range (saturation counts as right) and a float32 value whose square overflows float32 (measured in float64)."""
    from grapec.compiler.mixed_precision import _rel_err
    rng = np.random.default_rng(0)
    ref = rng.standard_normal(10000).astype(np.float32) * 100
    got = (ref + rng.standard_normal(10000).astype(np.float32)).astype(np.float16)
    want = np.linalg.norm(got.astype(np.float64) - ref) / np.linalg.norm(ref.astype(np.float64))
    assert _rel_err(got, ref) == pytest.approx(want, rel=1e-4)
    for bad in (np.inf, -np.inf, np.nan):
        g = got.copy()
        g[17] = bad
        assert _rel_err(g, ref) == float("inf")
    saturated_ref, saturated_got = ref.copy(), got.astype(np.float32)
    saturated_ref[3], saturated_got[3] = -3.4e38, -65504.0
    assert _rel_err(saturated_got, saturated_ref) == pytest.approx(want, rel=1e-3)
    huge = got.astype(np.float32)   # a float32 result (a node kept in float32) whose square overflows float32
    huge[5] = 1e20
    assert _rel_err(huge, ref) == pytest.approx(1e20 / np.linalg.norm(ref.astype(np.float64)), rel=1e-3)
