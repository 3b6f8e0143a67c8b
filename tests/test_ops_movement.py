"""ops/movement.py and ops/shape.py: against onnxruntime on fresh random inputs, and against the
expected outputs of ONNX's own node tests with their parameter inputs (starts, pads, scales...)
turned into initializers, which is how real models carry them."""
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from helpers import compile_and_run, init, model, ort_run, rel_err, run_both, tinfo

F32, I64 = TensorProto.FLOAT, TensorProto.INT64


def assert_close(got, ref, rtol=1e-5):
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype and g.shape == r.shape, (g.dtype, g.shape, r.dtype, r.shape)
        if r.size == 0:
            continue
        if not np.issubdtype(r.dtype, np.floating):
            np.testing.assert_array_equal(g, r)
            continue
        assert rel_err(g, r) <= rtol, rel_err(g, r)
        assert np.abs(g.astype(np.float64) - r).max() <= rtol * (1 + np.abs(r).max())


def rand(*shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).uniform(-2, 2, shape).astype(dtype)


def ints(*shape, lo, hi, seed=1):
    return np.random.default_rng(seed).integers(lo, hi, shape).astype(np.int64)


def i64(*v):
    return np.array(v, np.int64)


# --- reshapes and slicing --------------------------------------------------------------------------

@pytest.mark.parametrize("starts,ends,axes,steps", [
    ([1, 0], [3, 10], [0, 1], [1, 1]),
    ([-1, -2], [-1000, 0], [0, 2], [-1, -1]),       # negative starts, steps, ends past the front
    ([0, 20], [100, -100], [2, 1], [3, -2]),         # clamped starts and ends
    ([2], [2 ** 62], [-1], [2]),                     # INT64-ish end, negative axis
])
def test_slice_inputs(starts, ends, axes, steps):
    got, ref = run_both("Slice", {"x_0": rand(4, 5, 6)},
                        {"s_1": i64(*starts), "e_2": i64(*ends), "a_3": i64(*axes), "t_4": i64(*steps)})
    assert_close(got, ref)


def test_slice_opset1_attributes():
    got, ref = run_both("Slice", {"x_0": rand(4, 5)}, attrs={"starts": [1, -3], "ends": [100, -1], "axes": [0, 1]},
                        opset=9)
    assert_close(got, ref)


@pytest.mark.parametrize("op,consts,attrs,opset", [
    ("Flatten", {}, {"axis": -1}, 18),
    ("Flatten", {}, {"axis": 0}, 18),
    ("Squeeze", {"a_1": i64(-2)}, {}, 18),
    ("Squeeze", {}, {"axes": [2]}, 11),
    ("Unsqueeze", {"a_1": i64(0, -1)}, {}, 18),
    ("Unsqueeze", {}, {"axes": [3, 1]}, 11),
    ("Reshape", {"s_1": i64(0, -1)}, {}, 18),
    ("Transpose", {}, {"perm": [2, 0, 3, 1]}, 18),
])
def test_reshapes(op, consts, attrs, opset):
    x = rand(3, 4, 1, 5)
    got, ref = run_both(op, {"x_0": x}, consts, attrs, opset=opset)
    assert_close(got, ref)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(axis):
    feeds = {"a_0": rand(2, 3, 4, seed=1)}
    shape = [2, 3, 4]
    shape[axis] = 2
    feeds["b_1"] = rand(*shape, seed=2)
    shape[axis] = 0
    feeds["c_2"] = rand(*shape, seed=3)
    shape[axis] = 3
    got, ref = run_both("Concat", feeds, {"d_3": rand(*shape, seed=4)}, {"axis": axis})
    assert_close(got, ref)


@pytest.mark.parametrize("consts,attrs,outs,opset", [
    ({"s_1": i64(1, 4, 2)}, {"axis": 1}, 3, 18),
    ({}, {"axis": 1, "num_outputs": 3}, 3, 18),     # ceil(7/3) = 3, 3, 1
    ({}, {"axis": -1}, 2, 11),
    ({}, {"axis": 1, "split": [2, 5]}, 2, 11),
])
def test_split(consts, attrs, outs, opset):
    got, ref = run_both("Split", {"x_0": rand(2, 7, 4)}, consts, attrs, outs=outs, opset=opset)
    assert_close(got, ref)


# --- gathers and scatters --------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_negative_indices(axis):
    x = rand(4, 5, 6)
    d = x.shape[axis]
    idx = ints(2, 3, lo=-d, hi=d)
    got, ref = run_both("Gather", {"x_0": x, "i_1": idx}, attrs={"axis": axis})
    assert_close(got, ref)


def test_gather_scalar_index_int32():
    got, ref = run_both("Gather", {"x_0": rand(4, 5), "i_1": np.array(-2, np.int32)}, attrs={"axis": 1})
    assert_close(got, ref)


@pytest.mark.parametrize("axis", [0, 1])
def test_gather_elements(axis):
    x = rand(4, 5)
    idx = ints(3, 4, lo=-x.shape[axis], hi=x.shape[axis])
    got, ref = run_both("GatherElements", {"x_0": x, "i_1": idx}, attrs={"axis": axis})
    assert_close(got, ref)


@pytest.mark.parametrize("b,ishape", [(0, (3, 2)), (0, (2, 2, 3)), (1, (4, 2, 1)), (1, (4, 2))])
def test_gather_nd(b, ishape):
    x = rand(4, 3, 5)
    k = ishape[-1]
    hi = np.array(x.shape[b:b + k])
    idx = (np.random.default_rng(5).integers(0, 1 << 20, ishape) % hi) - hi * (np.arange(k) % 2)
    got, ref = run_both("GatherND", {"x_0": x, "i_1": idx.astype(np.int64)}, attrs={"batch_dims": b})
    assert_close(got, ref)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("axis", [0, 1])
def test_scatter_elements(reduction, axis):
    x = rand(5, 6)
    ishape = (3, 4) if axis == 0 else (4, 3)
    if reduction == "none":  # unique targets per line, so the result is defined
        rng = np.random.default_rng(3)
        idx = np.stack([rng.permutation(x.shape[axis])[:ishape[axis]] for _ in range(ishape[1 - axis])])
        idx = idx.T if axis == 0 else idx
        idx = idx - x.shape[axis] * (idx % 2)  # some negative
    else:
        idx = ints(*ishape, lo=-x.shape[axis], hi=x.shape[axis])
    attrs = {"axis": axis} if reduction == "none" else {"axis": axis, "reduction": reduction}
    got, ref = run_both("ScatterElements", {"x_0": x, "i_1": idx.astype(np.int64), "u_2": rand(*ishape, seed=7)},
                        attrs=attrs)
    assert_close(got, ref)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd(reduction):
    x = rand(4, 5, 3)
    if reduction == "none":
        idx = np.array([[[1, 2]], [[3, -1]], [[0, 0]]], np.int64)       # distinct targets
    else:
        idx = np.array([[[1, 2]], [[3, -1]], [[1, 2]]], np.int64)       # a repeated target
    attrs = {} if reduction == "none" else {"reduction": reduction}
    got, ref = run_both("ScatterND", {"x_0": x, "i_1": idx, "u_2": rand(3, 1, 3, seed=9)}, attrs=attrs)
    assert_close(got, ref)


def test_scatter_nd_whole_rows():
    got, ref = run_both("ScatterND", {"x_0": rand(4, 5), "i_1": np.array([[2], [0]], np.int64), "u_2": rand(2, 5, seed=2)})
    assert_close(got, ref)


# --- padding, tiling, block moves --------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads", [[1, 2, 0, 3, 2, 1], [0, -1, 2, 1, 0, -2], [0, 4, 0, 0, 5, 0]])
def test_pad(mode, pads):
    x = rand(2, 4, 5)
    if mode == "reflect" and any(p >= d for p, d in zip(pads, x.shape + x.shape)):
        # onnxruntime refuses reflect pads beyond the axis; numpy (the ONNX reference) repeats
        m = model([helper.make_node("Pad", ["x", "p"], ["y"], mode=mode)], [tinfo("x", F32, x.shape)],
                  [tinfo("y", F32)], [init("p", i64(*pads))])
        got, _ = compile_and_run(m, {"x": x})
        np.testing.assert_array_equal(got["y"], np.pad(x, list(zip(pads[:3], pads[3:])), mode=mode))
        return
    got, ref = run_both("Pad", {"x_0": x}, {"p_1": i64(*pads), "v_2": np.array(1.5, np.float32)}, {"mode": mode})
    assert_close(got, ref)


def test_pad_axes_and_runtime_value():
    got, ref = run_both("Pad", {"x_0": rand(2, 3, 4), "v_2": np.array(-3.0, np.float32)},
                        {"p_1": i64(1, 2, 3, 0), "a_3": i64(-1, 0)})
    assert_close(got, ref)


def test_pad_opset2_attributes():
    got, ref = run_both("Pad", {"x_0": rand(3, 4)}, attrs={"pads": [1, 0, 2, 3], "value": 2.0}, opset=10)
    assert_close(got, ref)


def test_center_crop_pad():
    got, ref = run_both("CenterCropPad", {"x_0": rand(5, 6, 3)}, {"s_1": i64(8, 3)}, {"axes": [0, -2]})
    assert_close(got, ref)


@pytest.mark.parametrize("shape", [(3, 1, 5), (2, 1, 4, 1), (1,)])
def test_expand(shape):
    got, ref = run_both("Expand", {"x_0": rand(4, 1)}, {"s_1": i64(*shape)})
    assert_close(got, ref)


def test_tile():
    got, ref = run_both("Tile", {"x_0": rand(2, 3, 1)}, {"r_1": i64(3, 1, 4)})
    assert_close(got, ref)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space(mode):
    got, ref = run_both("DepthToSpace", {"x_0": rand(2, 8, 3, 2)}, attrs={"blocksize": 2, "mode": mode})
    assert_close(got, ref)


def test_space_to_depth():
    got, ref = run_both("SpaceToDepth", {"x_0": rand(2, 3, 4, 6)}, attrs={"blocksize": 2})
    assert_close(got, ref)


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, -1, 2])
def test_trilu(upper, k):
    consts = {"k_1": np.array(k, np.int64)} if k is not None else {}
    got, ref = run_both("Trilu", {"x_0": rand(2, 4, 5)}, consts, {"upper": upper})
    assert_close(got, ref)


def test_trilu_runtime_k():
    got, ref = run_both("Trilu", {"x_0": rand(3, 4), "k_1": np.array(-1, np.int64)}, attrs={"upper": 0})
    assert_close(got, ref)


def test_reverse_sequence():
    got, ref = run_both("ReverseSequence", {"x_0": rand(5, 3, 2), "l_1": i64(5, 1, 3)},
                        attrs={"batch_axis": 1, "time_axis": 0})
    assert_close(got, ref)


def test_compress_constant_condition():
    cond = np.array([True, False, True, True, False])
    got, ref = run_both("Compress", {"x_0": rand(3, 5)}, {"c_1": cond}, {"axis": 1})
    assert_close(got, ref)
    got, ref = run_both("Compress", {"x_0": rand(3, 5)}, {"c_1": np.array([0, 1, 0, 0, 1, 1], bool)})
    assert_close(got, ref)


# --- Resize --------------------------------------------------------------------------------------------

RESIZE_CASES = [
    ("nearest", "half_pixel", "round_prefer_floor", [1, 1, 2.0, 3.0]),
    ("nearest", "asymmetric", "floor", [1, 1, 0.5, 1.7]),
    ("nearest", "align_corners", "round_prefer_ceil", [1, 1, 1.5, 0.6]),
    ("nearest", "pytorch_half_pixel", "ceil", [1, 1, 2.5, 1.0]),
    ("linear", "half_pixel", None, [1, 1, 2.0, 0.5]),
    ("linear", "align_corners", None, [1, 1, 1.7, 2.3]),
    ("linear", "pytorch_half_pixel", None, [1, 1, 0.6, 3.0]),
    ("linear", "asymmetric", None, [1, 1, 2.0, 2.0]),
    ("cubic", "half_pixel", None, [1, 1, 1.5, 0.8]),
    ("cubic", "align_corners", None, [1, 1, 2.0, 2.0]),
]


@pytest.mark.parametrize("mode,ctm,nearest_mode,scales", RESIZE_CASES)
def test_resize_scales(mode, ctm, nearest_mode, scales):
    attrs = {"mode": mode, "coordinate_transformation_mode": ctm}
    if nearest_mode:
        attrs["nearest_mode"] = nearest_mode
    got, ref = run_both("Resize", {"x_0": rand(2, 3, 5, 6)},
                        {"r_1": None, "s_2": np.array(scales, np.float32)}, attrs)
    assert_close(got, ref, rtol=1e-5)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_sizes_axes(mode):
    got, ref = run_both("Resize", {"x_0": rand(2, 3, 5, 6)}, {"r_1": None, "s_2": None, "z_3": i64(9, 4)},
                        {"mode": mode, "axes": [3, 2]}, opset=19)
    assert_close(got, ref, rtol=1e-5)


def test_resize_tf_crop_and_resize():
    got, ref = run_both("Resize", {"x_0": rand(1, 2, 6, 6)},
                        {"r_1": np.array([0, 0, 0.2, -0.1, 1, 1, 0.9, 1.3], np.float32), "s_2": None,
                         "z_3": i64(1, 2, 4, 5)},
                        {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize",
                         "extrapolation_value": 7.0})
    assert_close(got, ref, rtol=1e-5)


def test_resize_uint8_linear():
    x = np.random.default_rng(4).integers(0, 256, (1, 1, 4, 5)).astype(np.uint8)
    got, ref = run_both("Resize", {"x_0": x}, {"r_1": None, "s_2": np.array([1, 1, 1.5, 2.0], np.float32)},
                        {"mode": "linear"})
    assert np.abs(got[0].astype(int) - ref[0].astype(int)).max() <= 1


def test_upsample_nearest_opset9():
    got, ref = run_both("Upsample", {"x_0": rand(1, 2, 3, 4)}, {"s_1": np.array([1, 1, 2, 3], np.float32)}, opset=9)
    assert_close(got, ref)


def test_resize_opset10():
    got, ref = run_both("Resize", {"x_0": rand(1, 2, 3, 4)}, {"s_1": np.array([1, 1, 2, 1.5], np.float32)},
                        {"mode": "linear"}, opset=10)
    assert_close(got, ref)


# --- shape ops -----------------------------------------------------------------------------------------

def test_shape_size_chain():
    """Shape/Size fold to constants; the rest of the graph uses them."""
    nodes = [helper.make_node("Shape", ["x"], ["s"], start=1, end=-1),
             helper.make_node("Size", ["x"], ["n"]),
             helper.make_node("ConstantOfShape", ["s"], ["z"], value=helper.make_tensor("v", F32, [1], [2.5])),
             helper.make_node("Unsqueeze", ["n", "ax"], ["n1"]),
             helper.make_node("Range", ["zero", "n", "step"], ["r"])]
    m = model(nodes, [tinfo("x", F32, [2, 3, 4, 5])],
              [tinfo("s", I64), tinfo("n", I64), tinfo("z", F32), tinfo("n1", I64), tinfo("r", I64)],
              [init("ax", i64(0)), init("zero", np.array(3, np.int64)), init("step", np.array(7, np.int64))])
    feeds = {"x": rand(2, 3, 4, 5)}
    got, _ = compile_and_run(m, feeds)
    ref = ort_run(m, feeds)
    for k in ref:
        assert got[k].dtype == ref[k].dtype and got[k].shape == ref[k].shape
        np.testing.assert_array_equal(got[k], ref[k])


def test_constant_attribute_forms():
    nodes = [helper.make_node("Constant", [], ["a"], value_floats=[1.5, 2.5]),
             helper.make_node("Constant", [], ["b"], value_int=7),
             helper.make_node("Constant", [], ["c"], value=helper.make_tensor("t", F32, [2, 1], [3, 4])),
             helper.make_node("Add", ["x", "c"], ["y"])]
    m = model(nodes, [tinfo("x", F32, [2, 2])], [tinfo("a", F32), tinfo("b", I64), tinfo("y", F32)])
    feeds = {"x": rand(2, 2)}
    got, _ = compile_and_run(m, feeds)
    ref = ort_run(m, feeds)
    for k in ref:
        np.testing.assert_array_equal(got[k], ref[k])


@pytest.mark.parametrize("k", [0, 1, -2])
def test_eye_like(k):
    got, ref = run_both("EyeLike", {"x_0": rand(4, 5)}, attrs={"k": k, "dtype": TensorProto.INT32},
                        out_types=[TensorProto.INT32])
    assert_close(got, ref)


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot(axis):
    idx = ints(3, 4, lo=-5, hi=5)
    got, ref = run_both("OneHot", {"i_0": idx, "v_2": np.array([-1.0, 3.0], np.float32)},
                        {"d_1": np.array(5, np.int64)}, {"axis": axis}, out_types=[F32])
    assert_close(got, ref)


def test_range_runtime_is_refused():
    from grapec.errors import UnsupportedError
    node = helper.make_node("Range", ["a", "b", "c"], ["y"])
    m = model([node], [tinfo("a", F32, []), tinfo("b", F32, []), tinfo("c", F32, [])], [tinfo("y", F32)])
    with pytest.raises(UnsupportedError, match="data-dependent"):
        compile_and_run(m, {k: np.array(v, np.float32) for k, v in zip("abc", (0, 5, 1))})


# --- ONNX node tests, parameters as initializers ------------------------------------------------------

# op -> input positions that real models carry as constants (the node tests feed them at run time)
FREEZE = {"Slice": {1, 2, 3, 4}, "Squeeze": {1}, "Unsqueeze": {1}, "Split": {1}, "Pad": {1, 2, 3},
          "Expand": {1}, "Tile": {1, 2}, "Reshape": {1}, "Resize": {1, 2, 3}, "Upsample": {1},
          "CenterCropPad": {1}, "Compress": {1}, "ConstantOfShape": {0}, "Range": {0, 1, 2},
          "NonZero": {0}, "Unique": {0}, "OneHot": {1}}


def _node_cases():
    from grapec.tools.onnx_backend import node_testcases
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = node_testcases()
    keep = []
    for c in cases:
        g = c.model.graph
        if len(g.node) == 1 and g.node[0].op_type in FREEZE and "bfloat16" not in c.name:
            keep.append(c)
    return keep


def _freeze(case, inputs):
    m = onnx.ModelProto()
    m.CopyFrom(case.model)
    g = m.graph
    node = g.node[0]
    frozen = {n for p, n in enumerate(node.input) if p in FREEZE[node.op_type] and n}
    infos = list(g.input)
    del g.input[:]
    feeds = {}
    for info, v in zip(infos, inputs):
        if info.name in frozen:
            g.initializer.append(onnx.numpy_helper.from_array(np.asarray(v), info.name))
        else:
            g.input.append(info)
            feeds[info.name] = np.asarray(v)
    return m, feeds


NODE_CASES = _node_cases()
# The reference implementation divides by the fractional scale*length for align_corners; the spec
# (length_resized), onnxruntime and PyTorch use the integer output length. These compare to onnxruntime.
FOLLOW_ORT = {"test_resize_downsample_scales_linear_align_corners", "test_resize_downsample_scales_cubic_align_corners"}


@pytest.mark.parametrize("case", NODE_CASES, ids=[c.name for c in NODE_CASES])
def test_onnx_node_case_with_constant_parameters(case):
    for inputs, outputs in case.data_sets:
        m, feeds = _freeze(case, inputs)
        got, _ = compile_and_run(m, feeds)
        if case.name in FOLLOW_ORT:
            outputs = list(ort_run(case.model, dict(zip([i.name for i in case.model.graph.input], inputs))).values())
        for o, ref in zip(m.graph.output, outputs):
            ref = np.asarray(ref)
            assert got[o.name].dtype == ref.dtype and got[o.name].shape == ref.shape
            np.testing.assert_allclose(got[o.name], ref, rtol=case.rtol, atol=max(case.atol, 1e-6))
