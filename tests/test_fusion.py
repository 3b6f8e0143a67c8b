"""Fusion and GEMM epilogues: what becomes one kernel, what folds into cuBLASLt, and that the fused
plans still compute what onnxruntime computes (on fresh random inputs)."""
import numpy as np
import pytest
from onnx import helper

from grapec.codegen.host import HostModule
from grapec.codegen.launch import plan_launch
from grapec.compiler import compile_graph
from grapec.frontend.onnx_import import import_model
from grapec.ir.interpret import run_kernel
from helpers import compile_and_run, init, model, ort_run, rel_err, tinfo

RNG = np.random.default_rng(7)


def kinds(g):
    return [n.op for n in g.nodes if n.op in ("Kernel", "Library")]


def check(m, feeds, tol=1e-5):
    got, bundle = compile_and_run(m, feeds)
    ref = ort_run(m, feeds)
    for name in ref:
        assert rel_err(got[name], ref[name]) <= tol, name
    return bundle


def residual_layernorm():
    nodes = [helper.make_node("Add", ["x", "r"], ["s"]),
             helper.make_node("LayerNormalization", ["s", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-5)]
    return model(nodes, [tinfo("x", shape=[2, 5, 96]), tinfo("r", shape=[2, 5, 96])], [tinfo("y")],
                 [init("gamma", RNG.standard_normal(96).astype(np.float32)),
                  init("beta", RNG.standard_normal(96).astype(np.float32))])


def test_residual_add_and_layernorm_are_one_row_mode_kernel():
    m = residual_layernorm()
    g = compile_graph(import_model(m), {"x": (2, 5, 96), "r": (2, 5, 96)})
    assert kinds(g) == ["Kernel"]
    launch = plan_launch(g.nodes[0].attrs["kernel"])
    assert (launch.mode, launch.rows, launch.cols) == ("row", 10, 96)
    unfused = compile_graph(import_model(m), {"x": (2, 5, 96), "r": (2, 5, 96)}, fusion=False)
    assert len(kinds(unfused)) >= 3
    feeds = {"x": RNG.standard_normal((2, 5, 96)).astype(np.float32),
             "r": RNG.standard_normal((2, 5, 96)).astype(np.float32)}
    check(m, feeds)


def test_scaled_masked_softmax_is_one_kernel_and_host_code_agrees(tmp_path):
    nodes = [helper.make_node("Mul", ["x", "scale"], ["xs"]), helper.make_node("Add", ["xs", "mask"], ["xm"]),
             helper.make_node("Softmax", ["xm"], ["y"], axis=-1)]
    mask = np.triu(np.full((40, 40), -1e9, np.float32), 1)
    m = model(nodes, [tinfo("x", shape=[3, 40, 40])], [tinfo("y")],
              [init("scale", np.array(0.125, np.float32)), init("mask", mask)])
    g = compile_graph(import_model(m), {"x": (3, 40, 40)})
    assert kinds(g) == ["Kernel"]
    k = g.nodes[0].attrs["kernel"]
    assert plan_launch(k).mode == "row"
    x = RNG.standard_normal((3, 40, 40)).astype(np.float32) * 4
    check(m, {"x": x})
    # the generated CUDA C, built for the host (one thread per block), agrees with the interpreter
    consts = {n: g.lookup(n).const for n in g.nodes[0].inputs}
    ins = [x if n == "x" else consts[n] for n in g.nodes[0].inputs]
    host = HostModule([k], str(tmp_path))
    out = np.empty(k.shape, np.float32)
    host.call(0, out, [np.ascontiguousarray(a, np.float32) for a in ins])
    np.testing.assert_allclose(out, run_kernel(k, ins), rtol=1e-5, atol=1e-7)


def gemm_act(act_nodes, act_in="h", act_out="y"):
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["h"])] + act_nodes
    return model(nodes, [tinfo("x", shape=[4, 32])], [tinfo(act_out)],
                 [init("w", RNG.standard_normal((32, 48)).astype(np.float32) * 0.3),
                  init("b", RNG.standard_normal(48).astype(np.float32)),
                  init("half", np.array(0.5, np.float32)), init("one", np.array(1.0, np.float32)),
                  init("c0", np.array(np.sqrt(2 / np.pi), np.float32)), init("c1", np.array(0.044715, np.float32)),
                  init("three", np.array(3.0, np.float32)), init("rsqrt2", np.array(1 / np.sqrt(2), np.float32))])


TANH_GELU = [helper.make_node("Pow", ["h", "three"], ["h3"]), helper.make_node("Mul", ["h3", "c1"], ["t1"]),
             helper.make_node("Add", ["h", "t1"], ["t2"]), helper.make_node("Mul", ["t2", "c0"], ["t3"]),
             helper.make_node("Tanh", ["t3"], ["t4"]), helper.make_node("Add", ["t4", "one"], ["t5"]),
             helper.make_node("Mul", ["h", "half"], ["t6"]), helper.make_node("Mul", ["t6", "t5"], ["y"])]
ERF_GELU = [helper.make_node("Mul", ["h", "rsqrt2"], ["e1"]), helper.make_node("Erf", ["e1"], ["e2"]),
            helper.make_node("Add", ["e2", "one"], ["e3"]), helper.make_node("Mul", ["h", "e3"], ["e4"]),
            helper.make_node("Mul", ["e4", "half"], ["y"])]


@pytest.mark.parametrize("act_nodes,act", [(TANH_GELU, "gelu_tanh"), ([helper.make_node("Relu", ["h"], ["y"])], "relu")])
def test_bias_and_activation_fold_into_the_gemm(act_nodes, act):
    m = gemm_act(act_nodes)
    g = compile_graph(import_model(m), {"x": (4, 32)})
    assert kinds(g) == ["Library"]
    mm = next(n for n in g.nodes if n.op == "Library")
    assert mm.attrs["act"] == act and mm.inputs[3] == "b" and not mm.inputs[2]
    check(m, {"x": RNG.standard_normal((4, 32)).astype(np.float32)})


def test_erf_gelu_is_not_taken_for_the_tanh_epilogue():
    m = gemm_act(ERF_GELU)
    g = compile_graph(import_model(m), {"x": (4, 32)})
    assert kinds(g) == ["Library", "Kernel"]
    assert "act" not in next(n for n in g.nodes if n.op == "Library").attrs
    check(m, {"x": RNG.standard_normal((4, 32)).astype(np.float32)})


def test_residual_add_after_matmul_becomes_its_c_operand():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "res"], ["y"])]
    m = model(nodes, [tinfo("x", shape=[1, 6, 32]), tinfo("res", shape=[1, 6, 48])], [tinfo("y")],
              [init("w", RNG.standard_normal((32, 48)).astype(np.float32))])
    g = compile_graph(import_model(m), {"x": (1, 6, 32), "res": (1, 6, 48)})
    assert kinds(g) == ["Library"]
    mm = next(n for n in g.nodes if n.op == "Library")
    assert mm.inputs[2] and mm.attrs["beta"] == 1.0
    check(m, {"x": RNG.standard_normal((1, 6, 32)).astype(np.float32),
              "res": RNG.standard_normal((1, 6, 48)).astype(np.float32)})


def test_a_bias_add_then_a_residual_add_both_fold_into_the_matmul():
    """MatMul, Add(bias), Add(residual) as three nodes (GPT-2's block written out in ONNX): the bias
    folds first, and the residual Add then reads the matmul through the bias Add's View, so it folds
    too. It did not (the producers were looked up as they were before the first fold), and the residual
    stream was left to fusion, which recomputed it inside every later LayerNorm."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"]),
             helper.make_node("Add", ["res", "hb"], ["y"])]
    m = model(nodes, [tinfo("x", shape=[6, 32]), tinfo("res", shape=[6, 48])], [tinfo("y")],
              [init("w", RNG.standard_normal((32, 48)).astype(np.float32)),
               init("b", RNG.standard_normal(48).astype(np.float32))])
    g = compile_graph(import_model(m), {"x": (6, 32), "res": (6, 48)}, fusion="rules")
    assert kinds(g) == ["Library"]
    mm = next(n for n in g.nodes if n.op == "Library")
    assert mm.inputs[2] and mm.inputs[3] and mm.attrs["beta"] == 1.0
    check(m, {"x": RNG.standard_normal((6, 32)).astype(np.float32),
              "res": RNG.standard_normal((6, 48)).astype(np.float32)})


def test_a_sum_inlined_into_a_mask_over_its_own_variable_keeps_its_own_variable():
    """guard_loads pushes a condition onto every load of an expression. When the condition holds a
    sum over a row and the expression is that sum (a Concat part read at an index computed from it,
    as onnxruntime-genai's decoders compute rotary positions from the attention mask), the inner sum
    must not share the outer one's variable: it did, and the interpreter and CUDA read the inner one
    at the outer's position (the generation loop's keys were rotated one position off)."""
    from grapec.ir import kernel as K
    from grapec.ir.kernel import Kernel
    from grapec.ir.tensor import guard_loads
    n, rows = 5, 4
    r, i = K.ridx(n), K.idx(0)
    count = K.reduce("sum", K.cast(K.binary("le", K.load(0, (r,), "int64"), K.load(1, (i,), "int64")), "int64"), (r,))
    expr = guard_loads(count, K.binary("lt", count, K.const(4, "int64")))     # loads read only where count < 4
    kernel = Kernel((rows,), "int64", expr, (((n,), "int64"), ((rows,), "int64")))
    keys, at = np.arange(n), RNG.permutation(np.array([1, 2, 3, 0]))
    counts = (keys[None, :] <= at[:, None]).sum(1)
    # where a row's count is 4 or more, nothing is read: each load gives 0, and 0 <= 0 holds n times
    want = np.where(counts < 4, counts, n)
    assert (want == n).any() and (want < n).any()
    np.testing.assert_array_equal(run_kernel(kernel, [keys, at]), want)
    inner = [e for e in K.walk(expr) if e.op == "reduce" and e is not expr]
    assert inner and all(not set(e.args[2]) & set(expr.args[2]) for e in inner)


def test_inlining_a_concat_read_at_both_of_its_parts():
    """A GatherND's index pairs made by a Concat of two constants (GPT-2's mask at batch 4 x seq 2 in a
    range): each read of the Concat at a constant position folds its masked loads to one part, and the
    part it folds to was loaded once, from its own input (the second read took the first part's
    input twice, and the range's logits were off by 0.13)."""
    from grapec.ir.kinds import kernel_from_json
    from grapec.ir.interpret import run_kernel
    from grapec.passes.fuse import _try_inline
    concat = kernel_from_json({"shape": [4, 1, 2, 1, 2], "dtype": "int64", "inputs": [[[4, 1, 2, 1, 1], "int64"], [[4, 1, 2, 1, 1], "int64"]], "body": [["idx", 0], ["const", "int64", 0], ["idx", 2], ["idx", 4], ["const", "int64", 1], ["lt", [3, 4]], ["const", "bool", True], ["and", [5, 6]], ["sub", [3, 4]], ["ge", [3, 4]], ["load", "int64", 0, [0, 1, 2, 1, 8], 9, 1], ["load", "int64", 1, [0, 1, 2, 1, 3], 7, 10]]})  # noqa: E501
    gather = kernel_from_json({"shape": [4, 1, 2, 1], "dtype": "int64", "inputs": [[[4, 1, 2, 1, 2], "int64"], [[4, 2], "int64"]], "body": [["idx", 0], ["const", "int64", 0], ["idx", 2], ["load", "int64", 0, [0, 1, 2, 1, 1], None, None], ["lt", [3, 1]], ["const", "int64", 4], ["add", [3, 5]], ["where", [4, 6, 3]], ["const", "int64", 1], ["load", "int64", 0, [0, 1, 2, 1, 8], None, None], ["lt", [9, 1]], ["const", "int64", 2], ["add", [9, 11]], ["where", [10, 12, 9]], ["ge", [7, 1]], ["lt", [7, 5]], ["and", [14, 15]], ["const", "bool", True], ["and", [16, 17]], ["ge", [13, 1]], ["lt", [13, 11]], ["and", [19, 20]], ["and", [18, 21]], ["load", "int64", 1, [7, 13], 22, 1]]})  # noqa: E501
    second = np.array([0, 1, 0, 1, 0, 1, 0, 1]).reshape(4, 1, 2, 1, 1)
    first = np.array([0, 0, 1, 1, 2, 2, 3, 3]).reshape(4, 1, 2, 1, 1)
    table = np.arange(8).reshape(4, 2) * 10
    want = run_kernel(gather, [run_kernel(concat, [second, first]), table])
    fused, names = _try_inline(gather, ["pairs", "table"], 0, concat, ["second", "first"], 1, True)
    values = {"table": table, "second": second, "first": first}
    got = run_kernel(fused, [values[n] for n in names])
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(want.reshape(-1), table.reshape(-1))


def test_a_few_rows_far_wider_than_their_reduction_do_not_take_it_in():
    """A sum over an attention mask's 1280 positions read by a 1024 x 1280 score matrix: stitched, one block
    would do the whole matrix (18 ms a layer on an H200, passes/fuse.py MIN_STITCH_ROWS), so the sum stays a
    kernel of its own. A softmax over 6 rows of 300 (rows about as wide as the reduction) stitches:
    tests/test_attention.py two-query-rows."""
    from onnx import TensorProto, helper
    nodes = [helper.make_node("ReduceSum", ["mask", "axes"], ["count"], keepdims=1),
             helper.make_node("Less", ["pos", "count"], ["keep"]),
             helper.make_node("Where", ["keep", "scores", "low"], ["y"])]
    inits = [init("axes", np.array([1], np.int64)), init("pos", np.arange(1280, dtype=np.int64)),
             init("low", np.array(-1e4, np.float32))]
    m = model(nodes, [tinfo("mask", TensorProto.INT64, [1, 1280]), tinfo("scores", TensorProto.FLOAT, [1, 1024, 1280])],
              [tinfo("y")], inits)
    rng = np.random.default_rng(58)
    feeds = {"mask": (rng.random((1, 1280)) < 0.7).astype(np.int64),
             "scores": rng.standard_normal((1, 1024, 1280)).astype(np.float32)}
    got, b = compile_and_run(m, feeds)
    assert sum(1 for st in b.plans[0].steps if st.op == "kernel") == 2
    np.testing.assert_array_equal(got["y"], ort_run(m, feeds)["y"])


def test_an_interleaved_rotary_into_the_key_cache_is_one_kernel():
    """GPT-J's rotary as optimum exports it: a head's first 8 of 32 features rotated in pairs (x[::2], x[1::2],
    a Neg, a Concat of the two on a new axis, a Reshape), the rest passed through, the head transposed and
    concatenated after the past keys. Each Concat reads a part in its own range only (the rotated quarter, the
    new position of 13), so inlining reads every element once: one kernel (it was three, and six a layer in GPT-J's
    export, each a kernel because its reader's element count was taken for its reads: passes/fuse.py `_read_share`)."""
    def c(name, *v):
        return init(name, np.array(v, np.int64))
    nodes = [helper.make_node("Slice", ["x", "s0", "s8", "ax3"], ["rot"]),
             helper.make_node("Slice", ["x", "s8", "s32", "ax3"], ["keep"]),
             helper.make_node("Slice", ["rot", "s0", "s8", "ax3", "s2"], ["even"]),
             helper.make_node("Slice", ["rot", "s1", "s8", "ax3", "s2"], ["odd"]),
             helper.make_node("Neg", ["odd"], ["nodd"]),
             helper.make_node("Unsqueeze", ["nodd", "axm"], ["u0"]), helper.make_node("Unsqueeze", ["even", "axm"], ["u1"]),
             helper.make_node("Concat", ["u0", "u1"], ["pairs"], axis=-1),
             helper.make_node("Reshape", ["pairs", "shape"], ["turned"]),
             helper.make_node("Mul", ["rot", "cos"], ["a"]), helper.make_node("Mul", ["turned", "sin"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["roped"]),
             helper.make_node("Concat", ["roped", "keep"], ["head"], axis=-1),
             helper.make_node("Transpose", ["head"], ["heads"], perm=[0, 2, 1, 3]),
             helper.make_node("Concat", ["past", "heads"], ["present"], axis=2)]
    rng = np.random.default_rng(60)
    inits = [c("s0", 0), c("s1", 1), c("s2", 2), c("s8", 8), c("s32", 32), c("ax3", 3), c("axm", -1),
             c("shape", 1, 1, 4, 8), init("cos", rng.standard_normal((1, 1, 1, 8)).astype(np.float32)),
             init("sin", rng.standard_normal((1, 1, 1, 8)).astype(np.float32))]
    m = model(nodes, [tinfo("x", shape=[1, 1, 4, 32]), tinfo("past", shape=[1, 4, 12, 32])], [tinfo("present")], inits)
    feeds = {"x": rng.standard_normal((1, 1, 4, 32)).astype(np.float32),
             "past": rng.standard_normal((1, 4, 12, 32)).astype(np.float32)}
    g = compile_graph(import_model(m), {k: v.shape for k, v in feeds.items()})
    assert kinds(g) == ["Kernel"]
    check(m, feeds)
