"""If and Loop as the backends run them (plan.py): branches write the If's outputs in place, carried
values live in the Loop's outputs and update in place where safe, scan rows land at the device
counter. Each model is checked against onnxruntime, graphed and with --host-control; the GPU cases
(marked gpu) check that a model with If/Loop replays as one graph launch."""
import os
import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper

import grapec
from grapec.bundle.format import Bundle
from grapec.errors import BundleError, InputError, UnsupportedError
from grapec.plan import IfStep, KernelStep, LoopStep, ScanStoreStep, regions, walk_steps
from helpers import compile_and_run, init, model, ort_run, tinfo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
I64, BOOL = TensorProto.INT64, TensorProto.BOOL


def if_model(then_passes_x: bool = False):
    """y = -x (or x itself) if c else exp(x); z = y + 1 outside the If."""
    then_nodes = [helper.make_node("Identity", ["x"], ["t"])] if then_passes_x else [helper.make_node("Neg", ["x"], ["t"])]
    then_g = helper.make_graph(then_nodes, "then", [], [tinfo("t")])
    else_g = helper.make_graph([helper.make_node("Exp", ["x"], ["e"])], "else", [], [tinfo("e")])
    return model([helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
                  helper.make_node("Add", ["y", "one"], ["z"])],
                 [tinfo("x", shape=[5]), tinfo("c", BOOL, [])], [tinfo("y"), tinfo("z")],
                 [init("one", np.array(1.0, np.float32))])


def fibonacci_model():
    """(a, b) -> (a + b, a) for M steps; scan output: a at each step."""
    body = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["a_next"]),
         helper.make_node("Identity", ["a"], ["b_next"]),
         helper.make_node("Identity", ["a"], ["a_row"]),
         helper.make_node("Identity", ["c"], ["go"])],
        "fib", [tinfo("i", I64, []), tinfo("c", BOOL, []), tinfo("a", shape=[3]), tinfo("b", shape=[3])],
        [tinfo("go", BOOL, []), tinfo("a_next", shape=[3]), tinfo("b_next", shape=[3]), tinfo("a_row", shape=[3])])
    return model([helper.make_node("Loop", ["M", "", "a0", "b0"], ["a", "b", "rows"], body=body)],
                 [tinfo("a0", shape=[3]), tinfo("b0", shape=[3])], [tinfo("a"), tinfo("b"), tinfo("rows")],
                 [init("M", np.array(12, np.int64))])


def accumulate_model():
    """acc += x * i until sum(acc) >= limit or M trips: M and limit are inputs (data-dependent length)."""
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["fi"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["x", "fi"], ["xi"]),
         helper.make_node("Add", ["acc_in", "xi"], ["acc_out"]),
         helper.make_node("ReduceSum", ["acc_out"], ["tot"], keepdims=0),
         helper.make_node("Less", ["tot", "limit"], ["go"])],
        "acc", [tinfo("i", I64, []), tinfo("c", BOOL, []), tinfo("acc_in", shape=[4])],
        [tinfo("go", BOOL, []), tinfo("acc_out", shape=[4])])
    return model([helper.make_node("Loop", ["M", "", "acc0"], ["acc"], body=body)],
                 [tinfo("x", shape=[4]), tinfo("acc0", shape=[4]), tinfo("M", I64, []), tinfo("limit", shape=[])],
                 [tinfo("acc")])


def check_both_modes(m, feeds):
    ref = ort_run(m, feeds)
    bundles = []
    for host in (False, True):
        got, b = compile_and_run(m, {k: np.asarray(v) for k, v in feeds.items()}, host_control=host)
        for k in ref:
            np.testing.assert_allclose(got[k], ref[k], rtol=1e-6, atol=1e-6, err_msg=f"{k} host_control={host}")
        bundles.append(b)
    return bundles


def test_if_branches_write_the_if_outputs_in_place():
    x = np.random.default_rng(0).standard_normal(5).astype(np.float32)
    for c in (True, False):
        graphed, host = check_both_modes(if_model(), {"x": x, "c": np.array(c)})
    plan = graphed.plans[0]
    (st,) = regions(plan)
    out = plan.buffers[st.outputs[0]]
    for branch in (st.then, st.else_):
        last = plan.buffers[branch.steps[-1].out]
        assert (last.space, last.offset) == (out.space, out.offset)   # no select copy after the If


def test_if_branch_returning_an_outer_value_gets_its_own_copy():
    x = np.random.default_rng(1).standard_normal(5).astype(np.float32)
    for c in (True, False):
        graphed, _ = check_both_modes(if_model(then_passes_x=True), {"x": x, "c": np.array(c)})
    (st,) = regions(graphed.plans[0])
    assert len(st.then.steps) == 1 and isinstance(st.then.steps[0], KernelStep)   # the copy of x


def test_loop_carried_values_scan_rows_and_a_swap():
    a0 = np.random.default_rng(2).uniform(0, 1, 3).astype(np.float32)
    b0 = np.random.default_rng(3).uniform(0, 1, 3).astype(np.float32)
    graphed, _ = check_both_modes(fibonacci_model(), {"a0": a0, "b0": b0})
    (st,) = regions(graphed.plans[0])
    assert any(isinstance(s, ScanStoreStep) for s in st.body.steps)
    # a_next reads a (in place would race with b_next's copy of a): it is computed apart, then copied home
    bufs = graphed.plans[0].buffers
    homes = [s for s in st.body.steps if isinstance(s, KernelStep) and s.origin == st.origin]
    assert homes and all(bufs[s.out].offset != bufs[s.args[0]].offset for s in homes)


def test_loop_with_data_dependent_length_updates_in_place():
    rng = np.random.default_rng(4)
    x = rng.uniform(0.5, 1.5, 4).astype(np.float32)
    for trips, limit in ((10, 6.0), (10, 1e6), (0, 1.0), (3, 1e6)):
        graphed, _ = check_both_modes(accumulate_model(), {"x": x, "acc0": np.full(4, 0.01, np.float32),
                                                             "M": np.array(trips), "limit": np.array(limit, np.float32)})
    (st,) = regions(graphed.plans[0])
    bufs = graphed.plans[0].buffers
    # acc_out = acc_in + x*i reads acc_in element by element: it is written straight into the carried slot,
    # which is the Loop's own output: no copy home, none out
    assert not st.exit and not [s for s in st.body.steps if s.origin == st.origin]
    (add,) = [s for s in st.body.steps if isinstance(s, KernelStep) and bufs[s.out].shape == (4,)]
    assert bufs[add.out].offset == bufs[st.outputs[0]].offset


def test_control_flow_zoo_model_graphed_and_host_agree():
    import onnx
    m = onnx.load(os.path.join(ROOT, "models", "tiny", "control_flow.onnx"))
    for tok in (3, 7, 11):
        h0 = np.random.default_rng(tok).standard_normal(16).astype(np.float32)
        graphed, host = check_both_modes(m, {"start_token": np.array([tok], np.int64), "h0": h0})
    nested = [r for r in walk_steps(graphed.plans[0].steps) if isinstance(r, IfStep)]
    assert nested and all(r.graphed for r in regions(graphed.plans[0]))
    assert not any(r.graphed for r in regions(host.plans[0]))


def test_strict_refuses_host_control_and_accepts_graphed_regions():
    m = fibonacci_model()
    grapec.compile(m, strict=True, targets=[])
    with pytest.raises(UnsupportedError, match="--strict.*Loop node"):
        grapec.compile(m, strict=True, host_control=True, targets=[])


@pytest.mark.parametrize("bad, match", [
    ("trip", r"trip count M 'M' must be a single int64, got float32"),
    ("cond", r"condition 'cond0' must be a single bool, got int32"),
    ("body_cond", r"condition output 'go' must be a single bool, got float32"),
])
def test_wrong_control_dtypes_are_clear_errors(tmp_path, bad, match):
    go_type = TensorProto.FLOAT if bad == "body_cond" else BOOL
    body = helper.make_graph(
        [helper.make_node("Add", ["v", "v"], ["v2"]),
         helper.make_node("Identity" if bad != "body_cond" else "Cast", ["c"] if bad != "body_cond" else ["c"], ["go"],
                          **({"to": TensorProto.FLOAT} if bad == "body_cond" else {}))],
        "b", [tinfo("i", I64, []), tinfo("c", BOOL, []), tinfo("v", shape=[2])],
        [tinfo("go", go_type, []), tinfo("v2", shape=[2])])
    m_init = np.array(3.0, np.float32) if bad == "trip" else np.array(3, np.int64)
    c_init = np.array(1, np.int32) if bad == "cond" else np.array(True)
    m = model([helper.make_node("Loop", ["M", "cond0", "v0"], ["v"], body=body)], [tinfo("v0", shape=[2])],
              [tinfo("v")], [init("M", m_init), init("cond0", c_init)])
    path = tmp_path / "bad.onnx"
    path.write_bytes(m.SerializeToString())
    r = subprocess.run([sys.executable, "-m", "grapec.tools.cli", "compile", str(path), "--no-gpu", "-q"],
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.path.join(ROOT, "src")})
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert __import__("re").search(match, r.stderr), r.stderr


def test_negative_trip_count_from_an_input_is_refused_before_running(tmp_path):
    m = accumulate_model()
    feeds = {"x": np.ones(4, np.float32), "acc0": np.zeros(4, np.float32), "M": np.array(-2, np.int64),
             "limit": np.array(3.0, np.float32)}
    with pytest.raises(InputError, match=r"input 'M' = -2, outside the valid range 0\.\.inf \(trip count of Loop"):
        compile_and_run(m, feeds)
    path = tmp_path / "acc.onnx"
    path.write_bytes(m.SerializeToString())
    for k, v in feeds.items():
        np.save(tmp_path / f"{k}.npy", v)
    r = subprocess.run([sys.executable, "-m", "grapec.tools.cli", "run", str(path), "--backend", "cpu",
                        "--shapes", "x=4,acc0=4,M=,limit="]
                       + [a for k in feeds for a in ("--input", f"{k}={tmp_path / (k + '.npy')}")],
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.path.join(ROOT, "src")})
    assert r.returncode == 2 and "Traceback" not in r.stderr and "'M' = -2" in r.stderr, r.stderr


def test_corrupted_loop_step_is_refused_at_load():
    b = grapec.compile(fibonacci_model(), targets=[])
    st = regions(b.plans[0])[0]
    st.counter = st.outputs[0]          # a float buffer where the int64 iteration counter belongs
    with pytest.raises(BundleError, match="must hold one int64"):
        Bundle.from_bytes(b.to_bytes())


def test_setter_kernels_are_linked_without_a_gpu():
    pytest.importorskip("cuda.bindings.nvjitlink")
    from grapec.codegen.nvrtc import NvrtcUnavailable, nvrtc_version
    try:
        nvrtc_version()
    except NvrtcUnavailable:
        pytest.skip("NVRTC not installed")
    b = grapec.compile(fibonacci_model(), targets=["sm_90"])
    assert b.manifest["cuda"]["control"] and b.extra_sections["control.sm_90"][:4] == b"\x7fELF"
    assert b"grapec_scan_store" in b.extra_sections["cuda.source"]
    host = grapec.compile(fibonacci_model(), targets=["sm_90"], host_control=True)
    assert not host.manifest["cuda"]["control"] and "control.sm_90" not in host.extra_sections


# --- on the GPU ----------------------------------------------------------------------------------

def _gpu_matches(m, feeds):
    ref = ort_run(m, feeds)
    out = {}
    for host in (False, True):
        b = grapec.compile(m, shapes={k: np.asarray(v).shape for k, v in feeds.items()}, host_control=host)
        sess = grapec.load(Bundle.from_bytes(b.to_bytes()), backend="cuda")
        got = sess.run(feeds)
        for k in ref:
            np.testing.assert_allclose(got[k], ref[k], rtol=1e-5, atol=1e-5, err_msg=f"{k} host_control={host}")
        out[host] = sess._runner.launched   # by the last run
    return out


@pytest.mark.gpu
def test_if_and_loops_on_gpu_match_onnxruntime_in_one_launch():
    rng = np.random.default_rng(5)
    x = rng.standard_normal(5).astype(np.float32)
    for c in (True, False):
        assert _gpu_matches(if_model(), {"x": x, "c": np.array(c)})[False] == 1
        _gpu_matches(if_model(then_passes_x=True), {"x": x, "c": np.array(c)})
    launches = _gpu_matches(fibonacci_model(), {"a0": rng.uniform(0, 1, 3).astype(np.float32),
                                                "b0": rng.uniform(0, 1, 3).astype(np.float32)})
    assert launches[False] == 1 and launches[True] > 12   # host control: one launch per iteration at least
    for trips, limit in ((10, 6.0), (0, 1.0), (7, 1e6)):
        _gpu_matches(accumulate_model(), {"x": rng.uniform(0.5, 1.5, 4).astype(np.float32),
                                          "acc0": np.full(4, 0.01, np.float32), "M": np.array(trips),
                                          "limit": np.array(limit, np.float32)})


@pytest.mark.gpu
def test_control_flow_zoo_model_on_gpu_is_one_launch():
    import onnx
    m = onnx.load(os.path.join(ROOT, "models", "tiny", "control_flow.onnx"))
    for tok in (3, 7, 11):
        h0 = np.random.default_rng(tok).standard_normal(16).astype(np.float32)
        launches = _gpu_matches(m, {"start_token": np.array([tok], np.int64), "h0": h0})
        assert launches[False] == 1


def test_cli_strict_compile_and_inspect_list_the_conditional_nodes(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "src")}
    model_path = os.path.join(ROOT, "models", "tiny", "control_flow.onnx")

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "grapec.tools.cli", *args], capture_output=True, text=True, env=env)
    out = str(tmp_path / "cf.grape")
    r = cli("compile", model_path, "-o", out, "--strict", "--no-gpu", "-q")
    assert r.returncode == 0, r.stderr
    shown = cli("inspect", out).stdout
    assert "Loop 'Loop_3': conditional WHILE node" in shown and "If 'If_7': conditional IF node" in shown
    r = cli("compile", model_path, "-o", str(tmp_path / "host.grape"), "--strict", "--host-control", "--no-gpu", "-q")
    assert r.returncode == 2 and "--strict" in r.stderr and "Loop node 'Loop_3'" in r.stderr and "Traceback" not in r.stderr


def test_scan_runs_as_a_graphed_loop_and_matches_onnxruntime():
    """Scan (frontend/scan.py rewrites it to a Loop): a running sum and a reversed, transposed scan
    output, a scan input read along axis 1 in reverse."""
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x_t"], ["s_out"]), helper.make_node("Mul", ["s_out", "x_t"], ["y_t"])],
        "body", [tinfo("s_in", shape=[3]), tinfo("x_t", shape=[3])],
        [tinfo("s_out", shape=[3]), tinfo("y_t", shape=[3])])
    scan = helper.make_node("Scan", ["s0", "xs"], ["s_final", "ys"], body=body, num_scan_inputs=1,
                            scan_input_axes=[1], scan_input_directions=[1],
                            scan_output_axes=[1], scan_output_directions=[1])
    m = model([scan], [tinfo("s0", shape=[3]), tinfo("xs", shape=[3, 5])],
              [tinfo("s_final", shape=[3]), tinfo("ys", shape=[3, 5])])
    rng = np.random.default_rng(7)
    feeds = {"s0": rng.standard_normal(3).astype(np.float32), "xs": rng.standard_normal((3, 5)).astype(np.float32)}
    out, b = compile_and_run(m, feeds, strict=True)
    ref = ort_run(m, feeds)
    for name in ("s_final", "ys"):
        np.testing.assert_allclose(out[name], ref[name], rtol=1e-6, atol=1e-6)
    loops = [st for st in walk_steps(b.plans[0].steps) if isinstance(st, LoopStep)]
    assert len(loops) == 1 and loops[0].graphed
