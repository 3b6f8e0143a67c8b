"""onnxruntime's com.microsoft ops (frontend/contrib.py): each op alone, against onnxruntime's own
CPU kernels on random inputs, then the models its tools write."""
import numpy as np
import pytest
from onnx import TensorProto as TP, helper

import grapec
from grapec.bundle.format import Bundle
from helpers import init, ort_run, rel_err, tinfo

MS = "com.microsoft"
rng = np.random.default_rng(0)


def ms_model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)])
    m.ir_version = 8
    return m


def run_both(m, feeds, atol=1e-4, rtol=1e-3):
    b = grapec.compile(m, shapes={k: v.shape for k, v in feeds.items()}, targets=[])
    got = grapec.load(Bundle.from_bytes(b.to_bytes())).run(feeds)
    want = ort_run(m, feeds)
    for name, ref in want.items():
        if np.issubdtype(ref.dtype, np.integer):
            # 1 step at most: onnxruntime's integer kernels (MLAS) scale in fixed point, grapec in
            # float32 as DequantizeLinear/QuantizeLinear define it, so values near a half step can
            # round the other way (6% of QLinearAdd's elements here; none is off by 2)
            diff = np.abs(got[name].astype(np.int64) - ref.astype(np.int64))
            assert diff.max(initial=0) <= 1, (name, diff.max())
            assert np.mean(diff > 0) < 0.1, (name, np.mean(diff > 0))
        else:
            np.testing.assert_allclose(got[name], ref, atol=atol, rtol=rtol, err_msg=name)
            assert rel_err(got[name], ref) < 1e-4 or np.abs(ref).max() == 0, (name, rel_err(got[name], ref))
    return got, want


def f32(*shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


@pytest.mark.parametrize("op,attrs,extra", [
    ("Gelu", {}, []), ("BiasGelu", {}, ["bias"]), ("FastGelu", {}, []), ("FastGelu", {}, ["bias"]),
    ("QuickGelu", {"alpha": 1.5}, []), ("QuickGelu", {}, []),
])
def test_activations(op, attrs, extra):
    x = f32(2, 5, 16)
    inits = [init("bias", f32(16))] if extra else []
    m = ms_model([helper.make_node(op, ["x"] + extra, ["y"], domain=MS, **attrs)], [tinfo("x", shape=[2, 5, 16])],
                 [tinfo("y")], inits)
    run_both(m, {"x": x})


@pytest.mark.parametrize("op", ["BiasAdd", "BiasSoftmax"])
def test_ops_onnxruntime_runs_on_gpus_only(op):
    """No CPU kernel in onnxruntime: checked against their definitions (X + bias + skip; softmax
    over `axis` of data + bias)."""
    x, bias, skip = f32(2, 4, 8), f32(8), f32(2, 4, 8)
    if op == "BiasAdd":
        node = helper.make_node(op, ["x", "bias", "skip"], ["y"], domain=MS)
        want = x + bias + skip
    else:
        node = helper.make_node(op, ["x", "bias"], ["y"], domain=MS, axis=-1)
        e = np.exp(x + bias - (x + bias).max(-1, keepdims=True))
        want = e / e.sum(-1, keepdims=True)
    m = ms_model([node], [tinfo("x", shape=[2, 4, 8]), tinfo("skip", shape=[2, 4, 8])], [tinfo("y")], [init("bias", bias)])
    b = grapec.compile(m, shapes={"x": x.shape, "skip": skip.shape}, targets=[])
    got = grapec.load(b).run({"x": x, "skip": skip})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("with_beta,with_bias,all_outputs", [(True, True, True), (False, False, False), (True, False, False)])
def test_skip_layer_normalization(with_beta, with_bias, all_outputs):
    ins = ["x", "skip", "gamma", "beta" if with_beta else "", "bias" if with_bias else ""]
    outs = ["y", "", "", "sum"] if all_outputs else ["y"]
    inits = [init("gamma", f32(32)), init("beta", f32(32)), init("bias", f32(32))]
    m = ms_model([helper.make_node("SkipLayerNormalization", ins, outs, domain=MS, epsilon=1e-5)],
                 [tinfo("x", shape=[2, 7, 32]), tinfo("skip", shape=[2, 7, 32])],
                 [tinfo(o) for o in outs if o], inits)
    run_both(m, {"x": f32(2, 7, 32, scale=3), "skip": f32(2, 7, 32)})


def test_skip_simplified_layer_normalization():
    m = ms_model([helper.make_node("SkipSimplifiedLayerNormalization", ["x", "skip", "gamma"], ["y"], domain=MS,
                                   epsilon=1e-6)],
                 [tinfo("x", shape=[2, 3, 16]), tinfo("skip", shape=[2, 3, 16])], [tinfo("y")], [init("gamma", f32(16))])
    run_both(m, {"x": f32(2, 3, 16), "skip": f32(2, 3, 16)})


def test_simplified_layer_normalization_in_the_onnx_domain():
    m = ms_model([helper.make_node("SimplifiedLayerNormalization", ["x", "gamma"], ["y"], epsilon=1e-6, axis=-1)],
                 [tinfo("x", shape=[2, 3, 16])], [tinfo("y")], [init("gamma", f32(16))])
    run_both(m, {"x": f32(2, 3, 16)})


@pytest.mark.parametrize("segments,mask,position_ids", [(True, True, False), (False, False, False), (True, True, True)])
def test_embed_layer_normalization(segments, mask, position_ids):
    b, s, h, vocab = 2, 6, 16, 50
    ins = ["ids", "seg" if segments else "", "word", "pos", "segemb" if segments else "", "gamma", "beta",
           "mask" if mask else "", "pos_ids" if position_ids else ""]
    inputs = [tinfo("ids", TP.INT32, [b, s])] + ([tinfo("seg", TP.INT32, [b, s])] if segments else []) \
        + ([tinfo("mask", TP.INT32, [b, s])] if mask else []) + ([tinfo("pos_ids", TP.INT32, [b, s])] if position_ids else [])
    inits = [init("word", f32(vocab, h)), init("pos", f32(16, h)), init("segemb", f32(2, h)), init("gamma", f32(h)),
             init("beta", f32(h))]
    m = ms_model([helper.make_node("EmbedLayerNormalization", ins, ["y", "mask_index", "sum"], domain=MS, epsilon=1e-12)],
                 inputs, [tinfo("y"), tinfo("mask_index", TP.INT32), tinfo("sum")], [i for i in inits if i.name in ins])
    feeds = {"ids": rng.integers(0, vocab, (b, s)).astype(np.int32)}
    if segments:
        feeds["seg"] = rng.integers(0, 2, (b, s)).astype(np.int32)
    if mask:
        feeds["mask"] = np.array([[1] * s, [1] * 4 + [0] * 2], np.int32)
    if position_ids:
        feeds["pos_ids"] = rng.integers(0, 16, (b, s)).astype(np.int32)
    run_both(m, feeds)


def _attention_model(mask_shape=None, unidirectional=0, past=False, qkv_sizes=None, bias=True, heads=4, hidden=32):
    ins = ["x", "w", "b" if bias else "", "mask" if mask_shape else "", "past" if past else ""]
    inputs = [tinfo("x", shape=[2, 5, hidden])]
    if mask_shape:
        inputs.append(tinfo("mask", TP.INT32, mask_shape))
    if past:
        inputs.append(tinfo("past", shape=[2, 2, heads, 3, hidden // heads]))
    total = sum(qkv_sizes) if qkv_sizes else 3 * hidden
    attrs = {"num_heads": heads, "unidirectional": unidirectional}
    if qkv_sizes:
        attrs["qkv_hidden_sizes"] = qkv_sizes
    outs = ["y", "present"] if past else ["y"]
    while not ins[-1]:
        ins.pop()
    return ms_model([helper.make_node("Attention", ins, outs, domain=MS, **attrs)], inputs,
                    [tinfo(o) for o in outs], [init("w", f32(hidden, total, scale=0.3)), init("b", f32(total))][:2 if bias else 1])


@pytest.mark.parametrize("case", ["plain", "mask_1d", "mask_2d", "mask_3d", "causal", "past_causal", "no_bias", "qkv_sizes"])
def test_attention(case):
    kw = {"plain": {}, "mask_1d": {"mask_shape": [2]}, "mask_2d": {"mask_shape": [2, 5]}, "mask_3d": {"mask_shape": [2, 5, 5]},
          "causal": {"unidirectional": 1}, "past_causal": {"past": True, "unidirectional": 1}, "no_bias": {"bias": False},
          "qkv_sizes": {"qkv_sizes": [32, 32, 16]}}[case]
    m = _attention_model(**kw)
    feeds = {"x": f32(2, 5, 32)}
    if "mask_shape" in kw:
        feeds["mask"] = {1: np.array([5, 3], np.int32), 2: np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], np.int32),
                         3: (rng.random((2, 5, 5)) > 0.3).astype(np.int32)}[len(kw["mask_shape"])]
        if len(kw["mask_shape"]) == 3:
            feeds["mask"][:, :, 0] = 1
    if kw.get("past"):
        feeds["past"] = f32(2, 2, 4, 3, 8)
    if case == "no_bias":   # onnxruntime's CPU kernel crashes without a bias: compare with a zero one
        with_zeros = _attention_model()
        with_zeros.graph.initializer[0].CopyFrom(m.graph.initializer[0])
        with_zeros.graph.initializer[1].CopyFrom(init("b", np.zeros(96, np.float32)))
        got = grapec.load(grapec.compile(m, shapes={"x": (2, 5, 32)}, targets=[])).run(feeds)["y"]
        np.testing.assert_allclose(got, ort_run(with_zeros, feeds)["y"], atol=1e-4, rtol=1e-3)
        return
    run_both(m, feeds)


@pytest.mark.parametrize("case", ["self", "cross_bias_mask", "past"])
def test_multi_head_attention(case):
    b, s, t, d, heads = 2, 4, 6 if case != "self" else 4, 16, 2
    ins = ["q", "k", "v", "bias" if case == "cross_bias_mask" else "", "kpm" if case == "cross_bias_mask" else "",
           "", "pk" if case == "past" else "", "pv" if case == "past" else ""]
    inputs = [tinfo("q", shape=[b, s, d]), tinfo("k", shape=[b, t, d]), tinfo("v", shape=[b, t, d])]
    feeds = {"q": f32(b, s, d), "k": f32(b, t, d), "v": f32(b, t, d)}
    inits = []
    if case == "cross_bias_mask":
        inputs.append(tinfo("kpm", TP.INT32, [b, t]))
        feeds["kpm"] = np.array([[1] * t, [1] * 3 + [0] * (t - 3)], np.int32)
        inits.append(init("bias", f32(3 * d)))
    outs = ["y"]
    if case == "past":
        inputs += [tinfo("pk", shape=[b, heads, 3, d // heads]), tinfo("pv", shape=[b, heads, 3, d // heads])]
        feeds.update(pk=f32(b, heads, 3, d // heads), pv=f32(b, heads, 3, d // heads))
        outs = ["y", "present_k", "present_v"]
    while ins and not ins[-1]:
        ins.pop()
    m = ms_model([helper.make_node("MultiHeadAttention", ins, outs, domain=MS, num_heads=heads)], inputs,
                 [tinfo(o) for o in outs], inits)
    run_both(m, feeds)


# --- the quantizer's ops -----------------------------------------------------------------------

def _q(shape, dtype=np.uint8):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


def _q_weights(shape):
    """int8 GEMM weights of 7 bits, as onnxruntime's quantizer makes them for x86 (reduce_range). The
    reference needs it: on a CPU with AVX2 and no VNNI, onnxruntime's u8 x s8 kernels add products
    in pairs into int16 (VPMADDUBSW), which saturates with full-range weights (255 * 127 * 2 > 32767);
    its DynamicQuantizeMatMul was then off by up to 4.7 on such a machine."""
    return rng.integers(-64, 64, shape).astype(np.int8)


@pytest.mark.parametrize("b_zp,bias,per_column", [(True, True, False), (False, False, False), (True, False, True)])
def test_dynamic_quantize_matmul(b_zp, bias, per_column):
    w = _q_weights((16, 8))
    scale = (rng.random(8) * 0.02 + 0.01).astype(np.float32) if per_column else np.float32(0.02)
    inits = [init("w", w), init("ws", scale), init("wz", np.zeros(8 if per_column else (), np.int8)), init("bias", f32(8))]
    ins = ["x", "w", "ws", "wz" if b_zp else "", "bias" if bias else ""]
    m = ms_model([helper.make_node("DynamicQuantizeMatMul", ins, ["y"], domain=MS)], [tinfo("x", shape=[3, 16])],
                 [tinfo("y")], [i for i in inits if i.name in ins])
    run_both(m, {"x": f32(3, 16)}, atol=1e-4, rtol=1e-4)


def test_matmul_integer_to_float():
    inits = [init("w", _q_weights((16, 8))), init("as", np.float32(0.03)), init("ws", np.float32(0.02)),
             init("az", np.uint8(128)), init("wz", np.int8(0)), init("bias", f32(8))]
    m = ms_model([helper.make_node("MatMulIntegerToFloat", ["a", "w", "as", "ws", "az", "wz", "bias"], ["y"], domain=MS)],
                 [tinfo("a", TP.UINT8, [3, 16])], [tinfo("y")], inits)
    run_both(m, {"a": _q((3, 16))}, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("quantized_out,trans_b", [(True, 0), (False, 1)])
def test_qgemm(quantized_out, trans_b):
    w = _q_weights((8, 16) if trans_b else (16, 8))
    inits = [init("as", np.float32(0.05)), init("az", np.uint8(120)), init("w", w), init("ws", np.float32(0.02)),
             init("wz", np.int8(0)), init("c", rng.integers(-500, 500, 8).astype(np.int32)),
             init("ys", np.float32(0.1)), init("yz", np.uint8(128))]
    ins = ["a", "as", "az", "w", "ws", "wz", "c"] + (["ys", "yz"] if quantized_out else [])
    m = ms_model([helper.make_node("QGemm", ins, ["y"], domain=MS, transB=trans_b, alpha=1.0)],
                 [tinfo("a", TP.UINT8, [4, 16])], [tinfo("y", TP.UINT8 if quantized_out else TP.FLOAT)],
                 [i for i in inits if i.name in ins])
    run_both(m, {"a": _q((4, 16))}, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
def test_qlinear_binary(op):
    inits = [init("as", np.float32(0.05)), init("az", np.uint8(100)), init("bs", np.float32(0.04)),
             init("bz", np.uint8(130)), init("cs", np.float32(0.1)), init("cz", np.uint8(128))]
    m = ms_model([helper.make_node(op, ["a", "as", "az", "b", "bs", "bz", "cs", "cz"], ["y"], domain=MS)],
                 [tinfo("a", TP.UINT8, [2, 3, 8]), tinfo("b", TP.UINT8, [8])], [tinfo("y", TP.UINT8)], inits)
    run_both(m, {"a": _q((2, 3, 8)), "b": _q((8,))})


@pytest.mark.parametrize("op,attrs", [("QLinearSigmoid", {}), ("QLinearLeakyRelu", {"alpha": 0.1})])
def test_qlinear_unary(op, attrs):
    inits = [init("xs", np.float32(0.05)), init("xz", np.int8(3)), init("ys", np.float32(0.01)), init("yz", np.int8(-5))]
    m = ms_model([helper.make_node(op, ["x", "xs", "xz", "ys", "yz"], ["y"], domain=MS, **attrs)],
                 [tinfo("x", TP.INT8, [4, 8])], [tinfo("y", TP.INT8)], inits)
    run_both(m, {"x": _q((4, 8), np.int8)})


def test_qlinear_concat():
    inits = [init("ys", np.float32(0.1)), init("yz", np.uint8(128)), init("s1", np.float32(0.05)), init("z1", np.uint8(120)),
             init("s2", np.float32(0.2)), init("z2", np.uint8(10))]
    m = ms_model([helper.make_node("QLinearConcat", ["ys", "yz", "a", "s1", "z1", "b", "s2", "z2"], ["y"], domain=MS,
                                   axis=1)],
                 [tinfo("a", TP.UINT8, [2, 3]), tinfo("b", TP.UINT8, [2, 5])], [tinfo("y", TP.UINT8)], inits)
    run_both(m, {"a": _q((2, 3)), "b": _q((2, 5))})


@pytest.mark.parametrize("channels_last", [0, 1])
def test_qlinear_pools(channels_last):
    inits = [init("xs", np.float32(0.05)), init("xz", np.uint8(120)), init("ys", np.float32(0.04)), init("yz", np.uint8(128))]
    shape = [1, 6, 6, 4] if channels_last else [1, 4, 6, 6]
    nodes = [helper.make_node("QLinearGlobalAveragePool", ["x", "xs", "xz", "ys", "yz"], ["g"], domain=MS,
                              channels_last=channels_last),
             helper.make_node("QLinearAveragePool", ["x", "xs", "xz", "ys", "yz"], ["p"], domain=MS,
                              channels_last=channels_last, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                              count_include_pad=0)]
    m = ms_model(nodes, [tinfo("x", TP.UINT8, shape)], [tinfo("g", TP.UINT8), tinfo("p", TP.UINT8)], inits)
    run_both(m, {"x": _q(shape)})


def test_an_unsupported_form_is_named_with_its_node():
    m = ms_model([helper.make_node("MultiHeadAttention", ["q"], ["y"], domain=MS, num_heads=2, name="packed")],
                 [tinfo("q", shape=[1, 4, 2, 3, 8])], [tinfo("y")])
    from grapec.errors import UnsupportedError
    with pytest.raises(UnsupportedError, match="node 'packed' \\(MultiHeadAttention, domain com.microsoft\\): packed QKV"):
        grapec.compile(m, shapes={"q": (1, 4, 2, 3, 8)}, targets=[])


@pytest.mark.parametrize("case", [{}, {"mask_shape": [2, 5]}, {"unidirectional": 1}])
def test_contrib_attention_meets_the_fused_attention_kernel(case):
    """Rewritten as exporters write attention, so in half precision the three steps (scores, softmax,
    probabilities @ V) become one flash-attention kernel, as they do for a torch export."""
    m = _attention_model(**case)
    b = grapec.compile(m, shapes={"x": (2, 5, 32), **({"mask": (2, 5)} if "mask_shape" in case else {})},
                       precision="fp16", targets=[])
    kinds = [b.kernels[st.kernel].get("kind") for st in b.plans[0].steps if st.op == "kernel"]
    assert kinds.count("attention") == 1, kinds
    assert not any(st.op == "library" for st in b.plans[0].steps)
    feeds = {"x": f32(2, 5, 32)}
    if "mask_shape" in case:
        feeds["mask"] = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], np.int32)
    got = grapec.load(Bundle.from_bytes(b.to_bytes())).run(feeds)["y"]
    assert rel_err(got, ort_run(m, feeds)["y"]) < 1e-2


@pytest.mark.parametrize("x_shape, pos_shape, interleaved, rotary_dim", [
    ([2, 5, 32], [2, 5], 0, 0), ([2, 5, 32], [1], 0, 0), ([2, 5, 32], [1], 1, 0),
    ([2, 2, 5, 16], [2, 5], 0, 0), ([2, 2, 5, 16], [1], 1, 0), ([2, 5, 32], [2, 5], 0, 8)])
def test_rotary_embedding(x_shape, pos_shape, interleaved, rotary_dim):
    """Positions per row, or one offset for all rows (position_ids of one element); rotated halves or
    interleaved pairs; all of each head, or its first rotary_embedding_dim features."""
    head = x_shape[-1] if len(x_shape) == 4 else x_shape[-1] // 2
    half = (rotary_dim or head) // 2
    angles = rng.random((32, half)) * 3
    attrs = {"interleaved": interleaved}
    if len(x_shape) == 3:
        attrs["num_heads"] = 2
    if rotary_dim:
        attrs["rotary_embedding_dim"] = rotary_dim
    node = helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain=MS, **attrs)
    m = ms_model([node], [tinfo("x", shape=x_shape), tinfo("pos", TP.INT64, pos_shape)], [tinfo("y")],
                 [init("cos", np.cos(angles).astype(np.float32)), init("sin", np.sin(angles).astype(np.float32))])
    pos = np.array([3]) if pos_shape == [1] else rng.integers(0, 32, pos_shape)
    run_both(m, {"x": f32(*x_shape), "pos": pos.astype(np.int64)})


def _gqa_model(B, S, P, heads, kv_heads, head, total, rotary=False, packed=False, window=-1, interleaved=0, elem=TP.FLOAT):
    """total_sequence_length is a constant here, as onnxruntime-genai's builder derives it from the
    attention mask's shape: the present's length, max(P, total), depends on its value."""
    names = ["q", "" if packed else "k", "" if packed else "v", "pk" if P else "", "pv" if P else "", "seqlens", "total"]
    node = helper.make_node("GroupQueryAttention", names + (["cos", "sin"] if rotary else []), ["y", "present_k", "present_v"],
                            domain=MS, name="gqa", num_heads=heads, kv_num_heads=kv_heads, do_rotary=int(rotary),
                            rotary_interleaved=interleaved, local_window_size=window)
    inputs = [tinfo("q", elem, [B, S, (heads + 2 * kv_heads) * head if packed else heads * head])]
    if not packed:
        inputs += [tinfo("k", elem, [B, S, kv_heads * head]), tinfo("v", elem, [B, S, kv_heads * head])]
    if P:
        inputs += [tinfo("pk", elem, [B, kv_heads, P, head]), tinfo("pv", elem, [B, kv_heads, P, head])]
    inputs += [tinfo("seqlens", TP.INT32, [B])]
    if rotary:
        inputs += [tinfo("cos", elem, [64, head // 2]), tinfo("sin", elem, [64, head // 2])]
    outputs = [tinfo("y", elem), tinfo("present_k", elem), tinfo("present_v", elem)]
    return ms_model([node], inputs, outputs, [init("total", np.array(total, np.int32))]), inputs


@pytest.mark.parametrize("case", [
    dict(B=2, S=1, P=4, rows=[4, 4]),                       # decode
    dict(B=3, S=1, P=6, rows=[6, 2, 4], rotary=True),       # decode, rows of their own lengths
    dict(B=1, S=3, P=4, rows=[6], rotary=True, interleaved=1),   # a chunk of prompt after a past
    dict(B=2, S=3, P=0, rows=[2, 1], rotary=True),          # first prompt, right-padded
    dict(B=2, S=3, P=0, rows=[2, 2], rotary=True, packed=True),
    dict(B=1, S=4, P=4, rows=[7], window=3),
    dict(B=2, S=1, P=4, rows=[4, 3], rotary=True, half=True),
    dict(B=2, S=1, P=8, rows=[4, 2], rotary=True)])                # a past buffer longer than the total
def test_group_query_attention(case):
    """onnxruntime-genai's decoder attention against onnxruntime's CPU kernel: 4 query heads on 2 key/value
    heads, the present caches included (onnxruntime's CPU kernel wants heads of a multiple of 16)."""
    case = dict(case)
    rows, half = case.pop("rows"), case.pop("half", False)
    dt = np.float16 if half else np.float32
    m, inputs = _gqa_model(heads=4, kv_heads=2, head=16, total=max(rows) + 1, elem=TP.FLOAT16 if half else TP.FLOAT, **case)
    feeds = {}
    for i in inputs:
        shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
        feeds[i.name] = rng.standard_normal(shape).astype(dt)
    angles = rng.random((64, 8)) * 3
    feeds["seqlens"] = np.array(rows, np.int32)
    if case.get("rotary"):
        feeds.update(cos=np.cos(angles).astype(dt), sin=np.sin(angles).astype(dt))
    b = grapec.compile(m, targets=[])
    got = grapec.load(Bundle.from_bytes(b.to_bytes())).run(feeds)
    for name, want in ort_run(m, feeds).items():
        g, w = got[name].astype(np.float64), want.astype(np.float64)
        assert g.shape == w.shape, (name, g.shape, w.shape)
        # half: softmax and both products round to half at other points than onnxruntime's kernel
        limit, atol = (1e-6, 1e-5) if not half else (1e-3, 2e-3)
        assert rel_err(g, w) < limit, (name, rel_err(g, w))
        np.testing.assert_allclose(g, w, atol=atol, rtol=1e-3, err_msg=name)


def test_group_query_attention_refuses_what_it_does_not_take():
    from grapec.errors import UnsupportedError
    m, _ = _gqa_model(B=1, S=1, P=2, heads=4, kv_heads=2, head=16, total=3)
    m.graph.node[0].attribute.append(helper.make_attribute("softcap", 30.0))
    with pytest.raises(UnsupportedError, match=r"node 'gqa' \(GroupQueryAttention, domain com.microsoft\): softcap"):
        grapec.compile(m, targets=[])
