"""ops/reduce.py against onnxruntime on fresh random inputs: reductions, softmax family,
normalizations, scans, LRN and losses, across the opsets whose forms differ."""
import numpy as np
import pytest
from onnx import TensorProto, helper

import helpers
from helpers import compile_and_run, init, model, ort_run, rel_err, tinfo

F32, F16, I64 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT64
AXIS1 = np.array([1], np.int64)


def run_both(op, feeds, attrs=None, consts=None, **kw):
    """helpers.run_both with attrs before consts, as these tests read best."""
    return helpers.run_both(op, feeds, consts, attrs, **kw)


def assert_close(got, ref, rtol=1e-5, atol=1e-6):
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype and g.shape == r.shape, (g.dtype, g.shape, r.dtype, r.shape)
        if r.size == 0:
            continue
        if np.issubdtype(r.dtype, np.integer) or r.dtype == bool:
            np.testing.assert_array_equal(g, r)
            continue
        finite = np.isfinite(r)
        np.testing.assert_array_equal(np.isfinite(g), finite)
        np.testing.assert_array_equal(g[~finite], r[~finite])
        assert rel_err(g[finite], r[finite]) <= rtol, rel_err(g[finite], r[finite])
        max_abs = np.abs(g[finite].astype(np.float64) - r[finite]).max(initial=0)
        assert max_abs <= atol + rtol * np.abs(r[finite]).max(initial=0), max_abs


def rand(*shape, dtype=np.float32, seed=0, lo=-2.0, hi=2.0):
    return np.random.default_rng(seed).uniform(lo, hi, shape).astype(dtype)


REDUCES = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
           "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]


def positive(op):
    return op == "ReduceLogSum"


@pytest.mark.parametrize("op", REDUCES)
@pytest.mark.parametrize("axes,keepdims", [([1], 1), ([0, -1], 0), (None, 1), (None, 0), ([-2], 0)])
def test_reduce_axes_input(op, axes, keepdims):
    x = rand(3, 4, 5, seed=1, lo=0.1 if positive(op) else -2.0)
    consts = {"axes_1": np.array(axes, np.int64) if axes is not None else None}
    got, ref = run_both(op, {"x_0": x}, {"keepdims": keepdims}, consts, opset=18)
    assert_close(got, ref)


@pytest.mark.parametrize("op", REDUCES)
def test_reduce_axes_attribute_opset11(op):
    x = rand(2, 3, 4, seed=2, lo=0.1 if positive(op) else -2.0)
    got, ref = run_both(op, {"x_0": x}, {"axes": [0, 2], "keepdims": 0}, opset=11)
    assert_close(got, ref)
    got, ref = run_both(op, {"x_0": x}, {"keepdims": 1}, opset=11)
    assert_close(got, ref)


def test_reduce_sum_opset13_axes_input_and_noop():
    x = rand(3, 4, seed=3)
    got, ref = run_both("ReduceSum", {"x_0": x}, {"keepdims": 0}, {"axes_1": AXIS1}, opset=13)
    assert_close(got, ref)
    got, ref = run_both("ReduceSum", {"x_0": x}, {"noop_with_empty_axes": 1},
                        {"axes_1": np.array([], np.int64)}, opset=13)
    assert_close(got, ref)
    np.testing.assert_array_equal(got[0], x)


@pytest.mark.parametrize("op", REDUCES)
def test_reduce_noop_with_empty_axes(op):
    """Empty axes with noop_with_empty_axes reduce each element alone (ReduceL1 gives |x|...)."""
    x = rand(2, 3, seed=43, lo=0.1 if positive(op) else -2.0)
    got, ref = run_both(op, {"x_0": x}, {"noop_with_empty_axes": 1}, {"axes_1": np.array([], np.int64)})
    assert_close(got, ref)


@pytest.mark.parametrize("op,identity", [("ReduceSum", 0), ("ReduceProd", 1), ("ReduceMax", -np.inf),
                                         ("ReduceMin", np.inf), ("ReduceL1", 0), ("ReduceL2", 0),
                                         ("ReduceLogSum", -np.inf), ("ReduceLogSumExp", -np.inf),
                                         ("ReduceSumSquare", 0)])
def test_reduce_empty_set_gives_identity(op, identity):
    """Reducing over a zero-length axis gives the reduction's identity."""
    x = np.zeros((2, 0, 4), np.float32)
    node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=1)
    m = model([node], [tinfo("x", F32, [2, 0, 4])], [tinfo("y", F32)], [init("axes", AXIS1)], opset=18)
    got, _ = compile_and_run(m, {"x": x})
    np.testing.assert_array_equal(got["y"], np.full((2, 1, 4), identity, np.float32))


def test_reduce_int_and_bool():
    x = np.random.default_rng(4).integers(-50, 50, (4, 6)).astype(np.int64)
    for op in ("ReduceSum", "ReduceMax", "ReduceMin", "ReduceMean", "ReduceProd"):
        got, ref = run_both(op, {"x_0": x}, {"keepdims": 0}, {"axes_1": AXIS1}, opset=18)
        assert_close(got, ref)
    b = np.random.default_rng(5).random((3, 5)) > 0.5
    got, ref = run_both("ReduceMax", {"x_0": b}, {"keepdims": 0}, {"axes_1": AXIS1}, opset=20)
    assert_close(got, ref)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceL2", "ReduceLogSumExp", "ReduceSumSquare"])
def test_reduce_float16_accumulates_in_float32(op):
    x = rand(4, 4096, seed=6, dtype=np.float16, lo=0.0, hi=1.0)
    got, _ = run_both(op, {"x_0": x}, {"keepdims": 0}, {"axes_1": AXIS1}, opset=18)
    x64 = x.astype(np.float64)
    ref = {"ReduceSum": x64.sum(1), "ReduceMean": x64.mean(1), "ReduceL2": np.sqrt((x64 ** 2).sum(1)),
           "ReduceLogSumExp": np.log(np.exp(x64).sum(1)), "ReduceSumSquare": (x64 ** 2).sum(1)}[op]
    assert got[0].dtype == np.float16
    assert rel_err(got[0], ref) < 1e-3  # one fp16 rounding of the result, not 4096 of the sum


def test_reduce_log_sum_exp_large_values():
    x = rand(3, 7, seed=7) * 1000
    x[1] = -np.inf
    got, ref = run_both("ReduceLogSumExp", {"x_0": x}, {"keepdims": 0}, {"axes_1": AXIS1})
    assert np.isfinite(got[0][[0, 2]]).all() and got[0][1] == -np.inf
    assert_close(got, ref)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis,keepdims,last", [(0, 1, 0), (1, 0, 0), (-1, 1, 1), (1, 0, 1)])
def test_arg_max_min(op, axis, keepdims, last):
    x = np.random.default_rng(8).integers(0, 4, (3, 6, 5)).astype(np.float32)  # many ties
    got, ref = run_both(op, {"x_0": x}, {"axis": axis, "keepdims": keepdims, "select_last_index": last},
                        out_types=[I64], opset=13)
    assert_close(got, ref)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("shape,axis,keepdims,last", [((1, 50257), 1, 0, 0), ((3, 40000), -1, 1, 1),
                                                      ((20000, 2), 0, 0, 1), ((2, 70001, 1), 1, 1, 0)])
def test_arg_max_min_over_a_long_row_is_two_kernels_and_the_same_index(op, shape, axis, keepdims, last):
    """A vocabulary-long row is reduced in chunks, then over the chunks' picks (ops/reduce.py
    _chunked_arg): the same first (last) index on many ties, the last chunk padded."""
    x = np.random.default_rng(9).integers(-40, 40, shape).astype(np.float32)   # each value ~1000 times
    attrs = {"axis": axis, "keepdims": keepdims, "select_last_index": last}
    m = model([helper.make_node(op, ["x"], ["y"], **attrs)], [tinfo("x", shape=list(shape))],
              [tinfo("y", TensorProto.INT64)], opset=13)
    got, b = compile_and_run(m, {"x": x})
    assert [st.op for st in b.plans[0].steps] == ["kernel", "kernel"]
    np.testing.assert_array_equal(got["y"], ort_run(m, {"x": x})["y"])


def test_arg_max_over_a_long_row_of_minus_infinity_picks_within_the_row():
    """The padding of the last chunk ties with a row of -inf: select_last_index must still name the
    row's last element, not a padded one."""
    x = np.full((1, 20000), -np.inf, np.float32)
    m = model([helper.make_node("ArgMax", ["x"], ["y"], axis=1, keepdims=0, select_last_index=1)],
              [tinfo("x", shape=[1, 20000])], [tinfo("y", TensorProto.INT64)], opset=13)
    got, _ = compile_and_run(m, {"x": x})
    np.testing.assert_array_equal(got["y"], [19999])


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("opset,axis", [(11, 1), (11, 0), (11, -1), (11, None), (13, 1), (13, 0), (13, None)])
def test_softmax_family(op, opset, axis):
    x = rand(2, 3, 5, seed=9) * 30
    if op == "Hardmax":
        x = np.round(x / 10)  # ties: the first maximum wins
    got, ref = run_both(op, {"x_0": x}, {} if axis is None else {"axis": axis}, opset=opset)
    assert_close(got, ref)


def test_softmax_float16_and_wide_rows():
    x = rand(16, 2048, seed=10, dtype=np.float16) * 8
    got, ref = run_both("Softmax", {"x_0": x}, {"axis": -1}, opset=13)
    ref64 = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
    ref64 /= ref64.sum(1, keepdims=True)
    assert got[0].dtype == np.float16 and rel_err(got[0], ref64) < 1e-3
    got, ref = run_both("LogSoftmax", {"x_0": x.astype(np.float32)}, {"axis": 0}, opset=13)
    assert_close(got, ref)


@pytest.mark.parametrize("axis", [-1, 1, 0])
def test_layer_normalization(axis):
    x, s, b = rand(2, 3, 8, seed=11), rand(*(2, 3, 8)[axis:], seed=12), rand(*(2, 3, 8)[axis:], seed=13)
    got, ref = run_both("LayerNormalization", {"x_0": x, "s_1": s, "b_2": b}, {"axis": axis, "epsilon": 1e-3},
                        outs=3, opset=17)
    assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_layer_normalization_float16_no_bias():
    x, s = rand(4, 256, seed=14, dtype=np.float16), rand(256, seed=15, dtype=np.float16)
    got, ref = run_both("LayerNormalization", {"x_0": x, "s_1": s}, {}, outs=3, out_types=[F16, F32, F32],
                        opset=17)
    assert_close(got, ref, rtol=2e-3, atol=2e-3)


def test_rms_normalization():
    x, s = rand(3, 4, 16, seed=16), rand(4, 16, seed=17)
    got, ref = run_both("RMSNormalization", {"x_0": x, "s_1": s}, {"axis": -2}, opset=23)
    assert_close(got, ref, atol=1e-5)


@pytest.mark.parametrize("opset,groups", [(21, 2), (21, 4), (18, 2)])
def test_group_normalization(opset, groups):
    x = rand(2, 4, 3, 5, seed=18)
    n_param = 4 if opset >= 21 else groups
    s, b = rand(n_param, seed=19), rand(n_param, seed=20)
    got, ref = run_both("GroupNormalization", {"x_0": x, "s_1": s, "b_2": b}, {"num_groups": groups},
                        opset=opset)
    assert_close(got, ref, atol=1e-5)


def test_instance_normalization():
    x, s, b = rand(2, 3, 4, 5, seed=21), rand(3, seed=22), rand(3, seed=23)
    got, ref = run_both("InstanceNormalization", {"x_0": x, "s_1": s, "b_2": b}, {"epsilon": 1e-3}, opset=11)
    assert_close(got, ref, atol=1e-5)


@pytest.mark.parametrize("opset", [9, 15])
def test_batch_normalization_inference(opset):
    x = rand(2, 3, 4, 5, seed=24)
    s, b, mu, var = rand(3, seed=25), rand(3, seed=26), rand(3, seed=27), rand(3, seed=28, lo=0.5, hi=2)
    got, ref = run_both("BatchNormalization", {"x_0": x, "s_1": s, "b_2": b, "m_3": mu, "v_4": var},
                        {"epsilon": 1e-3}, opset=opset)
    assert_close(got, ref, atol=1e-5)


def test_batch_normalization_training_mode():
    """Against the formula (onnxruntime's CPU provider runs inference only)."""
    x = rand(2, 3, 4, seed=29)
    s, b, mu, var = rand(3, seed=30), rand(3, seed=31), rand(3, seed=32), rand(3, seed=33, lo=0.5, hi=2)
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"],
                            training_mode=1, momentum=0.8, epsilon=1e-3)
    m = model([node], [tinfo(n, F32, a.shape) for n, a in zip("xsbmv", (x, s, b, mu, var))],
              [tinfo(n, F32) for n in ("y", "rm", "rv")], opset=15)
    got, _ = compile_and_run(m, dict(zip("xsbmv", (x, s, b, mu, var))))
    bm, bv = x.mean((0, 2)), x.var((0, 2))
    y = (x - bm[:, None]) / np.sqrt(bv[:, None] + 1e-3) * s[:, None] + b[:, None]
    assert rel_err(got["y"], y) < 1e-5
    assert rel_err(got["rm"], mu * 0.8 + bm * 0.2) < 1e-6
    assert rel_err(got["rv"], var * 0.8 + bv * 0.2) < 1e-6


@pytest.mark.parametrize("p,axis", [(1, 1), (2, -1), (2, 0)])
def test_lp_normalization(p, axis):
    x = rand(3, 4, 5, seed=34)
    x[0, :, 0] = 0  # a zero norm along axis 1 gives 0, not NaN
    got, ref = run_both("LpNormalization", {"x_0": x}, {"p": p, "axis": axis}, opset=11)
    if p == 1 and axis == 1:
        norm = np.abs(x).sum(1, keepdims=True)
        ref = [np.where(norm == 0, 0, x / np.where(norm == 0, 1, norm))]
    assert_close(got, ref)


@pytest.mark.parametrize("axes", [None, [1, 2]])
def test_mean_variance_normalization(axes):
    x = rand(2, 3, 4, 5, seed=35)
    attrs = {} if axes is None else {"axes": axes}
    got, ref = run_both("MeanVarianceNormalization", {"x_0": x}, attrs, opset=13)
    assert_close(got, ref, atol=1e-5)


@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("axis,dtype", [(1, np.float32), (-3, np.int32), (2, np.int64), (0, np.float64)])
def test_cumsum(exclusive, reverse, axis, dtype):
    x = np.random.default_rng(36).integers(-9, 9, (3, 4, 5)).astype(dtype)
    got, ref = run_both("CumSum", {"x_0": x}, {"exclusive": exclusive, "reverse": reverse},
                        {"axis_1": np.array(axis, np.int32)}, opset=14)
    assert_close(got, ref)


@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("shape,axis,dtype", [((2, 1000), 1, np.int64), ((3, 130, 2), 1, np.float32),
                                              ((65,), 0, np.int32)])
def test_cumsum_long_axis_blocked(exclusive, reverse, shape, axis, dtype):
    """Axes longer than 64 are scanned in sqrt(n) blocks; n need not be a square."""
    x = np.random.default_rng(42).integers(-9, 9, shape).astype(dtype)
    got, ref = run_both("CumSum", {"x_0": x}, {"exclusive": exclusive, "reverse": reverse},
                        {"axis_1": np.array(axis, np.int64)}, opset=14)
    assert_close(got, ref)


@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("n", [6, 150])
def test_cumprod(exclusive, reverse, n):
    """Against numpy: CumProd (opset 26) is newer than onnxruntime's CPU kernels."""
    x = rand(3, n, seed=37, lo=0.9, hi=1.1)
    node = helper.make_node("CumProd", ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)
    m = model([node], [tinfo("x", F32, x.shape)], [tinfo("y", F32)], [init("axis", np.array(1, np.int64))],
              opset=26)
    got, _ = compile_and_run(m, {"x": x})
    v = x[:, ::-1] if reverse else x
    ref = np.cumprod(v, 1)
    if exclusive:
        ref = np.concatenate([np.ones((3, 1), np.float32), ref[:, :-1]], 1)
    ref = ref[:, ::-1] if reverse else ref
    assert rel_err(got["y"], ref) < 1e-6


@pytest.mark.parametrize("size", [1, 3, 5])  # onnxruntime takes odd sizes only
def test_lrn(size):
    x = rand(2, 7, 3, 4, seed=38)
    got, ref = run_both("LRN", {"x_0": x}, {"size": size, "alpha": 0.3, "beta": 0.75, "bias": 1.5}, opset=13)
    assert_close(got, ref)


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted,ignore", [(False, None), (True, None), (True, 2), (False, 1)])
def test_losses(reduction, weighted, ignore):
    rng = np.random.default_rng(39)
    x = rand(3, 5, 4, 2, seed=40)
    t = rng.integers(0, 5, (3, 4, 2)).astype(np.int64)
    w = rand(5, seed=41, lo=0.1, hi=1.0) if weighted else None
    attrs = {"reduction": reduction}
    if ignore is not None:
        attrs["ignore_index"] = ignore
    got, ref = run_both("NegativeLogLikelihoodLoss", {"x_0": x, "t_1": t}, attrs, {"w_2": w}, opset=13)
    assert_close(got, ref)
    got, ref = run_both("SoftmaxCrossEntropyLoss", {"x_0": x, "t_1": t}, attrs, {"w_2": w}, outs=2, opset=13)
    assert_close(got, ref, atol=1e-5)
