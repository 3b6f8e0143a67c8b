"""Channels-last convolutions (ops/conv.py conv_channels_last, the `conv` library node, passes/channels_last.py)
on the CPU backend, against onnxruntime; and what the plan looks like around them."""
import os

import numpy as np
import onnx
import pytest
from onnx import helper

import grapec
from conv_cases import CASES, check_conv, conv_model, ids, residual_blocks_model
from grapec.tools.check import check_model
from grapec.errors import GrapecError
from grapec.tools.show import library_ops
from helpers import model, tinfo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "models", "tiny")


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
@pytest.mark.parametrize("conv", ["auto", "gemm"])
def test_conv_matches_onnxruntime(case, conv, tmp_path):
    check_conv(tmp_path, conv_model(case), conv=conv)


@pytest.mark.parametrize("case", CASES[:6], ids=ids(CASES[:6]))
def test_conv_relu_conv_matches_onnxruntime(case, tmp_path):
    """The ReLU folds into the first convolution (epilogue.py) and the copy between them goes."""
    m = conv_model(case, relu_chain=True)
    check_conv(tmp_path, m)
    b = grapec.compile(m, targets=[])
    steps = b.manifest["buckets"][0]["steps"]
    assert library_ops(b.plans[0]) == {"conv": 2}
    # the input's NCHW -> NHWC copy and the output's way back: nothing between the convolutions
    assert steps.get("kernel", 0) <= 2, steps


def test_conv_path_is_chosen_by_the_option():
    m = conv_model(CASES[0])
    lib = {c: library_ops(grapec.compile(m, targets=[], conv=c).plans[0]) for c in ("auto", "gemm")}
    assert lib == {"auto": {"conv": 1}, "gemm": {"matmul": 1}}
    with pytest.raises(GrapecError, match="--conv"):
        grapec.compile(m, targets=[], conv="winograd")


def test_3d_convolutions_keep_the_gemm_path_and_say_so():
    w = np.random.default_rng(0).standard_normal((4, 2, 3, 3, 3)).astype(np.float32)
    m = model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1] * 6)], [tinfo("x", shape=[1, 2, 5, 5, 5])],
              [tinfo("y")], [onnx.numpy_helper.from_array(w, "w")])
    b = grapec.compile(m, targets=[])
    assert library_ops(b.plans[0]) == {"matmul": 1}
    assert any("Conv (3-D)" in n for n in b.manifest["notes"]), b.manifest["notes"]


def test_a_grouped_convolution_of_many_taps_takes_the_gemm_path_under_auto():
    """Wav2Vec2's positional convolution (16 groups, 128 taps): cuDNN took 1.4 ms for it on an H100,
    so auto gives it the gather + GEMM and says why; --conv cudnn still takes cuDNN; a depthwise or
    short grouped kernel stays on cuDNN under auto (ops/conv.py GROUPED_TAPS_GEMM)."""
    rng = np.random.default_rng(1)

    def build(channels, group, taps):
        w = rng.standard_normal((channels, channels // group, taps)).astype(np.float32)
        return model([helper.make_node("Conv", ["x", "w"], ["y"], group=group, pads=[taps // 2] * 2)],
                     [tinfo("x", shape=[1, channels, 49])], [tinfo("y")], [onnx.numpy_helper.from_array(w, "w")])
    long = build(64, 16, 128)
    b = grapec.compile(long, targets=[])
    assert library_ops(b.plans[0]) == {"matmul": 1}
    assert any("Conv (grouped, 128 taps)" in n for n in b.manifest["notes"]), b.manifest["notes"]
    assert library_ops(grapec.compile(long, targets=[], conv="cudnn").plans[0]) == {"conv": 1}
    for channels, group, taps in ((64, 64, 128), (64, 16, 9)):
        assert library_ops(grapec.compile(build(channels, group, taps), targets=[]).plans[0]) == {"conv": 1}


def test_a_convolution_of_one_input_channel_takes_the_gemm_path_under_auto():
    """Raw audio into Wav2Vec2's first convolution: the GEMM path writes NCHW for the GroupNorm after
    it (ops/conv.py conv_path); --conv cudnn still takes cuDNN; three channels stay on cuDNN."""
    rng = np.random.default_rng(2)

    def build(channels):
        w = rng.standard_normal((16, channels, 10)).astype(np.float32)
        return model([helper.make_node("Conv", ["x", "w"], ["y"], strides=[5])], [tinfo("x", shape=[1, channels, 400])],
                     [tinfo("y")], [onnx.numpy_helper.from_array(w, "w")])
    b = grapec.compile(build(1), targets=[])
    assert library_ops(b.plans[0]) == {"matmul": 1}
    assert any("Conv (one input channel)" in n for n in b.manifest["notes"]), b.manifest["notes"]
    assert library_ops(grapec.compile(build(1), targets=[], conv="cudnn").plans[0]) == {"conv": 1}
    assert library_ops(grapec.compile(build(3), targets=[]).plans[0]) == {"conv": 1}


@pytest.mark.parametrize("batch", [1, 4])
def test_resnet_stores_activations_channels_last(batch):
    """Between convolutions nothing is transposed: the kernels left are the input's layout copy, the
    residual adds (with their ReLU), the max-pool, the global pool and the classifier."""
    path = os.path.join(TINY, "resnet50.onnx")
    adds = sum(n.op_type == "Add" for n in onnx.load(path).graph.node)
    cudnn = grapec.compile(path, dims={"batch": batch}, targets=[])
    gemm = grapec.compile(path, dims={"batch": batch}, targets=[], conv="gemm")
    assert library_ops(cudnn.plans[0]) == {"conv": 53}
    kernels = [b.manifest["buckets"][0]["steps"]["kernel"] for b in (cudnn, gemm)]
    assert kernels[0] <= adds + 6 < kernels[1], kernels


@pytest.mark.parametrize("name,dims", [("resnet50", {"batch": 3}), ("googlenet", {"batch": 2}),
                                       ("inception_v3", {"batch": 2}), ("wav2vec2", {"batch": 2, "samples": 3000})])
def test_cnn_zoo_matches_onnxruntime(name, dims):
    results, _ = check_model(os.path.join(TINY, f"{name}.onnx"), dims=dims, seed=5)
    assert all(r.ok for r in results), [(r.name, r.rel, r.note) for r in results]


def test_shared_producer_is_materialized_past_the_byte_budget():
    """a = x + y read by two kernels: recomputed in both while small, written once when large
    (passes/fuse.py RECOMPUTE_BYTES)."""
    def build(n):
        return model([helper.make_node("Add", ["x", "y"], ["a"]), helper.make_node("Exp", ["a"], ["e"]),
                      helper.make_node("Neg", ["a"], ["z"])],
                     [tinfo("x", shape=[n]), tinfo("y", shape=[n])], [tinfo("e"), tinfo("z")])
    small = grapec.compile(build(1024), targets=[]).manifest["buckets"][0]["steps"]
    large = grapec.compile(build(1 << 20), targets=[]).manifest["buckets"][0]["steps"]
    assert small == {"kernel": 2} and large == {"kernel": 3}, (small, large)


def test_inspect_reports_convolutions_as_cudnn_with_their_epilogue():
    b = grapec.compile(conv_model(CASES[0], relu_chain=True), targets=[])
    rows = [r for r in b.manifest["buckets"][0]["fusion_report"] if r["kind"] == "gemm"]
    assert [r["scheme"] for r in rows] == ["cuDNN convolution, NHWC + epilogue (bias, relu)", "cuDNN convolution, NHWC"]
    assert all(r["us"] > 0 for r in rows)


@pytest.mark.parametrize("name,pooling", [("googlenet", ("MaxPool",)), ("inception_v3", ("MaxPool", "AveragePool"))])
def test_a_concatenation_several_convolutions_read_is_stored_once(name, pooling):
    """Each Inception module's Concat is written once (NHWC) and read in place by the convolutions
    and pools of the next module, not copied once for each of them (passes/fuse.py: a copy into a
    library operand does not inline a producer that others read too)."""
    path = os.path.join(TINY, f"{name}.onnx")
    ops = [n.op_type for n in onnx.load(path).graph.node]
    steps = grapec.compile(path, dims={"batch": 4}, targets=[]).manifest["buckets"][0]["steps"]
    kernels_at_most = ops.count("Concat") + sum(ops.count(p) for p in pooling) + 6   # + input copy, head, classifier
    assert steps["kernel"] <= kernels_at_most, (steps, kernels_at_most)


@pytest.mark.no_round_trip("the tampered bundle is refused on purpose")
def test_a_conv_step_whose_attributes_do_not_give_its_output_is_refused_on_load():
    from grapec.bundle.format import Bundle
    from grapec.errors import BundleError
    b = grapec.compile(conv_model(CASES[0]), targets=[])
    step = next(st for st in b.plans[0].steps if st.op == "library")
    step.attrs["pads"] = [9, 9, 9, 9]
    with pytest.raises(BundleError, match="conv of x"):
        Bundle.from_bytes(b.to_bytes())
    del step.attrs["pads"]
    with pytest.raises(BundleError, match="malformed conv step"):
        Bundle.from_bytes(b.to_bytes())


def test_a_norm_between_convolutions_computes_its_statistics_once_per_channel(tmp_path):
    """Wav2Vec2's feature extractor: Conv1d -> InstanceNormalization (GroupNorm of one channel a group)
    -> activation -> Conv1d. The next convolution reads channels-last, so the kernel before it
    iterates channels innermost; the norm's statistics (over time, per channel) must not be fused into
    that kernel, where every element would recompute its channel's (passes/fuse.py). Before the fix
    that step was estimated at 357 us and took 70 ms at full size on an H100."""
    rng = np.random.default_rng(3)
    c, t = 32, 16000
    w1 = (rng.standard_normal((c, 1, 10)) * 0.3).astype(np.float32)
    w2 = (rng.standard_normal((c, c, 3)) * 0.1).astype(np.float32)
    inits = [onnx.numpy_helper.from_array(a, n) for a, n in
             ((w1, "w1"), (w2, "w2"), (rng.standard_normal(c).astype(np.float32), "s"),
              (rng.standard_normal(c).astype(np.float32), "b"))]
    m = model([helper.make_node("Conv", ["x", "w1"], ["c1"], kernel_shape=[10], strides=[5]),
               helper.make_node("InstanceNormalization", ["c1", "s", "b"], ["n"]),
               helper.make_node("Relu", ["n"], ["r"]),
               helper.make_node("Conv", ["r", "w2"], ["y"], kernel_shape=[3], strides=[2])],
              [tinfo("x", shape=[1, 1, t])], [tinfo("y")], inits)
    b = grapec.compile(m, targets=[])
    report = b.manifest["buckets"][0]["fusion_report"]
    norm = [r for r in report if r["kind"] == "kernel" and r["bound"] == "serial loop"]
    assert norm and max(r["us"] for r in norm) < 20, [(r["ops"], r["us"], r["mapping"]) for r in report]
    path = str(tmp_path / "norm.onnx")
    onnx.save(m, path)
    results, _ = check_model(path, seed=4)
    assert all(r.ok for r in results), [(r.name, r.rel, r.max_abs, r.note) for r in results]


def test_a_shortcut_add_and_relu_fold_into_the_convolution(tmp_path):
    """The residual add and ReLU after a block's second convolution become cuDNN's epilogue (conv +
    bias + residual, ReLU; passes/epilogue.py), and the model still matches onnxruntime."""
    m = residual_blocks_model()
    b = grapec.compile(m, targets=[])
    schemes = [r["scheme"] for r in b.manifest["buckets"][0]["fusion_report"] if r["kind"] == "gemm"]
    assert "cuDNN convolution, NHWC + epilogue (bias, residual, relu)" in schemes, schemes
    check_conv(tmp_path, m)
