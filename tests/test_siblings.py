"""passes/siblings.py: matmuls of one input against constant weights (BERT's Q, K and V) become one
GEMM with concatenated weights and biases, split after; the answers are unchanged."""
import numpy as np
import pytest
from onnx import helper

import grapec
from helpers import compile_and_run, init, model, ort_run, rel_err, tinfo


def projections(with_graph_output: bool = False, seed: int = 0):
    rng = np.random.default_rng(seed)
    w = lambda *s: (rng.standard_normal(s) / 8).astype(np.float32)  # noqa: E731
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q0"]), helper.make_node("Add", ["q0", "bq"], ["q"]),
             helper.make_node("MatMul", ["x", "wk"], ["k"]),                     # no bias: zeros in the merged one
             helper.make_node("MatMul", ["x", "wv"], ["v0"]), helper.make_node("Add", ["bv", "v0"], ["v"]),
             helper.make_node("MatMul", ["q", "wo"], ["o"]),                     # another input: not a sibling
             helper.make_node("Mul", ["o", "k"], ["ok"]), helper.make_node("Add", ["ok", "v"], ["y"])]
    outs = [tinfo("y", shape=[1, 8, 32])] + ([tinfo("k", shape=[1, 8, 32])] if with_graph_output else [])
    m = model(nodes, [tinfo("x", shape=[1, 8, 64])], outs,
              [init("wq", w(64, 32)), init("bq", w(32)), init("wk", w(64, 32)), init("wv", w(64, 32)),
               init("bv", w(32)), init("wo", w(32, 32))])
    return m, {"x": rng.standard_normal((1, 8, 64)).astype(np.float32)}


@pytest.mark.parametrize("with_graph_output", [False, True])
def test_three_projections_of_one_input_are_one_gemm(with_graph_output):
    m, feeds = projections(with_graph_output)
    got, b = compile_and_run(m, feeds)
    gemms = [st for st in b.plans[0].steps if st.op == "library"]
    assert len(gemms) == 2, [st.origin for st in gemms]
    merged = next(st for st in gemms if b.plans[0].buffers[st.out].shape[-1] == 96)
    assert len(merged.args) > 3 and merged.args[3] >= 0, "the merged bias folds into the GEMM epilogue"
    ref = ort_run(m, feeds)
    for name in ref:
        assert rel_err(got[name], ref[name]) < 1e-5 and np.allclose(got[name], ref[name], rtol=1e-4, atol=1e-5)


def test_one_op_per_kernel_keeps_each_projection():
    """--no-fusion is the one-op-per-kernel baseline the planner is measured against: no merging."""
    m, feeds = projections()
    got, b = compile_and_run(m, feeds, fusion="none")
    assert sum(st.op == "library" for st in b.plans[0].steps) == 4
    assert rel_err(got["y"], ort_run(m, feeds)["y"]) < 1e-5


def test_merged_weights_replace_the_originals_in_the_bundle():
    m, feeds = projections()
    merged = grapec.compile(m, shapes={"x": feeds["x"].shape}, targets=[])
    plain = grapec.compile(m, shapes={"x": feeds["x"].shape}, targets=[], fusion="none")
    assert len(merged.weights) <= len(plain.weights) + 64 * 4, (len(merged.weights), len(plain.weights))


@pytest.mark.gpu
def test_merged_projections_on_the_gpu_match_onnxruntime(tmp_path):
    import onnx
    from grapec.tools.check import check_model
    m, feeds = projections(with_graph_output=True)
    onnx.save(m, tmp_path / "m.onnx")
    results, _ = check_model(str(tmp_path / "m.onnx"), shapes={"x": feeds["x"].shape}, backend="cuda", rtol=1e-4, seed=6)
    assert all(r.ok for r in results), [(r.name, r.rel) for r in results]
