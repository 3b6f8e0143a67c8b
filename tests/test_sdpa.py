"""Fused attention through cuDNN's SDPA (passes/sdpa.py, ir/library.py sdpa, runtime/cuda/dnn.py).

The score's form decides whether cuDNN can take it; the cost model decides whether it should; the
CPU backend runs the `sdpa` step's numpy semantics, which the GPU's cuDNN graph is checked against
(marker gpu), and both against a float64 reference and onnxruntime."""
import os

import numpy as np
import pytest

import grapec
from grapec.bundle.format import Bundle
from grapec.errors import UnsupportedError
from grapec.ir import kernel as K
from grapec.passes.sdpa import split_score
from helpers import rel_err
from test_attention import assert_close, attention_model, inputs_for, reference

ZOO = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models", "tiny")
SHAPE = (2, 4, 8, 8)


def _score(body):
    return K.Kernel(SHAPE, "float32", body, ((SHAPE, "float16"), ((2, 1, 8, 8), "float16")))


def _raw():
    return K.load(0, tuple(K.idx(a) for a in range(4)), "float16")


def _mask():
    return K.load(1, (K.idx(0), K.const(0, "int64"), K.idx(2), K.idx(3)), "float16")


def test_the_score_forms_cudnn_takes_and_those_it_does_not():
    half = K.const(0.125, "float16")
    assert split_score(_score(K.cast(_raw() * half + _mask(), "float32"))) == (0.125, _mask())
    assert split_score(_score(K.cast(_mask() + _raw(), "float32"))) == (1.0, _mask())
    scale, mask = split_score(_score(K.binary("div", K.cast(_raw(), "float32"), K.const(8.0, "float32"))))
    assert (scale, mask) == (0.125, None)
    # the scale after the mask, the product times a tensor, the product twice: not scale * raw + B
    assert split_score(_score(K.cast((_raw() + _mask()) * half, "float32"))) is None
    assert split_score(_score(K.cast(_raw() * _mask(), "float32"))) is None
    assert split_score(_score(K.cast(_raw() * half + _raw(), "float32"))) is None


def test_a_causal_mask_is_recognized_by_its_values():
    from grapec.passes.causal_mask import is_causal
    s, t = 6, 9
    seen = np.arange(t)[None, :] <= np.arange(s)[:, None] + (t - s)   # bottom-right: query i sees keys up to i + 3
    for hidden in (-np.inf, -65504.0, -1e4):
        assert is_causal(np.where(seen, 0.0, hidden)[None, None].repeat(2, axis=0))
    assert not is_causal(np.where(seen, 0.0, -100.0))                       # softmax still sees it
    top_left = np.arange(t)[None, :] <= np.arange(s)[:, None]
    assert not is_causal(np.where(top_left, 0.0, -np.inf))                  # another band
    assert not is_causal(np.zeros((s, t)))                                  # hides nothing
    varied = np.where(seen, 0.0, -np.inf)[None].repeat(2, axis=0)
    varied[1, 0, 1] = -np.inf                                               # one batch hides more
    assert not is_causal(varied)
    assert not is_causal(np.where(seen, 0.5, -np.inf))                      # a bias on the seen keys


def _steps(bundle, op):
    return [st for st in bundle.plans[0].steps if st.op == "library" and st.attrs.get("op") == op]


@pytest.mark.parametrize("mask", [None, "additive", "causal"])
def test_sdpa_step_matches_the_reference_on_the_cpu_backend(mask):
    """cudnn mode: one sdpa step (BERT's additive mask read in place; a constant causal Where, here
    bottom-right aligned as with 16 cached keys, as cuDNN's causal band: no mask read); the CPU
    backend's numpy semantics match float64."""
    b, h, s, t, d = 2, 4, 24, 40, 32
    feeds = inputs_for(b, h, s, t, d, d, mask, seed=3)
    m = attention_model(b, h, s, t, d, d, mask)
    bundle = grapec.compile(m, shapes={k: v.shape for k, v in feeds.items()}, targets=[], attention="cudnn")
    bundle = Bundle.from_bytes(bundle.to_bytes())
    (step,) = _steps(bundle, "sdpa")
    assert step.attrs["dims"] == [b, h, s, t, d, d] and step.attrs["scale"] == pytest.approx(1 / np.sqrt(d), rel=1e-3)
    assert ("bias" in step.attrs) == (mask == "additive") and step.attrs.get("causal", False) == (mask == "causal")
    assert len(step.args) == 3 + (mask == "additive")
    got = grapec.load(bundle, backend="cpu").run(feeds)["y"]
    assert_close(got, reference(feeds, mask, s, t, d), f"sdpa {mask}")


def test_auto_takes_the_kernel_at_batch_one_and_cudnn_at_batch_thirty_two():
    """The h100 profile prices both: at 12 heads x 128 the generated kernel (launch-bound), at
    32 x 12 heads cuDNN (arithmetic-bound, half the kernel's time measured)."""
    for b, want in ((1, "kernel"), (32, "sdpa")):
        m = attention_model(b, 12, 128, 128, 64, 64, "additive")
        shapes = {"q": (b, 12, 128, 64), "k": (b, 12, 128, 64), "v": (b, 12, 128, 64), "m": (b, 1, 1, 128)}
        bundle = grapec.compile(m, shapes=shapes, targets=[])
        kinds = [k.get("kind") for k in bundle.kernels]
        assert ("sdpa" if _steps(bundle, "sdpa") else "kernel" if "attention" in kinds else None) == want, b
    never = grapec.compile(m, shapes=shapes, targets=[], attention="kernel")
    assert not _steps(never, "sdpa")


def test_cudnn_mode_says_where_it_cannot_and_strict_refuses():
    m = attention_model(1, 2, 16, 16, 12, 12, None)   # head dim 12: not a multiple of 8
    shapes = {"q": (1, 2, 16, 12), "k": (1, 2, 16, 12), "v": (1, 2, 16, 12)}
    bundle = grapec.compile(m, shapes=shapes, targets=[], attention="cudnn")
    assert not _steps(bundle, "sdpa")
    assert any("not cuDNN: head dimensions 12 and 12" in n for n in bundle.manifest["notes"]), bundle.manifest["notes"]
    with pytest.raises(UnsupportedError, match="head dimensions 12"):
        grapec.compile(m, shapes=shapes, targets=[], attention="cudnn", strict=True)


@pytest.mark.parametrize("name,dims", [("gpt2", {"batch": 3, "seq": 16}), ("bert", {"batch": 2, "seq": 8}),
                                       ("wav2vec2", {"batch": 1, "samples": 1600})])
def test_zoo_models_through_sdpa_match_onnxruntime(name, dims):
    """The exporters' masks: GPT-2's constant causal [B, 1, S, T] as cuDNN's causal band (not read),
    BERT's Where on two boolean masks written by one kernel that both layers share, Wav2Vec2's
    [1, 1, S, T]."""
    from grapec.tools.check import check_model
    path = os.path.join(ZOO, f"{name}.onnx")
    bundle = grapec.compile(path, dims=dims, precision="fp16", targets=[], attention="cudnn")
    assert len(_steps(bundle, "sdpa")) == 2   # two layers
    if name == "gpt2":
        assert all(st.attrs.get("causal") and len(st.args) == 3 for st in _steps(bundle, "sdpa"))
    else:
        masks = {st.args[3] for st in _steps(bundle, "sdpa")}
        assert len(masks) == 1, "the layers read one mask"
    results, _ = check_model(path, dims=dims, precision="fp16", seed=5, attention="cudnn")
    assert all(r.ok for r in results), [(r.name, r.rel) for r in results]


@pytest.mark.gpu
@pytest.mark.parametrize("mask,s", [(None, 128), ("additive", 128), ("causal", 128), ("causal", 48)])
def test_sdpa_on_gpu_matches_the_cpu_backend_and_float64(mask, s):
    b, h, t, d = 8, 12, 128, 64
    feeds = inputs_for(b, h, s, t, d, d, mask, seed=4)
    m = attention_model(b, h, s, t, d, d, mask)
    bundle = grapec.compile(m, shapes={k: v.shape for k, v in feeds.items()}, targets=["sm_90"], attention="cudnn")
    bundle = Bundle.from_bytes(bundle.to_bytes())
    assert _steps(bundle, "sdpa")
    got = grapec.load(bundle, backend="cuda").run(feeds)["y"]
    cpu = grapec.load(bundle, backend="cpu").run(feeds)["y"]
    assert_close(got, reference(feeds, mask, s, t, d), f"cudnn sdpa {mask}")
    assert rel_err(got, cpu) < 2e-3, f"cuda vs cpu backend {rel_err(got, cpu):.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("name,dims", [("gpt2", {"batch": 8, "seq": 64}), ("bert", {"batch": 16, "seq": 64}),
                                       ("wav2vec2", {"batch": 2, "samples": 1600})])
def test_zoo_models_through_sdpa_on_gpu_match_onnxruntime(name, dims):
    from grapec.tools.check import check_model
    results, _ = check_model(os.path.join(ZOO, f"{name}.onnx"), dims=dims, precision="fp16", backend="cuda",
                             seed=6, attention="cudnn")
    assert all(r.ok for r in results), [(r.name, r.rel) for r in results]


def test_a_bundle_of_several_sizes_prices_the_switch_into_cudnns_attention():
    """cuDNN's node has a launch of its own per size, which the runner sets at every switch between
    sizes of one launch structure (cost/model.py NODE_UPDATE_US of host time); the generated kernel's
    reads its sizes from device memory. Where cuDNN wins by less than that (6 x 12 heads x 128 on the
    profile: 15.0 us against 15.6), a bundle of one size takes cuDNN and one of several the kernel;
    where it wins by more (32 x 12 heads: 23.7 against 60.7), both take cuDNN."""
    def shapes(b):
        return {"q": (b, 12, 128, 64), "k": (b, 12, 128, 64), "v": (b, 12, 128, 64), "m": (b, 1, 1, 128)}

    def engines(bundle):
        return ["sdpa" if any(st.op == "library" and st.attrs.get("op") == "sdpa" for st in bundle.plans[i].steps)
                else "kernel" for i in range(len(bundle.plans))]

    m = attention_model(None, 12, 128, 128, 64, 64, "additive")
    assert engines(grapec.compile(m, shapes=shapes(6), targets=[])) == ["sdpa"]
    assert engines(grapec.compile(m, buckets=[shapes(6), shapes(5)], targets=[])) == ["kernel", "kernel"]
    assert engines(grapec.compile(m, buckets=[shapes(32), shapes(31)], targets=[])) == ["sdpa", "sdpa"]


def test_a_range_of_many_sizes_keeps_the_generated_attention_unless_asked():
    """cuDNN builds a plan per size, with device memory of its own (~0.55 MiB, GPT-2 seq 321..512: 102 MiB
    over 192 sizes), and its nodes are set at every switch (12 of them: 43-58 us a switch on an H200). A
    bundle of 16 sizes where cuDNN is priced faster (32 x 12 heads) runs the generated kernel, which
    reads its sizes at run time, and says so; --attention cudnn still takes cuDNN."""
    def shapes(b):
        return {"q": (b, 12, 128, 64), "k": (b, 12, 128, 64), "v": (b, 12, 128, 64), "m": (b, 1, 1, 128)}

    def sdpa_steps(bundle):
        return [sum(st.op == "library" and st.attrs.get("op") == "sdpa" for st in bundle.plans[i].steps)
                for i in range(len(bundle.plans))]

    m = attention_model(None, 12, 128, 128, 64, 64, "additive")
    buckets = [shapes(b) for b in range(17, 33)]
    many = grapec.compile(m, buckets=buckets, targets=[])
    assert sdpa_steps(many) == [0] * 16
    said = [n for n in many.manifest["notes"] if "generated kernel where cuDNN's SDPA is priced faster" in n]
    assert len(said) == 1 and "in a bundle of 16 sizes" in said[0], many.manifest["notes"]
    assert sdpa_steps(grapec.compile(m, buckets=buckets, targets=[], attention="cudnn")) == [1] * 16


def _shape_mask_model(shift: int):
    """Attention whose mask is made from q's length as exporters write a causal mask: positions as the
    running count of ones (a CumSum: a kernel of its own, which fusion does not inline into the score),
    key j visible where its position <= query i's + shift. Shift 0 is the causal band, 1 shows one key more."""
    from onnx import TensorProto, helper
    f16 = TensorProto.FLOAT16
    i64 = lambda name, v: helper.make_tensor(name, TensorProto.INT64, [], [v])  # noqa: E731
    nodes = [helper.make_node("Shape", ["q"], ["qs"]),
             helper.make_node("Gather", ["qs", "two"], ["s"], axis=0),
             helper.make_node("Unsqueeze", ["s", "last"], ["s1"]),
             helper.make_node("ConstantOfShape", ["s1"], ["ones"], value=helper.make_tensor("v", TensorProto.INT64, [1], [1])),
             helper.make_node("CumSum", ["ones", "zero"], ["count"]),
             helper.make_node("Sub", ["count", "one"], ["pos"]),
             helper.make_node("Unsqueeze", ["pos", "last"], ["rows"]),
             helper.make_node("Add", ["rows", "shift"], ["reach"]),
             helper.make_node("LessOrEqual", ["pos", "reach"], ["keep"]),          # [s, s]: j <= i + shift
             helper.make_node("Where", ["keep", "zero_h", "ninf"], ["bias"]),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["qk"]),
             helper.make_node("Mul", ["qk", "scale"], ["scores"]),
             helper.make_node("Add", ["scores", "bias"], ["masked"]),
             helper.make_node("Softmax", ["masked"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    inits = [i64("two", 2), i64("zero", 0), i64("one", 1), i64("shift", shift),
             helper.make_tensor("last", TensorProto.INT64, [1], [-1]),
             helper.make_tensor("zero_h", f16, [], [0.0]), helper.make_tensor("ninf", f16, [], [float("-inf")]),
             helper.make_tensor("scale", f16, [], [0.125])]
    ins = [helper.make_tensor_value_info(n, f16, [1, 4, "s", 64]) for n in "qkv"]
    g = helper.make_graph(nodes, "shape_mask", ins, [helper.make_tensor_value_info("y", f16, [1, 4, "s", 64])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("shift", [0, 1])
def test_a_mask_made_from_the_shapes_is_compared_by_index_only_where_it_is_the_causal_band(shift):
    """A range of sizes keeps a mask made from the shapes computed (each size would store its own). Where
    it is exactly the causal band, the generated attention compares the query and key indices instead:
    its score reads nothing but the product, and the kernels that made the mask are gone. A mask one key
    wider keeps them. Both match float64 at every size."""
    from grapec.ir.kinds import kernel_from_json
    bundle = grapec.compile(_shape_mask_model(shift), dims={}, dynamic={"s": (17, 40)}, targets=[], attention="kernel")
    rng = np.random.default_rng(shift)
    for i, s in enumerate(range(17, 41)):
        steps = bundle.plans[i].steps
        (att,) = [kernel_from_json(bundle.kernels[st.kernel]) for st in steps
                  if st.op == "kernel" and bundle.kernels[st.kernel].get("kind") == "attention"]
        if shift == 0:
            assert att.causal_offset == 0 and len(att.score.inputs) == 1 and len(steps) == 1, (s, len(steps))
        else:
            assert att.causal_offset is None and len(att.score.inputs) == 2 and len(steps) > 1, s
    _check_shape_mask_sizes(grapec.load(bundle, backend="cpu"), shift, rng)


def _check_shape_mask_sizes(sess, shift, rng):
    for s in (17, 29, 40):
        feeds = {n: rng.standard_normal((1, 4, s, 64)).astype(np.float16) for n in "qkv"}
        q, k, v = (feeds[n].astype(np.float64) for n in "qkv")
        x = q @ np.swapaxes(k, -1, -2) * 0.125
        i, j = np.arange(s)[:, None], np.arange(s)[None, :]
        x = np.where(j <= i + shift, x, -np.inf)
        x = np.exp(x - x.max(-1, keepdims=True))
        assert_close(sess.run(feeds)["y"], (x / x.sum(-1, keepdims=True)) @ v, f"shift {shift}, s {s}")


@pytest.mark.gpu
@pytest.mark.parametrize("shift", [0, 1])
def test_a_mask_made_from_the_shapes_runs_right_compared_by_index_on_gpu(shift):
    """The GPU kernel of the range above: shift 0's score compares indices and skips the key tiles past the
    band, shift 1's reads its mask; both against float64 at three sizes of one range."""
    bundle = grapec.compile(_shape_mask_model(shift), dims={}, dynamic={"s": (17, 40)}, attention="kernel")
    _check_shape_mask_sizes(grapec.load(bundle, backend="cuda"), shift, np.random.default_rng(10 + shift))


def test_gpt2s_causal_mask_is_compared_by_index_at_every_size_of_a_range():
    """GPT-2's exporter makes its causal mask from the shapes (Range, CumSum, GatherND, Where): folded where
    one size is compiled, computed in a range. Either way the attention compares indices, and the range's
    plans have the single size's steps, not a mask's kernels more; outputs match onnxruntime."""
    import onnxruntime as ort
    from grapec.ir.kinds import kernel_from_json
    path = os.path.join(ZOO, "gpt2.onnx")
    ranged = grapec.compile(path, dims={"batch": 1}, dynamic={"seq": (2, 24)}, precision="fp16", targets=[])
    for n in (2, 11, 24):
        plan = ranged.plans[n - 2]
        att = [kernel_from_json(ranged.kernels[st.kernel]) for st in plan.steps
               if st.op == "kernel" and ranged.kernels[st.kernel].get("kind") == "attention"]
        assert len(att) == 2 and all(k.causal_offset == 0 and len(k.score.inputs) == 1 for k in att), n
        single = grapec.compile(path, dims={"batch": 1, "seq": n}, precision="fp16", targets=[])
        assert len(plan.steps) == len(single.plans[0].steps), n
    sess = grapec.load(ranged, backend="cpu")
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(7)
    for n in rng.permutation(np.arange(2, 25))[:4]:
        ids = rng.integers(0, 256, (1, int(n))).astype(np.int64)
        got, want = sess.run({"input_ids": ids})["logits"], ref.run(None, {"input_ids": ids})[0]
        assert rel_err(got.astype(np.float64), want) < 1e-2 and np.allclose(got, want, atol=5e-2, rtol=5e-2), n


def test_a_batch_of_one_mask_is_evaluated_once(monkeypatch):
    """A mask made from the shapes is [batch, 1, S, T]: the same S x T band per batch index. The cone is
    evaluated once where every slice must be equal (causal_mask.same_along_axis0), so a batch of 48 at 64 tokens
    (196608 elements) is checked within a budget of 32768 elements; a kernel reading its first index
    other than to pick an input's first index, or an input whose slices differ, is evaluated whole."""
    from grapec.ir.kinds import kernel_from_json
    from grapec.passes import causal_mask
    monkeypatch.setattr(causal_mask, "CONE_ELEMENTS", 1 << 15)
    path = os.path.join(ZOO, "gpt2.onnx")
    bundle = grapec.compile(path, dims={}, dynamic={"batch": (47, 48), "seq": (63, 64)}, precision="fp16", targets=[])
    for plan in bundle.plans:
        att = [kernel_from_json(bundle.kernels[st.kernel]) for st in plan.steps
               if st.op == "kernel" and bundle.kernels[st.kernel].get("kind") == "attention"]
        assert att and all(k.causal_offset == 0 and len(k.score.inputs) == 1 for k in att)

    shape = (3, 1, 4, 4)
    same = np.broadcast_to(np.arange(16.0).reshape(1, 1, 4, 4), shape)
    differs = same + np.arange(3.0).reshape(3, 1, 1, 1)
    at = tuple(K.idx(a) for a in range(4))
    load = K.load(0, at, "float32")

    def kernel(body):
        return K.Kernel(shape, "float32", body, ((shape, "float32"),))
    assert causal_mask.same_along_axis0(kernel(load), [same])
    assert not causal_mask.same_along_axis0(kernel(load), [differs])
    batch_index = K.cast(K.idx(0), "float32")
    assert not causal_mask.same_along_axis0(kernel(K.binary("add", load, batch_index)), [same])
    picked = K.load(0, (K.binary("sub", K.const(2, "int64"), K.idx(0)), *at[1:]), "float32")   # any first index
    assert causal_mask.same_along_axis0(kernel(picked), [same])
