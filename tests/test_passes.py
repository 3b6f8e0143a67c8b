"""Each pass alone: specialize, simplify (folding, BatchNorm into Conv, dead code), lower."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from grapec.errors import ShapeError
from grapec.frontend.onnx_import import import_model, load_model
from grapec.frontend.shapes import parse_dims, parse_shapes, resolve_input_shapes
from grapec.passes.lower import lower_graph
from grapec.passes.simplify import simplify
from grapec.passes.specialize import specialize
from grapec.plan import regions
from helpers import compile_and_run, init, model, ort_run, rel_err, tinfo


def shape_chain_model():
    """y = Reshape(x, Concat(Shape(x)[0], -1)) * ConstantOfShape(Shape(x)) : classic exporter noise."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["s0"], axis=0),
        helper.make_node("Unsqueeze", ["s0", "axes0"], ["s0u"]),
        helper.make_node("Concat", ["s0u", "minus1"], ["newshape"], axis=0),
        helper.make_node("Reshape", ["x", "newshape"], ["r"]),
        helper.make_node("Shape", ["r"], ["rs"]),
        helper.make_node("ConstantOfShape", ["rs"], ["twos"], value=helper.make_tensor("v", TensorProto.FLOAT, [1], [2.0])),
        helper.make_node("Mul", ["r", "twos"], ["y"]),
        helper.make_node("Exp", ["x"], ["unused"]),
    ]
    inits = [init("zero", np.array(0, np.int64)), init("axes0", np.array([0], np.int64)),
             init("minus1", np.array([-1], np.int64))]
    return model(nodes, [tinfo("x", shape=["b", 3, 4])], [tinfo("y")], inits)


def test_specialize_folds_shape_chains_and_simplify_removes_them():
    g = import_model(shape_chain_model())
    spec = specialize(g, {"x": (2, 3, 4)})
    assert spec.values["newshape"].const.tolist() == [2, -1]
    assert spec.values["r"].shape == (2, 12)
    assert spec.values["twos"].const is not None and spec.values["twos"].const.shape == (2, 12)
    simp = simplify(spec)
    assert [n.op for n in simp.nodes] == ["Reshape", "Mul"]   # Shape chain folded, Exp dead
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    out, _ = compile_and_run(shape_chain_model(), {"x": x})
    np.testing.assert_allclose(out["y"], 2 * x.reshape(2, 12), rtol=1e-6)


def test_batchnorm_folds_into_conv():
    rng = np.random.default_rng(1)
    c, m = 3, 4
    inits = [init("w", rng.standard_normal((m, c, 3, 3)).astype(np.float32)),
             init("b", rng.standard_normal(m).astype(np.float32)),
             init("scale", rng.uniform(0.5, 2, m).astype(np.float32)), init("bias", rng.standard_normal(m).astype(np.float32)),
             init("mean", rng.standard_normal(m).astype(np.float32)), init("var", rng.uniform(0.5, 2, m).astype(np.float32))]
    mdl = model([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
                 helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["y"], epsilon=1e-3)],
                [tinfo("x", shape=[1, c, 8, 8])], [tinfo("y")], inits)
    simp = simplify(specialize(import_model(mdl), {"x": (1, c, 8, 8)}))
    assert [n.op for n in simp.nodes] == ["Conv"]
    x = rng.standard_normal((1, c, 8, 8)).astype(np.float32)
    out, _ = compile_and_run(mdl, {"x": x})
    assert rel_err(out["y"], ort_run(mdl, {"x": x})["y"]) < 1e-5


def test_lower_makes_views_for_reshapes_and_one_kernel_per_op():
    mdl = model([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Reshape", ["a", "s"], ["b"]),
                 helper.make_node("Transpose", ["b"], ["y"], perm=[1, 0])],
                [tinfo("x", shape=[4, 6])], [tinfo("y")], [init("s", np.array([6, 4], np.int64))])
    low = lower_graph(simplify(specialize(import_model(mdl), {"x": (4, 6)})))
    assert [n.op for n in low.nodes] == ["Kernel", "View", "Kernel"]


def test_specialize_inlines_if_with_known_condition():
    then_g = helper.make_graph([helper.make_node("Neg", ["x"], ["t"])], "then", [], [tinfo("t")])
    else_g = helper.make_graph([helper.make_node("Exp", ["x"], ["e"])], "else", [], [tinfo("e")])
    mdl = model([helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)],
                [tinfo("x", shape=[3])], [tinfo("y")], [init("c", np.array(True))])
    spec = simplify(specialize(import_model(mdl), {"x": (3,)}))
    assert [n.op for n in spec.nodes] == ["Neg", "Identity"]
    x = np.array([1.0, -2.0, 3.0], np.float32)
    out, _ = compile_and_run(mdl, {"x": x})
    np.testing.assert_array_equal(out["y"], -x)


def test_if_on_a_shape_may_have_branches_of_different_shapes():
    """Exporters branch on ranks (torch's and onnx's function expansions do): the condition follows
    from shapes, so only the taken branch is compiled, and the other may disagree on shapes, even
    nested, even with a shape that then feeds a Reshape."""
    inner_then = helper.make_graph([helper.make_node("Constant", [], ["s1"], value_ints=[-1])], "it", [], [tinfo("s1", TensorProto.INT64)])
    inner_else = helper.make_graph([helper.make_node("Constant", [], ["s2"], value_ints=[2, -1])], "ie", [], [tinfo("s2", TensorProto.INT64)])
    then_g = helper.make_graph([helper.make_node("If", ["c2"], ["s"], then_branch=inner_then, else_branch=inner_else)],
                               "then", [], [tinfo("s", TensorProto.INT64)])
    else_g = helper.make_graph([helper.make_node("Constant", [], ["r"], value_ints=[1, 1, -1])], "else", [], [tinfo("r", TensorProto.INT64)])
    nodes = [helper.make_node("Shape", ["x"], ["shp"]), helper.make_node("Size", ["shp"], ["rank"]),
             helper.make_node("Equal", ["rank", "two"], ["c"]), helper.make_node("Equal", ["rank", "one"], ["c2"]),
             helper.make_node("If", ["c"], ["target"], then_branch=then_g, else_branch=else_g),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    mdl = model(nodes, [tinfo("x", shape=["a", "b"])], [tinfo("y")],
                [init("two", np.array(2, np.int64)), init("one", np.array(1, np.int64))])
    x = np.random.default_rng(3).standard_normal((2, 6)).astype(np.float32)
    out, _ = compile_and_run(mdl, {"x": x})
    np.testing.assert_array_equal(out["y"], x.reshape(2, -1))


def test_loop_body_inputs_may_be_untyped():
    """ONNX lets a body leave its inputs' types out (the Loop's inputs give them); onnx's own
    function expansions do."""
    body = helper.make_graph([helper.make_node("Identity", ["cond_in"], ["cond_out"]),
                              helper.make_node("Add", ["acc_in", "x"], ["acc_out"])], "body",
                             [tinfo("i", TensorProto.INT64, []), tinfo("cond_in", TensorProto.BOOL, []),
                              helper.make_value_info("acc_in", onnx.TypeProto())],
                             [tinfo("cond_out", TensorProto.BOOL, []), tinfo("acc_out")])
    mdl = model([helper.make_node("Loop", ["n", "", "x"], ["y"], body=body)],
                [tinfo("x", shape=[4])], [tinfo("y")], [init("n", np.array(3, np.int64))])
    x = np.random.default_rng(4).standard_normal(4).astype(np.float32)
    out, _ = compile_and_run(mdl, {"x": x})
    np.testing.assert_allclose(out["y"], 4 * x, rtol=1e-6)


def test_if_with_runtime_condition_runs_both_ways():
    then_g = helper.make_graph([helper.make_node("Neg", ["x"], ["t"])], "then", [], [tinfo("t")])
    else_g = helper.make_graph([helper.make_node("Exp", ["x"], ["e"])], "else", [], [tinfo("e")])
    mdl = model([helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)],
                [tinfo("x", shape=[3]), tinfo("c", TensorProto.BOOL, [])], [tinfo("y")])
    x = np.random.default_rng(2).standard_normal(3).astype(np.float32)
    for c in (True, False):
        out, b = compile_and_run(mdl, {"x": x, "c": np.array(c)})
        np.testing.assert_allclose(out["y"], -x if c else np.exp(x), rtol=1e-6)
    (region,) = regions(b.plans[0])
    assert region.graphed and not b.manifest["notes"]   # a conditional IF node: nothing on the host
    _, host = compile_and_run(mdl, {"x": x, "c": np.array(True)}, host_control=True)
    assert not regions(host.plans[0])[0].graphed
    assert any("If node" in n and "host" in n for n in host.manifest["notes"])   # reported, not silent


def test_loop_with_data_dependent_trip_count():
    """Sum x into acc until acc exceeds a threshold or 10 trips: a loop whose length depends on data."""
    body = helper.make_graph(
        [helper.make_node("Add", ["acc_in", "x"], ["acc_out"]),
         helper.make_node("ReduceSum", ["acc_out"], ["tot"], keepdims=0),
         helper.make_node("Less", ["tot", "limit"], ["cond_out"])],
        "body", [tinfo("i", TensorProto.INT64, []), tinfo("cond_in", TensorProto.BOOL, []), tinfo("acc_in", shape=[4])],
        [tinfo("cond_out", TensorProto.BOOL, []), tinfo("acc_out", shape=[4])])
    mdl = model([helper.make_node("Loop", ["M", "", "acc0"], ["acc"], body=body)],
                [tinfo("x", shape=[4]), tinfo("acc0", shape=[4])], [tinfo("acc")],
                [init("M", np.array(10, np.int64)), init("limit", np.array(6.0, np.float32))])
    for scale in (0.5, 0.05):
        x = np.full(4, scale, np.float32) * np.random.default_rng(3).uniform(0.5, 1.5, 4).astype(np.float32)
        acc0 = np.zeros(4, np.float32) + 0.01
        out, _ = compile_and_run(mdl, {"x": x, "acc0": acc0})
        ref = ort_run(mdl, {"x": x, "acc0": acc0})["acc"]
        np.testing.assert_allclose(out["acc"], ref, rtol=1e-6)


def test_unknown_dims_are_all_listed():
    g = import_model(model([helper.make_node("Add", ["a", "b"], ["y"])],
                           [tinfo("a", shape=["batch", "seq"]), tinfo("b", shape=["batch", 4])], [tinfo("y")]))
    with pytest.raises(ShapeError) as e:
        resolve_input_shapes(g, {}, {})
    msg = str(e.value)
    assert "input 'a' dim 0 ('batch')" in msg and "input 'a' dim 1 ('seq')" in msg and "input 'b' dim 0" in msg
    assert resolve_input_shapes(g, parse_shapes("a=2x5"), parse_dims("batch=2")) == {"a": (2, 5), "b": (2, 4)}


def test_external_data_model(tmp_path):
    rng = np.random.default_rng(4)
    w = rng.standard_normal((64, 64)).astype(np.float32)
    mdl = model([helper.make_node("MatMul", ["x", "w"], ["y"])], [tinfo("x", shape=[2, 64])], [tinfo("y")], [init("w", w)])
    p = tmp_path / "ext.onnx"
    onnx.save(mdl, str(p), save_as_external_data=True, all_tensors_to_one_file=True, location="ext.data", size_threshold=0)
    assert (tmp_path / "ext.data").exists()
    import grapec
    x = rng.standard_normal((2, 64)).astype(np.float32)
    out = grapec.load(grapec.compile(str(p))).run({"x": x})
    np.testing.assert_allclose(out["y"], x @ w, rtol=1e-5, atol=1e-5)
    (tmp_path / "ext.data").unlink()
    from grapec.errors import GrapecError
    with pytest.raises(GrapecError, match="ext"):
        load_model(str(p))


def test_transpose_of_a_matmul_operand_folds_into_the_library_call():
    rng = np.random.default_rng(5)
    w = rng.standard_normal((32, 16)).astype(np.float32)     # stored [N, K], used transposed
    # w is an input here: a small constant weight would simply be folded, transposed, at compile time
    mdl = model([helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
                 helper.make_node("MatMul", ["x", "wt"], ["y"])],
                [tinfo("x", shape=[2, 5, 16]), tinfo("w", shape=[32, 16])], [tinfo("y")])
    low = lower_graph(simplify(specialize(import_model(mdl), {"x": (2, 5, 16), "w": (32, 16)})))
    lib = [n for n in low.nodes if n.op != "View"]
    assert [n.op for n in lib] == ["Library"] and lib[0].attrs["trans_b"] == 1
    x = rng.standard_normal((2, 5, 16)).astype(np.float32)
    out, _ = compile_and_run(mdl, {"x": x, "w": w})
    np.testing.assert_allclose(out["y"], x @ w.T, rtol=1e-5, atol=1e-5)


def test_simplify_merges_nodes_that_compute_the_same_values():
    """Two layers' copies of one computation (here a mask from lengths, as onnxruntime-genai's decoders
    derive per layer, with equal constants of their own) become one node."""
    rng = np.random.default_rng(3)
    nodes = []
    for layer in (0, 1):
        nodes += [helper.make_node("Constant", [], [f"one{layer}"], value=helper.make_tensor("v", TensorProto.INT64, [], [1])),
                  helper.make_node("Add", ["lengths", f"one{layer}"], [f"count{layer}"]),
                  helper.make_node("Cast", [f"count{layer}"], [f"countf{layer}"], to=TensorProto.FLOAT),
                  helper.make_node("Mul", ["x", f"countf{layer}"], [f"y{layer}"])]
    nodes += [helper.make_node("Sub", ["y0", "y1"], ["zero"]), helper.make_node("Add", ["y0", "y1"], ["twice"])]
    mdl = model(nodes, [tinfo("x", shape=[4]), tinfo("lengths", TensorProto.INT64, [4])],
                [tinfo("zero", shape=[4]), tinfo("twice", shape=[4])])
    simp = simplify(specialize(import_model(mdl), {"x": (4,), "lengths": (4,)}))
    ops = [n.op for n in simp.nodes]
    assert ops.count("Add") == 2 and ops.count("Cast") == 1 and ops.count("Mul") == 1, ops
    feeds = {"x": rng.standard_normal(4).astype(np.float32), "lengths": rng.integers(1, 9, 4)}
    got, _ = compile_and_run(mdl, feeds)
    np.testing.assert_array_equal(got["zero"], np.zeros(4, np.float32))
    np.testing.assert_allclose(got["twice"], 2 * feeds["x"] * (feeds["lengths"] + 1), rtol=1e-6)


def _lowerings_in_lower_graph(monkeypatch, m, shapes):
    """(the ops lower_graph lowered itself, the lowered graph): specialize's forms serve the rest."""
    import grapec.passes.lower as lower
    seen, real = [], lower.lower_node

    def counting(node, *args, **kw):
        seen.append(node.op)
        return real(node, *args, **kw)
    monkeypatch.setattr(lower, "lower_node", counting)
    forms: dict = {}
    g = simplify(specialize(import_model(m), shapes, forms=forms))
    return seen, lower_graph(g, forms=forms)


def test_each_node_is_lowered_once(monkeypatch):
    """specialize lowers every node to learn its shapes; lower_graph takes those lowerings instead of making
    them again (this second lowering was a fifth of a range's per-size compile, profiled)."""
    rng = np.random.default_rng(58)
    w = rng.standard_normal((16, 8)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Softmax", ["r"], ["y"], axis=-1)]
    m = model(nodes, [tinfo("x", shape=[4, 16])], [tinfo("y")], [init("w", w)])
    seen, lowered = _lowerings_in_lower_graph(monkeypatch, m, {"x": (4, 16)})
    assert seen == []
    assert {n.op for n in lowered.nodes} >= {"Library", "Kernel"}
    x = rng.standard_normal((4, 16)).astype(np.float32)
    got, _ = compile_and_run(m, {"x": x})
    assert rel_err(got["y"], ort_run(m, {"x": x})["y"]) < 1e-5


def test_a_node_that_simplify_rewires_is_lowered_again(monkeypatch):
    """MatMul(x, Transpose(t)) reads t marked transposed after simplify, and of two identical Relus the Add
    reads one twice: a lowering made before that would read values no node makes any more."""
    nodes = [helper.make_node("Transpose", ["t"], ["tt"], perm=[1, 0]), helper.make_node("MatMul", ["x", "tt"], ["h"]),
             helper.make_node("Relu", ["h"], ["r1"]), helper.make_node("Relu", ["h"], ["r2"]),
             helper.make_node("Add", ["r1", "r2"], ["y"])]
    m = model(nodes, [tinfo("x", shape=[3, 5]), tinfo("t", shape=[6, 5])], [tinfo("y")])
    seen, lowered = _lowerings_in_lower_graph(monkeypatch, m, {"x": (3, 5), "t": (6, 5)})
    assert sorted(seen) == ["Add", "MatMul"]
    made = {o for n in lowered.nodes for o in n.outputs} | set(lowered.inputs)
    assert all(i in made or lowered.values[i].const is not None for n in lowered.nodes for i in n.inputs if i)
    rng = np.random.default_rng(59)
    feeds = {"x": rng.standard_normal((3, 5)).astype(np.float32), "t": rng.standard_normal((6, 5)).astype(np.float32)}
    got, _ = compile_and_run(m, feeds)
    assert rel_err(got["y"], ort_run(m, feeds)["y"]) < 1e-5
