"""Data-dependent sizes by predication (issue 36): NonZero, Compress, NonMaxSuppression and TopK (a
run-time k) on run-time data, their outputs at a bound with a count on the device, trimmed to onnxruntime's shapes by run().
Every model is compiled once, written and read back, and run on inputs whose counts vary between
runs (none, a few, many), against onnxruntime on the CPU; the CUDA code of both selection kernels is
run by the host emulation next to their numpy semantics."""
import tempfile

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import grapec
from grapec.bundle.format import Bundle
from grapec.codegen.host import HostModule
from grapec.errors import InputError, UnsupportedError
from grapec.ir.selection import NmsKernel, NmsMaskKernel, NonZeroKernel, TopKKernel
from grapec.runtime.session import Session

from helpers import init, model, ort_run, tinfo
from test_cli import assert_user_error, grapec as grapec_cli

I64 = TensorProto.INT64


def _session(m, backend="cpu", **kw):
    b = grapec.compile(m, targets=[] if backend == "cpu" else "auto", **kw)
    return Session(Bundle.from_bytes(b.to_bytes()), backend=backend), b


def _check_same(got: dict, ref: dict):
    for name, r in ref.items():
        g = got[name]
        assert g.shape == r.shape and g.dtype == r.dtype, (name, g.shape, r.shape, g.dtype, r.dtype)
        np.testing.assert_allclose(g, r, rtol=1e-6, atol=1e-6, err_msg=name)


def masked_values_model():
    """x[x > t] as exporters write it (NonZero -> Transpose -> GatherND), the sum of what it selects,
    and how many: a reduction over the data-dependent axis and a Shape of it."""
    nodes = [helper.make_node("Greater", ["x", "t"], ["hit"]),
             helper.make_node("NonZero", ["hit"], ["nz"]),
             helper.make_node("Transpose", ["nz"], ["at"], perm=[1, 0]),
             helper.make_node("GatherND", ["x", "at"], ["picked"]),
             helper.make_node("Mul", ["picked", "two"], ["doubled"]),
             helper.make_node("ReduceSum", ["doubled"], ["total"], keepdims=0),
             helper.make_node("Shape", ["picked"], ["how_many"])]
    return model(nodes, [tinfo("x", shape=[4, 6]), tinfo("t", shape=[])],
                 [tinfo("doubled"), tinfo("total"), tinfo("how_many", I64), tinfo("at", I64)],
                 [init("two", np.array(2.0, np.float32))])


def detection_head_model(batches=2, boxes=64, classes=3, max_out=8):
    """A YOLO-style head with NMS in the graph: predictions [B, N, 4 + C] (center boxes, then class
    scores) -> NonMaxSuppression -> the selected boxes, scores and labels gathered by its indices."""
    b, n, c = batches, boxes, classes
    nodes = [
        helper.make_node("Slice", ["pred", "s0", "s4", "ax2"], ["box"]),
        helper.make_node("Slice", ["pred", "s4", "send", "ax2"], ["cls"]),
        helper.make_node("Transpose", ["cls"], ["scores"], perm=[0, 2, 1]),
        helper.make_node("NonMaxSuppression", ["box", "scores", "max_out", "iou", "score_thr"], ["sel"],
                         center_point_box=1),
        helper.make_node("Gather", ["sel", "i0"], ["bi"], axis=1),
        helper.make_node("Gather", ["sel", "i1"], ["label"], axis=1),
        helper.make_node("Gather", ["sel", "i2"], ["ni"], axis=1),
        helper.make_node("Mul", ["bi", "n"], ["row0"]),
        helper.make_node("Add", ["row0", "ni"], ["row"]),
        helper.make_node("Reshape", ["box", "flat4"], ["box_flat"]),
        helper.make_node("Gather", ["box_flat", "row"], ["det_boxes"], axis=0),
        helper.make_node("Mul", ["bi", "c"], ["srow0"]),
        helper.make_node("Add", ["srow0", "label"], ["srow1"]),
        helper.make_node("Mul", ["srow1", "n"], ["srow2"]),
        helper.make_node("Add", ["srow2", "ni"], ["sflat"]),
        helper.make_node("Reshape", ["scores", "flat1"], ["scores_flat"]),
        helper.make_node("Gather", ["scores_flat", "sflat"], ["det_scores"], axis=0),
        helper.make_node("ReduceMax", ["det_scores"], ["best"], keepdims=0),
    ]
    consts = [init("s0", np.array([0], np.int64)), init("s4", np.array([4], np.int64)),
              init("send", np.array([4 + c], np.int64)), init("ax2", np.array([2], np.int64)),
              init("max_out", np.array([max_out], np.int64)), init("iou", np.array([0.45], np.float32)),
              init("score_thr", np.array([0.25], np.float32)), init("i0", np.array(0, np.int64)),
              init("i1", np.array(1, np.int64)), init("i2", np.array(2, np.int64)),
              init("n", np.array(n, np.int64)), init("c", np.array(c, np.int64)),
              init("flat4", np.array([-1, 4], np.int64)), init("flat1", np.array([-1], np.int64))]
    return model(nodes, [tinfo("pred", shape=[b, n, 4 + c])],
                 [tinfo("det_boxes"), tinfo("det_scores"), tinfo("label", I64), tinfo("best")], consts, opset=17)


def detection_inputs(rng, b=2, n=64, c=3, level=0.5):
    """Boxes in clusters (so IoU suppresses), scores scaled by `level`: 0 keeps none above 0.25."""
    centers = rng.random((b, 6, 2)).astype(np.float32) * 100
    pick = rng.integers(0, 6, (b, n))
    xy = np.take_along_axis(centers, pick[..., None], 1) + rng.normal(0, 3, (b, n, 2)).astype(np.float32)
    wh = 10 + rng.random((b, n, 2)).astype(np.float32) * 10
    cls = (rng.random((b, n, c)) * level).astype(np.float32)
    return {"pred": np.concatenate([xy, wh, cls], axis=2).astype(np.float32)}


def test_masked_values_match_onnxruntime_as_counts_vary():
    m = masked_values_model()
    sess, bundle = _session(m)
    rng = np.random.default_rng(1)
    seen = set()
    for t in (2.0, 0.9, 0.5, 0.1, -1.0):   # none, a few, many, all selected
        feeds = {"x": rng.random((4, 6)).astype(np.float32), "t": np.array(t, np.float32)}
        ref = ort_run(m, feeds)
        got = sess.run(feeds)
        _check_same(got, ref)
        assert set(got) == set(ref)   # the count outputs stay inside
        seen.add(len(ref["doubled"]))
    assert 0 in seen and 24 in seen and len(seen) >= 4
    out = {o.name: o.shape for o in sess.get_outputs()}
    assert out["doubled"] == ["doubled::count0"] and out["at"] == ["at::count0", 2]


def test_detection_head_matches_onnxruntime(tmp_path):
    m = detection_head_model()
    path = tmp_path / "head.onnx"
    onnx.save(m, str(path))
    b = grapec.compile(str(path), targets=[], strict=True)
    b.write(str(tmp_path / "head.grape"))
    sess = grapec.load(str(tmp_path / "head.grape"), backend="cpu")
    rng = np.random.default_rng(2)
    counts = []
    for level in (0.0, 0.3, 1.0, 1.0, 0.6):
        feeds = detection_inputs(rng, level=level)
        ref = ort_run(m, feeds)
        if len(ref["label"]) == 0:
            ref.pop("best")   # onnxruntime: the max of nothing; the reduction's identity here, unchecked
        got = sess.run(feeds)
        _check_same(got, ref)
        counts.append(len(ref["label"]))
    assert counts[0] == 0 and max(counts) > 4 and len(set(counts)) >= 3
    d = b.manifest["buckets"][0]["predicated"]
    assert [(x["op"], x["bound"]) for x in d] == [("NonMaxSuppression", 2 * 3 * 8)]
    rc, out, err = grapec_cli("inspect", tmp_path / "head.grape")
    assert rc == 0 and "data-dependent size: dim 0 of 'sel' (NonMaxSuppression 'NonMaxSuppression_3'), at most 48: " \
        "batches x classes x max_output_boxes_per_class (2 x 3 x 8)" in out, out


def test_compress_by_runtime_condition_matches_onnxruntime():
    m = model([helper.make_node("Compress", ["x", "keep"], ["y"], axis=1),
               helper.make_node("Relu", ["y"], ["z"])],
              [tinfo("x", shape=[3, 5]), tinfo("keep", TensorProto.BOOL, [5])], [tinfo("z")])
    sess, _ = _session(m)
    rng = np.random.default_rng(3)
    for p in (0.0, 0.4, 1.0):
        feeds = {"x": rng.standard_normal((3, 5)).astype(np.float32), "keep": rng.random(5) < p}
        _check_same(sess.run(feeds), ort_run(m, feeds))


def test_an_op_that_would_read_padding_is_refused_by_name(tmp_path):
    m = model([helper.make_node("NonZero", ["x"], ["nz"]),
               helper.make_node("Slice", ["nz", "one", "big", "one"], ["tail"])],
              [tinfo("x", shape=[8])], [tinfo("tail", I64)],
              [init("one", np.array([1], np.int64)), init("big", np.array([100], np.int64))])
    with pytest.raises(UnsupportedError, match=r"node 'Slice_1' \(Slice\): input 'nz' has a data-dependent size "
                                               r"\(dim 1, at most 8\); a Slice of its data-dependent dim from 1 by 1"):
        grapec.compile(m, targets=[])
    onnx.save(m, str(tmp_path / "m.onnx"))
    assert_user_error(*grapec_cli("compile", tmp_path / "m.onnx", "-o", tmp_path / "m.grape", "--no-gpu"),
                      "Slice_1", "data-dependent size", "at most 8")
    assert not (tmp_path / "m.grape").exists()


def test_concat_along_counted_axes_matches_onnxruntime():
    """torchvision's per-class detections: pieces of data-dependent length back to back, with a fixed
    piece between them; then a TopK whose k is min(a constant, the total) (a bounded run-time k)."""
    nodes = [helper.make_node("Greater", ["x", "t"], ["hx"]), helper.make_node("NonZero", ["hx"], ["nx"]),
             helper.make_node("Less", ["y", "t"], ["hy"]), helper.make_node("NonZero", ["hy"], ["ny"]),
             helper.make_node("Concat", ["nx", "fixed", "ny"], ["all"], axis=1),
             helper.make_node("Cast", ["all"], ["allf"], to=TensorProto.FLOAT),
             helper.make_node("Shape", ["all"], ["shape"], start=1, end=2),
             helper.make_node("Min", ["shape", "five"], ["k"]),
             helper.make_node("TopK", ["allf", "k"], ["best", "where"], axis=1),
             helper.make_node("ConstantOfShape", ["shape"], ["ones"], value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0]))]
    m = model(nodes, [tinfo("x", shape=[6]), tinfo("y", shape=[4]), tinfo("t", shape=[])],
              [tinfo("all", I64), tinfo("best"), tinfo("where", I64), tinfo("ones")],
              [init("fixed", np.array([[7, 8]], np.int64)), init("five", np.array([5], np.int64))])
    sess, b = _session(m)
    rng = np.random.default_rng(8)
    for t in (2.0, 0.5, -1.0, 0.8):
        feeds = {"x": rng.random(6).astype(np.float32), "y": rng.random(4).astype(np.float32), "t": np.array(t, np.float32)}
        _check_same(sess.run(feeds), ort_run(m, feeds))
    assert b.plans[0].buffers[b.plans[0].outputs[1][1]].shape == (1, 5)   # TopK's bound: k's, not the axis's 12


def test_selection_kernels_cuda_code_agrees_with_numpy_in_the_host_emulation():
    rng = np.random.default_rng(4)
    flags = rng.random((3, 5, 7)) > 0.6
    nz = NonZeroKernel((3, flags.size), ((flags.shape, "bool"),))
    boxes = rng.random((2, 40, 4)).astype(np.float32)
    boxes[..., 2:] = boxes[..., :2] + rng.random((2, 40, 2)).astype(np.float32) * 0.5
    scores = rng.random((2, 3, 40)).astype(np.float32)
    scores[0, 0, 3] = scores[0, 0, 5] = scores[0, 0].max()   # equal best scores: the lower index first
    args = [boxes, scores, np.array(7, np.int64), np.array(0.3, np.float32), np.array(0.2, np.float32), np.array(37, np.int64),
            np.argsort(-scores, axis=2, kind="stable")]   # each class's boxes best first, as the TopK kernel ranks them
    specs = tuple((a.shape, str(a.dtype)) for a in args)
    masks = [NmsMaskKernel((6, 40, 1), tuple((a.shape, str(a.dtype)) for a in (boxes, args[6], args[3])), c) for c in (0, 1)]
    mask_args = [[boxes, args[6], args[3]]] * 2
    masked = [NmsKernel((2, 3, 10), specs + (((6, 40, 1), "uint64"),), 0, True, True),
              NmsKernel((2, 3, 40), specs + (((6, 40, 1), "uint64"),), 1, False, True)]
    kernels = [nz, NmsKernel((2, 3, 10), specs, 0, True), NmsKernel((2, 3, 40), specs, 1, False), *masks, *masked]
    host = HostModule(kernels, tempfile.mkdtemp())
    out = np.zeros(nz.shape, np.int64)
    host.call(0, out, [flags])
    np.testing.assert_array_equal(out, nz.run([flags]))
    assert (out[:, :flags.sum()] == np.array(np.nonzero(flags))).all() and (out[:, flags.sum():] == -1).all()
    for i in (1, 2):
        out = np.zeros(kernels[i].shape, np.int64)
        host.call(i, out, args)
        ref = kernels[i].run(args)
        np.testing.assert_array_equal(out, ref)
        assert 0 < (ref >= 0).sum() < ref.size
    assert list(kernels[1].run(args)[0, 0, :2]) == [3, 5]
    for i in (3, 4):   # the overlap masks, then the walks over them give what the checks gave
        out = np.zeros(kernels[i].shape, np.uint64)
        host.call(i, out, mask_args[i - 3])
        np.testing.assert_array_equal(out, kernels[i].run(mask_args[i - 3]))
        walk = np.zeros(kernels[i + 2].shape, np.int64)
        host.call(i + 2, walk, args + [out])
        np.testing.assert_array_equal(walk, kernels[i - 2].run(args))


def test_topk_with_a_runtime_k_matches_onnxruntime():
    """k read at run time: the outputs are the axis long (the bound) with a count of min(k, dim)."""
    m = model([helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1, largest=0),
               helper.make_node("Neg", ["v"], ["nv"])],
              [tinfo("x", shape=[3, 9]), tinfo("k", I64, [1])], [tinfo("nv"), tinfo("i", I64)])
    sess, b = _session(m)
    rng = np.random.default_rng(5)
    for k in (0, 1, 4, 9, 3):
        feeds = {"x": rng.integers(0, 5, (3, 9)).astype(np.float32), "k": np.array([k], np.int64)}   # ties
        _check_same(sess.run(feeds), ort_run(m, feeds))
    assert b.manifest["buckets"][0]["predicated"][0]["bound"] == 9


def test_topk_cuda_code_agrees_with_numpy_in_the_host_emulation():
    """Rows short and long, along the last axis and a middle one, k below and at the bound; rows of
    TOPK_SELECT_MIN_DIM and more take the radix select (with more equal keys at the cut than are
    kept, and k = 0)."""
    from grapec.codegen.selection import TOPK_SELECT_MIN_DIM, topk_selects
    rng = np.random.default_rng(6)
    cases = [((3, 37, 2), 1, "float32", True, 10, 7), ((5, 100), 1, "int64", False, 100, 40),
             ((2, 6000), 1, "float32", True, 50, 33), ((4, 9), 0, "float64", True, 4, 4),
             ((TOPK_SELECT_MIN_DIM + 3, 3), 0, "float64", False, 64, 64), ((1, 5000), 1, "int64", True, 300, 299),
             ((2, TOPK_SELECT_MIN_DIM), 1, "float32", False, 10, 0)]
    kernels, args = [], []
    for shape, axis, dt, largest, bound, k in cases:
        x = rng.integers(-10, 20, shape).astype(dt)   # many equal keys, both signs
        if dt != "int64":
            x.reshape(-1)[::17] = np.nan
            x[x == 0] = np.where(rng.random(int((x == 0).sum())) < 0.5, -0.0, 0.0)   # -0 ranks with +0
        out_shape = list(shape)
        out_shape[axis] = bound
        kernels.append(TopKKernel(tuple(out_shape), ((shape, dt), ((1,), "int64")), axis, largest))
        args.append([x, np.array([k], np.int64)])
    assert [topk_selects(k) for k in kernels] == [False, False, True, False, True, True, True]
    host = HostModule(kernels, tempfile.mkdtemp())
    for i, (kernel, a) in enumerate(zip(kernels, args)):
        out = np.zeros(kernel.shape, np.int64)
        host.call(i, out, a)
        np.testing.assert_array_equal(out, kernel.run(a))


@pytest.mark.parametrize("sorted_", [1, 0])
def test_unique_of_runtime_data_matches_onnxruntime(sorted_):
    m = model([helper.make_node("Unique", ["x"], ["y", "first", "inverse", "counts"], sorted=sorted_)],
              [tinfo("x", I64, [4, 5])], [tinfo("y", I64), tinfo("first", I64), tinfo("inverse", I64), tinfo("counts", I64)])
    sess, _ = _session(m)
    rng = np.random.default_rng(7)
    sizes = set()
    for top in (1, 3, 12, 1000):   # one value repeated, a few, many, (nearly) all distinct
        feeds = {"x": rng.integers(-top, top + 1, (4, 5)).astype(np.int64)}
        ref = ort_run(m, feeds)
        _check_same(sess.run(feeds), ref)
        sizes.add(len(ref["y"]))
    assert len(sizes) == 4


@pytest.mark.parametrize("sorted_", [1, 0])
def test_unique_slices_along_an_axis_match_onnxruntime(sorted_):
    """Unique columns (axis 1) of a small int table: repeated columns, and a 3-D case along axis 0."""
    for shape, axis in (((3, 7), 1), ((5, 2, 2), 0)):
        m = model([helper.make_node("Unique", ["x"], ["y", "first", "inverse", "counts"], sorted=sorted_, axis=axis)],
                  [tinfo("x", I64, list(shape))],
                  [tinfo("y", I64), tinfo("first", I64), tinfo("inverse", I64), tinfo("counts", I64)])
        sess, _ = _session(m)
        rng = np.random.default_rng(9)
        seen = set()
        for top in (0, 1, 2, 50):   # all slices alike, a few kinds, (nearly) all distinct
            feeds = {"x": rng.integers(0, top + 1, shape).astype(np.int64)}
            ref = ort_run(m, feeds)
            _check_same(sess.run(feeds), ref)
            seen.add(len(ref["first"]))
        assert 1 in seen and len(seen) >= 3


def early_stop_loop_model():
    """A Loop with M = 10 whose body stops once a running sum passes a threshold; a scan output of a
    row per iteration, and a sum over those rows after the loop."""
    body = helper.make_graph(
        [helper.make_node("Add", ["acc_in", "step"], ["acc_out"]),
         helper.make_node("ReduceSum", ["acc_out"], ["s"], keepdims=0),
         helper.make_node("Less", ["s", "limit"], ["go"]),
         helper.make_node("Mul", ["acc_out", "two"], ["row"])],
        "body", [tinfo("i", I64, []), tinfo("cond", TensorProto.BOOL, []), tinfo("acc_in", shape=[3])],
        [tinfo("go", TensorProto.BOOL, []), tinfo("acc_out", shape=[3]), tinfo("row", shape=[3])],
        [init("two", np.array(2.0, np.float32))])
    m = model([helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
               helper.make_node("Loop", ["M", "", "x"], ["final", "rows"], body=body),
               helper.make_node("ReduceSum", ["rows"], ["rows_sum"], keepdims=0)],
              [tinfo("x", shape=[3]), tinfo("step", shape=[3]), tinfo("limit", shape=[])],
              [tinfo("final"), tinfo("rows"), tinfo("rows_sum")], [init("M", np.array(10, np.int64))])
    return m


def check_early_stop_loop(sess):
    m, rng, seen = early_stop_loop_model(), np.random.default_rng(10), set()
    for limit in (-1.0, 2.0, 6.0, 100.0):   # stops after 1, a few, ... all 10 iterations
        feeds = {"x": rng.random(3).astype(np.float32), "step": rng.random(3).astype(np.float32) + 0.2,
                 "limit": np.array(limit, np.float32)}
        ref = ort_run(m, feeds)
        _check_same(sess.run(feeds), ref)
        seen.add(len(ref["rows"]))
    assert 1 in seen and 10 in seen and len(seen) >= 3


def test_loop_that_may_stop_early_has_counted_scan_outputs():
    """The scan output has one row per iteration run (a bounded trip count), trimmed as onnxruntime
    shapes it; the sum after the loop reads only those rows."""
    sess, b = _session(early_stop_loop_model())
    check_early_stop_loop(sess)
    assert [d["op"] for d in b.manifest["buckets"][0]["predicated"]] == ["Loop"]


def test_range_to_a_count_matches_onnxruntime():
    """arange(n) over n selected values (torchvision numbers its detections so), and one by 2 from 1."""
    m = model([helper.make_node("Greater", ["x", "t"], ["hit"]), helper.make_node("NonZero", ["hit"], ["nz"]),
               helper.make_node("Shape", ["nz"], ["shape"], start=1, end=2),
               helper.make_node("Squeeze", ["shape", "zero"], ["n"]),
               helper.make_node("Range", ["zero_s", "n", "one_s"], ["ids"]),
               helper.make_node("Range", ["one_s", "n", "two_s"], ["odd"]),
               helper.make_node("Cast", ["ids"], ["idsf"], to=TensorProto.FLOAT),
               helper.make_node("ReduceSum", ["idsf"], ["total"], keepdims=0)],
              [tinfo("x", shape=[9]), tinfo("t", shape=[])], [tinfo("ids", I64), tinfo("odd", I64), tinfo("total")],
              [init("zero", np.array([0], np.int64)), init("zero_s", np.array(0, np.int64)),
               init("one_s", np.array(1, np.int64)), init("two_s", np.array(2, np.int64))])
    sess, _ = _session(m)
    rng = np.random.default_rng(11)
    for t in (2.0, 0.9, 0.4, -1.0):
        feeds = {"x": rng.random(9).astype(np.float32), "t": np.array(t, np.float32)}
        _check_same(sess.run(feeds), ort_run(m, feeds))


def test_iobinding_gives_a_counted_output_at_its_bound_with_its_count():
    m = detection_head_model()
    sess, b = _session(m)
    feeds = detection_inputs(np.random.default_rng(12), level=0.6)
    ref = ort_run(m, feeds)
    binding = sess.io_binding()
    binding.bind_input("pred", feeds["pred"])
    labels = np.full((2 * 3 * 8,), -7, np.int64)
    binding.bind_output("label", labels)
    sess.run_with_iobinding(binding)
    got = binding.get_outputs()
    n = int(got["label::count0"])
    assert n == len(ref["label"]) > 0 and got["label"] is labels
    np.testing.assert_array_equal(labels[:n], ref["label"])


def test_a_long_row_is_ranked_in_two_stages_as_in_one():
    """A row of TOPK_SPLIT_MIN_DIM and more with a small k goes through two TopK kernels (segments,
    then their candidates): the same indices as one kernel over the row (NaN last, ties by index),
    and onnxruntime's where there is no NaN (onnxruntime places NaN anywhere)."""
    from grapec.ops.selection import TOPK_SPLIT_MIN_DIM
    n = TOPK_SPLIT_MIN_DIM * 3 + 7   # the last segment padded
    m = model([helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1),
               helper.make_node("TopK", ["y", "k"], ["w", "j"], axis=0, largest=0)],
              [tinfo("x", shape=[2, n]), tinfo("y", I64, [n, 3])],
              [tinfo("v"), tinfo("i", I64), tinfo("w", I64), tinfo("j", I64)], [init("k", np.array([300], np.int64))])
    sess, b = _session(m)
    assert b.manifest["buckets"][0]["steps"]["kernel"] >= 6   # two TopK kernels an input
    rng = np.random.default_rng(8)
    for nan in (False, True):
        feeds = {"x": (rng.integers(-3000, 3000, (2, n)) / 7).astype(np.float32), "y": rng.integers(-99, 99, (n, 3))}
        if nan:
            feeds["x"].reshape(-1)[::5] = np.nan
            feeds["x"][1, :2000] = np.nan   # more NaN than is kept in a segment
        got = sess.run(feeds)
        one = TopKKernel((2, 300), (((2, n), "float32"), ((1,), "int64")), 1, True).run([feeds["x"], np.array([300])])
        np.testing.assert_array_equal(got["i"], one)
        np.testing.assert_array_equal(got["w"], np.take_along_axis(feeds["y"], got["j"], 0))
        if not nan:
            _check_same(got, ort_run(m, feeds))


def test_nonzero_of_many_flags_runs_a_block_per_segment():
    """Past NONZERO_SPLIT_MIN flags, a block per segment compacts from the offset the segments before
    it give: the CUDA code in the host emulation (a small segment, so that there are many) against
    numpy, and a model's NonZero of 300K flags against onnxruntime."""
    from grapec.ops.selection import NONZERO_SPLIT_MIN
    rng = np.random.default_rng(12)
    flags = rng.random((3, 700)) < 0.3
    flags[1] = False   # segments with nothing in them
    segment = 256
    counts = [flags.reshape(-1)[s:s + segment].sum() for s in range(0, flags.size, segment)]
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    nz = NonZeroKernel((2, flags.size), (((3, 700), "bool"), (offsets.shape, "int64")), segment=segment)
    assert NonZeroKernel.from_json(nz.to_json()) == nz
    out = np.zeros(nz.shape, np.int64)
    HostModule([nz], tempfile.mkdtemp()).call(0, out, [flags, offsets])
    np.testing.assert_array_equal(out, nz.run([flags, offsets]))

    shape = (600, NONZERO_SPLIT_MIN // 600 + 100)
    m = model([helper.make_node("Greater", ["x", "t"], ["hit"]), helper.make_node("NonZero", ["hit"], ["nz"])],
              [tinfo("x", shape=list(shape)), tinfo("t", shape=[])], [tinfo("nz", I64)])
    sess, b = _session(m)
    assert any(k.get("segment") for k in b.kernels if isinstance(k, dict)), "the segmented kernel"
    for t in (0.5, 3.0, 10.0):   # about a third, a few, none
        feeds = {"x": rng.standard_normal(shape).astype(np.float32), "t": np.array(t, np.float32)}
        _check_same(sess.run(feeds), ort_run(m, feeds))


def nms_first_rows_model(rows: int, also_read: bool = False):
    """NonMaxSuppression over 2 batches x 3 classes, its box column (Gather axis 1, Squeeze) cut to the
    first `rows` rows, as torchvision's `keep[:detections_per_img]`; `also_read`: the whole selection
    is an output too."""
    nodes = [helper.make_node("NonMaxSuppression", ["boxes", "scores", "max_out", "iou", "thr"], ["sel"]),
             helper.make_node("Gather", ["sel", "two"], ["col"], axis=1),
             helper.make_node("Squeeze", ["col", "one"], ["keep"]),
             helper.make_node("Slice", ["keep", "zero", "rows"], ["first"])]
    outs = [tinfo("first", I64)] + ([tinfo("sel", I64)] if also_read else [])
    return model(nodes, [tinfo("boxes", shape=[2, 64, 4]), tinfo("scores", shape=[2, 3, 64])], outs,
                 [init("max_out", np.array([1000], np.int64)), init("iou", np.array([0.3], np.float32)),
                  init("thr", np.array([0.05], np.float32)), init("two", np.array([2], np.int64)),
                  init("one", np.array([1], np.int64)), init("zero", np.array([0], np.int64)),
                  init("rows", np.array([rows], np.int64))])


def test_nms_stops_at_the_rows_read_after_it():
    """Only the first E rows of the selection are read: each class stops at E selections (the walk
    ends early), and those rows equal onnxruntime's; where the whole selection is read, no cap."""
    for rows, also in ((5, False), (40, False), (5, True)):
        m = nms_first_rows_model(rows, also)
        sess, b = _session(m)
        nms = [d for d in b.manifest["buckets"][0]["predicated"] if d["op"] == "NonMaxSuppression"][0]
        assert nms["bound"] == 2 * 3 * (64 if also else min(rows, 64)), nms
        rng = np.random.default_rng(rows)
        for level in (0.0, 0.3, 1.0):   # none above the threshold, some, many
            boxes = rng.random((2, 64, 4)).astype(np.float32) * 100
            feeds = {"boxes": np.concatenate([boxes[..., :2], boxes[..., :2] + 5 + boxes[..., 2:] / 5], -1),
                     "scores": (rng.random((2, 3, 64)) * level).astype(np.float32)}
            _check_same(sess.run(feeds), ort_run(m, feeds))


@pytest.mark.no_round_trip("random inputs hit other than 3 times: the Reshape's run-time check refuses them by design")
def test_rows_the_data_decides_padded_and_reshaped_into_a_fixed_shape():
    """Pad at the end of counted rows (by a constant, or by an amount computed from their count): the
    valid rows, then the pad rows, counted by their sum; a Reshape of counted rows into a fixed shape
    takes the leading elements and is checked at run time (onnxruntime fails such a run too)."""
    nodes = [helper.make_node("Greater", ["x", "t"], ["hit"]),
             helper.make_node("NonZero", ["hit"], ["nz"]),
             helper.make_node("Transpose", ["nz"], ["rows"], perm=[1, 0]),
             helper.make_node("Pad", ["rows", "two_more", "fill"], ["padded"]),
             helper.make_node("Shape", ["rows"], ["shape"]),
             helper.make_node("Gather", ["shape", "zero"], ["n"], axis=0),
             helper.make_node("Sub", ["eight", "n"], ["missing"]),
             helper.make_node("Concat", ["zeros2", "missing", "zero1"], ["pads"], axis=0),
             helper.make_node("Pad", ["rows", "pads", "fill"], ["to_eight"]),
             helper.make_node("Reshape", ["to_eight", "four_two"], ["grid"]),
             helper.make_node("Reshape", ["rows", "three"], ["exactly_three"])]
    inits = [init("t", np.array(0.0, np.float32)), init("two_more", np.array([0, 0, 2, 0], np.int64)),
             init("fill", np.array(-7, np.int64)), init("zero", np.array(0, np.int64)),
             init("eight", np.array([8], np.int64)), init("zeros2", np.array([0, 0], np.int64)),
             init("zero1", np.array([0], np.int64)), init("four_two", np.array([4, 2], np.int64)),
             init("three", np.array([3], np.int64))]
    m = model(nodes, [tinfo("x", shape=[8])], [tinfo("padded", I64), tinfo("grid", I64), tinfo("exactly_three", I64)],
              inits)
    sess, b = _session(m)
    rng = np.random.default_rng(21)
    for hits in (3, 3, 3):
        x = -rng.random(8).astype(np.float32)
        x[rng.permutation(8)[:hits]] = 1.0
        _check_same(sess.run({"x": x}), ort_run(m, {"x": x}))
    x = np.array([1, -1, 1, -1, -1, -1, -1, -1], np.float32)   # two hits: [2, 1] cannot be reshaped to [3]
    with pytest.raises(Exception):
        ort_run(m, {"x": x})
    with pytest.raises(InputError, match=r"its input holds 2 elements in this run, where its target shape needs 3"):
        sess.run({"x": x})


def test_selected_samples_through_a_convolution():
    """Samples picked by the data (Mask R-CNN's detected rois) through Conv, MaxPool and a Resize of their
    spatial axes keep their count; the sum after reads only them."""
    nodes = [helper.make_node("ReduceMax", ["x"], ["peak"], axes=[1, 2, 3], keepdims=0),
             helper.make_node("Greater", ["peak", "t"], ["hit"]),
             helper.make_node("NonZero", ["hit"], ["nz"]),
             helper.make_node("Squeeze", ["nz", "zero"], ["picked"]),
             helper.make_node("Gather", ["x", "picked"], ["rois"], axis=0),
             helper.make_node("Conv", ["rois", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("MaxPool", ["c"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Resize", ["p", "", "scales"], ["up"], mode="nearest"),
             helper.make_node("ReduceSum", ["up"], ["total"], keepdims=0)]
    rng = np.random.default_rng(4)
    m = model(nodes, [tinfo("x", shape=[8, 2, 6, 6])], [tinfo("up"), tinfo("total")],
              [init("t", np.array(2.0, np.float32)), init("zero", np.array([0], np.int64)),
               init("w", rng.standard_normal((3, 2, 3, 3)).astype(np.float32)),
               init("scales", np.array([1, 1, 2, 2], np.float32))])
    sess, b = _session(m)
    counts = set()
    for level in (0.5, 1.0, 2.0):   # none, some, many samples above the threshold
        feeds = {"x": (rng.standard_normal((8, 2, 6, 6)) * level).astype(np.float32)}
        ref = ort_run(m, feeds)
        got = sess.run(feeds)
        assert got["up"].shape == ref["up"].shape
        np.testing.assert_allclose(got["up"], ref["up"], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(got["total"], ref["total"], rtol=1e-4, atol=1e-3)
        counts.add(ref["up"].shape[0])
    assert len(counts) >= 2, counts
