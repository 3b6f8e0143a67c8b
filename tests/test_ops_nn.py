"""ops/nn.py, conv.py and pool.py against onnxruntime on fresh random inputs: Conv/ConvTranspose (Library nodes),
pooling (kernel IR), Einsum, TopK, integer matmul/conv, Attention and RotaryEmbedding."""
import numpy as np
import pytest
from onnx import TensorProto, helper

from helpers import compile_and_run, init, model, ort_run, rel_err, tinfo

F32, I64 = TensorProto.FLOAT, TensorProto.INT64


def run_both(op, inputs, attrs=None, consts=(), out_types=(F32,), opset=23):
    """A one-node model: `inputs` is an ordered list of (name, array or None); names in `consts`
    become initializers, None an absent optional input. Returns (grapec outputs, ort outputs)."""
    names = [n if a is not None else "" for n, a in inputs]
    outs = [f"y{i}" for i in range(len(out_types))]
    node = helper.make_node(op, names, outs, **(attrs or {}))
    feeds = {n: a for n, a in inputs if a is not None and n not in consts}
    inits = [init(n, a) for n, a in inputs if a is not None and n in consts]
    m = model([node], [tinfo(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in feeds.items()],
              [tinfo(o, t) for o, t in zip(outs, out_types)], inits, opset=opset)
    got, _ = compile_and_run(m, feeds)
    ref = ort_run(m, feeds)
    return [got[o] for o in outs], [ref[o] for o in outs]


def assert_close(got, ref, rtol=1e-5, atol=1e-6):
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype and g.shape == r.shape, (g.dtype, g.shape, r.dtype, r.shape)
        if np.issubdtype(r.dtype, np.integer):
            np.testing.assert_array_equal(g, r)
            continue
        assert rel_err(g, r) <= rtol, rel_err(g, r)
        assert np.abs(g.astype(np.float64) - r).max(initial=0) <= atol + rtol * np.abs(r).max(initial=0)


def rand(*shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).uniform(-2, 2, shape).astype(dtype)


# --- convolution ----------------------------------------------------------------------------------

CONVS = [
    ((1, 3, 11), (4, 3, 3), {"pads": [1, 2], "strides": [2]}),
    ((2, 4, 9, 10), (6, 2, 3, 3), {"group": 2, "dilations": [2, 1], "pads": [1, 0, 2, 1]}),
    ((1, 3, 8, 7), (5, 3, 3, 2), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 3, 8, 7), (5, 3, 3, 2), {"auto_pad": "SAME_LOWER", "strides": [2, 3]}),
    ((1, 2, 5, 6, 7), (3, 2, 2, 3, 2), {"auto_pad": "VALID", "strides": [1, 2, 1]}),
    ((2, 4, 7, 7), (4, 1, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}),
]


@pytest.mark.parametrize("xs,ws,attrs", CONVS)
@pytest.mark.parametrize("bias", [False, True])
def test_conv(xs, ws, attrs, bias):
    b = rand(ws[0], seed=3) if bias else None
    got, ref = run_both("Conv", [("x", rand(*xs, seed=1)), ("w", rand(*ws, seed=2)), ("b", b)], attrs,
                        consts={"w", "b"})
    assert_close(got, ref)


CONV_TRANSPOSES = [
    ((1, 3, 5), (3, 2, 3), {"strides": [2], "pads": [1, 0]}),
    ((2, 4, 4, 5), (4, 3, 3, 2), {"group": 2, "strides": [2, 1], "output_padding": [1, 0], "dilations": [1, 2]}),
    ((1, 2, 4, 4), (2, 3, 3, 3), {"strides": [3, 2], "output_shape": [12, 9]}),
    ((1, 2, 4, 5), (2, 3, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 3, 4, 3), (2, 2, 2, 2, 2), {"strides": [2, 1, 2], "pads": [1, 0, 0, 0, 1, 1]}),
]


@pytest.mark.parametrize("xs,ws,attrs", CONV_TRANSPOSES)
def test_conv_transpose(xs, ws, attrs):
    cout = ws[1] * attrs.get("group", 1)
    got, ref = run_both("ConvTranspose", [("x", rand(*xs, seed=1)), ("w", rand(*ws, seed=2)), ("b", rand(cout, seed=3))],
                        attrs, consts={"w", "b"})
    assert_close(got, ref)


def test_conv_integer_and_matmul_integer():
    rng = np.random.default_rng(4)
    x = rng.integers(0, 255, (1, 2, 6, 5), dtype=np.uint8)
    w = rng.integers(0, 255, (3, 2, 3, 3), dtype=np.uint8)
    got, ref = run_both("ConvInteger", [("x", x), ("w", w), ("xz", np.array(7, np.uint8)), ("wz", np.array(120, np.uint8))],
                        {"pads": [1, 1, 1, 1]}, consts={"xz", "wz"}, out_types=(TensorProto.INT32,))
    assert_close(got, ref)
    a = rng.integers(-128, 127, (2, 4, 5), dtype=np.int8)
    b = rng.integers(-128, 127, (5, 3), dtype=np.int8)
    got, ref = run_both("MatMulInteger", [("a", a), ("b", b), ("az", np.array(-3, np.int8)),
                                          ("bz", np.array([1, -2, 5], np.int8))],
                        consts={"az", "bz"}, out_types=(TensorProto.INT32,))
    assert_close(got, ref)


# --- pooling ---------------------------------------------------------------------------------------

POOLS = [
    ((1, 2, 9), {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}),
    ((2, 3, 8, 9), {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1}),
    ((1, 2, 8, 9), {"kernel_shape": [3, 3], "pads": [1, 2, 2, 1], "strides": [2, 3], "ceil_mode": 1}),
    ((1, 2, 10, 9), {"kernel_shape": [2, 3], "dilations": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 2, 7, 8), {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 2, 7, 8), {"kernel_shape": [2, 3], "auto_pad": "SAME_LOWER"}),
    ((1, 1, 5, 6, 7), {"kernel_shape": [2, 3, 2], "strides": [2, 1, 2], "pads": [0, 1, 1, 1, 1, 0]}),
]


@pytest.mark.parametrize("xs,attrs", POOLS)
def test_max_pool_with_indices(xs, attrs):
    got, ref = run_both("MaxPool", [("x", rand(*xs, seed=5))], attrs, out_types=(F32, I64), opset=12)
    assert_close(got, ref)


def test_max_pool_storage_order():
    got, ref = run_both("MaxPool", [("x", rand(2, 3, 6, 7, seed=6))],
                        {"kernel_shape": [2, 3], "strides": [2, 2], "storage_order": 1}, out_types=(F32, I64), opset=12)
    assert_close(got, ref)


@pytest.mark.parametrize("xs,attrs", POOLS)
@pytest.mark.parametrize("include_pad", [0, 1])
def test_average_pool(xs, attrs, include_pad):
    if "dilations" in attrs:
        pytest.skip("onnxruntime's AveragePool ignores dilations")
    got, ref = run_both("AveragePool", [("x", rand(*xs, seed=7))], {**attrs, "count_include_pad": include_pad}, opset=19)
    assert_close(got, ref)


@pytest.mark.parametrize("xs,attrs", [p for p in POOLS if "ceil_mode" not in p[1] and "dilations" not in p[1]])
@pytest.mark.parametrize("p", [1, 2, 3])
def test_lp_pool(xs, attrs, p):
    got, ref = run_both("LpPool", [("x", rand(*xs, seed=8))], {**attrs, "p": p}, opset=18)
    assert_close(got, ref, rtol=1e-5)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"])
@pytest.mark.parametrize("xs", [(2, 3, 17), (1, 4, 5, 6), (1, 2, 3, 4, 5)])
def test_global_pool(op, xs):
    got, ref = run_both(op, [("x", rand(*xs, seed=9))], opset=18)
    assert_close(got, ref)


# --- Einsum / TopK ----------------------------------------------------------------------------------

EINSUMS = [
    ("bij,bjk->bik", [(3, 4, 5), (3, 5, 6)]),
    ("ij,kj->ik", [(4, 5), (6, 5)]),
    ("...ij,...jk->...ik", [(2, 3, 3, 4), (2, 3, 4, 2)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),
    ("abc,cd->ad", [(2, 3, 4), (4, 5)]),
    ("ii->i", [(5, 5)]),
    ("ij->", [(4, 5)]),
    ("ij,ij->ij", [(3, 4), (3, 4)]),
    ("i,j->ij", [(3,), (4,)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("ba", [(3, 4)]),
]


@pytest.mark.parametrize("eq,shapes", EINSUMS)
def test_einsum(eq, shapes):
    ins = [(f"x{i}", rand(*s, seed=10 + i)) for i, s in enumerate(shapes)]
    got, ref = run_both("Einsum", ins, {"equation": eq}, opset=12)
    assert_close(got, ref)


@pytest.mark.parametrize("axis,largest", [(-1, 1), (0, 0), (1, 1)])
def test_topk(axis, largest):
    x = rand(5, 7, 6, seed=11)
    got, ref = run_both("TopK", [("x", x), ("k", np.array([3], np.int64))], {"axis": axis, "largest": largest},
                        consts={"k"}, out_types=(F32, I64), opset=11)
    assert_close(got, ref)


# --- Attention / RotaryEmbedding ---------------------------------------------------------------------

ATTENTIONS = [
    ("4d", {}, {}),
    ("causal", {"is_causal": 1}, {}),
    ("gqa_causal", {"is_causal": 1}, {"hq": 6, "hkv": 2}),
    ("scale_softcap", {"scale": 0.3, "softcap": 2.0}, {}),
    ("float_mask", {}, {"mask": np.float32}),
    ("bool_mask_3d", {}, {"mask": bool, "mask_rank": 3}),
    ("past_causal", {"is_causal": 1}, {"past": 5}),
    ("gqa_past_mask", {}, {"hq": 4, "hkv": 2, "past": 3, "mask": np.float32}),
    ("3d", {}, {"rank3": True}),
    ("3d_gqa_past", {"is_causal": 1}, {"rank3": True, "hq": 4, "hkv": 1, "past": 2}),
    ("qk_mode_2", {"qk_matmul_output_mode": 2}, {"mask": np.float32}),
    ("qk_mode_3", {"qk_matmul_output_mode": 3, "is_causal": 1}, {}),
]


@pytest.mark.parametrize("name,attrs,cfg", ATTENTIONS, ids=[a[0] for a in ATTENTIONS])
def test_attention(name, attrs, cfg):
    b, sq, skv, d, dv = 2, 4, 6, 8, 5
    hq, hkv, past = cfg.get("hq", 3), cfg.get("hkv", 3), cfg.get("past", 0)
    q, k, v = rand(b, hq, sq, d, seed=20), rand(b, hkv, skv, d, seed=21), rand(b, hkv, skv, dv, seed=22)
    attrs = dict(attrs)
    if cfg.get("rank3"):
        q, k, v = (t.transpose(0, 2, 1, 3).reshape(b, t.shape[2], -1) for t in (q, k, v))
        attrs.update(q_num_heads=hq, kv_num_heads=hkv)
    mask = None
    if "mask" in cfg:
        full = (b, hq, sq, skv + past)[4 - cfg.get("mask_rank", 4):]
        rng = np.random.default_rng(23)
        mask = rng.random(full) > 0.3 if cfg["mask"] is bool else rand(*full, seed=23)
    pk = rand(b, hkv, past, d, seed=24) if past else None
    pv = rand(b, hkv, past, dv, seed=25) if past else None
    outs = (F32, F32, F32, F32) if past or "qk_matmul_output_mode" in attrs else (F32,)
    got, ref = run_both("Attention", [("q", q), ("k", k), ("v", v), ("m", mask), ("pk", pk), ("pv", pv)],
                        attrs, out_types=outs)
    assert_close(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rank3,rot_dim,pos", [(False, 0, True), (True, 0, False), (False, 4, True), (True, 6, True)])
def test_rotary_embedding(interleaved, rank3, rot_dim, pos):
    b, h, s, d = 2, 3, 5, 8
    half = (rot_dim or d) // 2
    x = rand(b, h, s, d, seed=30)
    attrs = {"interleaved": interleaved, "rotary_embedding_dim": rot_dim}
    if rank3:
        x = x.transpose(0, 2, 1, 3).reshape(b, s, h * d)
        attrs["num_heads"] = h
    if pos:
        cos, sin = rand(11, half, seed=31), rand(11, half, seed=32)
        ids = np.random.default_rng(33).integers(0, 11, (b, s)).astype(np.int64)
    else:
        cos, sin, ids = rand(b, s, half, seed=31), rand(b, s, half, seed=32), None
    got, ref = run_both("RotaryEmbedding", [("x", x), ("cos", cos), ("sin", sin), ("ids", ids)], attrs)
    assert_close(got, ref)


def test_qlinear_matmul():
    rng = np.random.default_rng(40)
    a = rng.integers(0, 255, (2, 3, 8), dtype=np.uint8)
    b = rng.integers(0, 255, (8, 5), dtype=np.uint8)
    ins = [("a", a), ("as", np.array(0.02, np.float32)), ("az", np.array(100, np.uint8)),
           ("b", b), ("bs", np.array(0.01, np.float32)), ("bz", np.array(130, np.uint8)),
           ("ys", np.array(0.05, np.float32)), ("yz", np.array(120, np.uint8))]
    got, ref = run_both("QLinearMatMul", ins, consts={"as", "az", "bs", "bz", "ys", "yz"},
                        out_types=(TensorProto.UINT8,), opset=21)
    diff = np.abs(got[0].astype(np.int32) - ref[0].astype(np.int32))
    assert diff.max() <= 1 and (diff > 0).mean() < 0.01  # rounding of exact .5 ties may differ
