"""Fused attention (passes/attention.py, ir/attention.py, codegen/attention.py).

The models are attention as exporters write it (MatMul, Mul by a scale, a mask, Softmax, MatMul), in
float16 and bfloat16, checked against a float64 numpy reference: on the CPU backend here, and on the
GPU (marker gpu) against the CPU backend too, which runs the same semantics."""
import numpy as np
import pytest
from onnx import TensorProto, helper

import grapec
from grapec.bundle.format import Bundle
from grapec.ir.attention import AttentionKernel
from grapec.ir.kinds import kernel_from_json
from helpers import init, model, rel_err, tinfo

ML = {"float16": (TensorProto.FLOAT16, np.float16), "bfloat16": (TensorProto.BFLOAT16, None)}

# name: (batch, heads, S, T, D, Dv, mask)
CASES = {
    "plain-odd-sizes": (1, 3, 37, 37, 64, 64, None),
    "causal-two-tiles": (1, 2, 100, 100, 64, 64, "causal"),
    "additive-padding": (2, 4, 16, 70, 32, 32, "additive"),
    "first-tile-masked": (1, 2, 24, 130, 64, 48, "late_keys"),
    "decode-one-row": (1, 12, 1, 80, 64, 64, None),
    "head-dim-80": (1, 2, 20, 20, 80, 80, "causal"),
    "bert-s128-key-slices": (1, 12, 128, 128, 64, 64, "additive"),   # 4 warps split each query tile's keys
    "head-dim-128-two-slices": (1, 2, 32, 100, 128, 128, "causal"),   # the merge's room allows 2 slices only
    "gpt2-s128-causal-key-slices": (1, 12, 128, 128, 64, 64, "causal"),   # key tiles past the band skipped
    "decode-grouped-cluster": (1, 8, 4, 384, 64, 64, None),   # a decode step's 4 query heads a KV head: 6 blocks a head
    "two-query-rows": (1, 3, 2, 300, 64, 64, None),   # 6 rows: the softmax stitches as at 3 or 9 (passes/fuse.py)
    "decode-cluster-ragged-keys": (1, 3, 4, 300, 64, 64, "late_keys"),   # the last block's key tile part full
}


def attention_model(b, h, s, t, d, dv, mask, dtype="float16"):
    """Q, K, V (and an additive mask) as inputs; a boolean mask (causal / late keys) as a constant."""
    onnx_type = ML[dtype][0]
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["qk"]),
             helper.make_node("Mul", ["qk", "scale"], ["scores"])]
    scale = np.array(1 / np.sqrt(d), np.float32)
    inits = [helper.make_tensor("scale", onnx_type, [], [float(scale)]) if dtype == "bfloat16"
             else init("scale", scale.astype(np.float16))]
    inputs = [tinfo("q", onnx_type, [b, h, s, d]), tinfo("k", onnx_type, [b, h, t, d]), tinfo("v", onnx_type, [b, h, t, dv])]
    last = "scores"
    if mask == "additive":
        inputs.append(tinfo("m", onnx_type, [b, 1, 1, t]))
        nodes.append(helper.make_node("Add", ["scores", "m"], ["masked"]))
        last = "masked"
    elif mask in ("causal", "late_keys"):
        inits.append(init("keep", boolean_mask(mask, s, t)))
        inits.append(helper.make_tensor("ninf", onnx_type, [], [float("-inf")]))
        nodes.append(helper.make_node("Where", ["keep", "scores", "ninf"], ["masked"]))
        last = "masked"
    nodes += [helper.make_node("Softmax", [last], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["y"])]
    return model(nodes, inputs, [tinfo("y", onnx_type, [b, h, s, dv])], inits, opset=17)


def boolean_mask(kind, s, t):
    i, j = np.arange(s)[:, None], np.arange(t)[None, :]
    if kind == "causal":
        return j <= i + (t - s)
    return (j >= 64 + (i % 3)) | (i % 2 == 0)   # odd rows see nothing in the first 64 keys


def inputs_for(b, h, s, t, d, dv, mask, seed=0):
    rng = np.random.default_rng(seed)
    feeds = {"q": rng.standard_normal((b, h, s, d)), "k": rng.standard_normal((b, h, t, d)),
             "v": rng.standard_normal((b, h, t, dv))}
    if mask == "additive":
        m = np.zeros((b, 1, 1, t))
        m[..., t - 1 - rng.integers(0, t // 2, size=b)[:, None, None]] = -10000.0
        m[1:, ..., t // 2:] = -10000.0
        feeds["m"] = m
    return {k: v.astype(np.float16) for k, v in feeds.items()}


def reference(feeds, mask, s, t, d):
    q, k, v = (feeds[n].astype(np.float64) for n in "qkv")
    x = q @ np.swapaxes(k, -1, -2) / np.sqrt(d)
    if mask == "additive":
        x = x + feeds["m"].astype(np.float64)
    elif mask:
        x = np.where(boolean_mask(mask, s, t), x, -np.inf)
    x = np.exp(x - x.max(-1, keepdims=True))
    return (x / x.sum(-1, keepdims=True)) @ v


def compile_case(case, targets=()):
    b, h, s, t, d, dv, mask = CASES[case]
    m = attention_model(b, h, s, t, d, dv, mask)
    feeds = inputs_for(b, h, s, t, d, dv, mask)
    bundle = grapec.compile(m, shapes={k: v.shape for k, v in feeds.items()}, targets=list(targets))
    return Bundle.from_bytes(bundle.to_bytes()), feeds


def attention_kernels(bundle) -> list:
    return [k for k in map(kernel_from_json, bundle.kernels) if isinstance(k, AttentionKernel)]


# fp16 inputs, fp32 accumulation, p rounded to half for the second product (as in flash attention):
# the reference is float64 on the same half inputs, so what remains is half rounding of p and of y.
TOL = dict(rel=3e-3, atol=4e-3, rtol=2e-2)


def assert_close(got, ref, what):
    got = got.astype(np.float64)
    err = rel_err(got, ref)
    assert err < TOL["rel"], f"{what}: rel-L2 {err:.3g}, max-abs {np.abs(got - ref).max():.3g}"
    np.testing.assert_allclose(got, ref, atol=TOL["atol"], rtol=TOL["rtol"], err_msg=what)


@pytest.mark.parametrize("case", sorted(CASES))
def test_attention_is_one_kernel_on_the_cpu_backend(case):
    bundle, feeds = compile_case(case)
    b, h, s, t, d, dv, mask = CASES[case]
    steps = bundle.plans[0].steps
    (kernel,) = attention_kernels(bundle)
    assert not [st for st in steps if st.op == "library"], "both products went into the fused kernel"
    # a constant causal mask lets the GPU kernel skip the key tiles past the band (passes/sdpa.py)
    assert kernel.causal_offset == (t - s if mask == "causal" else None)
    got = grapec.load(bundle, backend="cpu").run(feeds)["y"]
    assert_close(got, reference(feeds, mask, s, t, d), case)


def test_fully_masked_row_is_nan_like_onnx_softmax():
    """A row with every score -inf: ONNX's Softmax gives NaN, and so does the fused form (0 / 0)."""
    m = attention_model(1, 1, 4, 8, 16, 16, "causal")
    keep = np.tril(np.ones((4, 8), bool))
    keep[2] = False
    for t in m.graph.initializer:
        if t.name == "keep":
            t.CopyFrom(init("keep", keep))
    feeds = inputs_for(1, 1, 4, 8, 16, 16, None)
    bundle = grapec.compile(m, shapes={k: v.shape for k, v in feeds.items()}, targets=[])
    assert len(attention_kernels(bundle)) == 1
    got = grapec.load(bundle, backend="cpu").run(feeds)["y"]
    assert np.isnan(got[0, 0, 2]).all() and np.isfinite(np.delete(got, 2, axis=2)).all()


def test_float32_attention_stays_three_steps_and_says_why():
    m = attention_model(1, 2, 8, 8, 16, 16, None)
    for vi in list(m.graph.input) + list(m.graph.output):
        vi.type.tensor_type.elem_type = TensorProto.FLOAT
    m.graph.initializer[0].CopyFrom(init("scale", np.array(0.25, np.float32)))
    bundle = grapec.compile(m, shapes={"q": (1, 2, 8, 16), "k": (1, 2, 8, 16), "v": (1, 2, 8, 16)}, targets=[])
    assert not attention_kernels(bundle)
    assert any("stays GEMM + softmax + GEMM: float32" in n for n in bundle.manifest["notes"])


def upcast_attention_model(h, s, t, d, mask):
    """HF's GPT-J as optimum exports it: q and k widened to float32 before their product, the scores and
    their softmax in float32, the probabilities cast back to half for the product with v."""
    f32, f16 = TensorProto.FLOAT, TensorProto.FLOAT16
    nodes = [helper.make_node("Cast", ["q"], ["qf"], to=f32), helper.make_node("Cast", ["k"], ["kf"], to=f32),
             helper.make_node("Transpose", ["kf"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["qf", "kt"], ["qk"]), helper.make_node("Div", ["qk", "root"], ["scores"])]
    inits = [init("root", np.array(np.sqrt(d), np.float32))]
    last = "scores"
    if mask:
        inits += [init("keep", boolean_mask(mask, s, t)), init("low", np.array(np.finfo(np.float32).min, np.float32))]
        nodes.append(helper.make_node("Where", ["keep", "scores", "low"], ["masked"]))
        last = "masked"
    nodes += [helper.make_node("Softmax", [last], ["pf"], axis=-1), helper.make_node("Cast", ["pf"], ["p"], to=f16),
              helper.make_node("MatMul", ["p", "v"], ["y"])]
    inputs = [tinfo("q", f16, [1, h, s, d]), tinfo("k", f16, [1, h, t, d]), tinfo("v", f16, [1, h, t, d])]
    return model(nodes, inputs, [tinfo("y", f16, [1, h, s, d])], inits, opset=17)


@pytest.mark.parametrize("h,s,t,d,mask", [(16, 1, 385, 128, None), (3, 20, 40, 64, "causal")])
def test_scores_widened_to_float32_fuse_as_half(h, s, t, d, mask):
    """A product of halves widened to float32 is exact in float32, as the kernel's accumulators hold it
    (passes/upcast_operands.py): the widened q·kᵀ, its float32 softmax and the cast back are one kernel,
    with no copy of q or k and no float32 GEMM."""
    m = upcast_attention_model(h, s, t, d, mask)
    feeds = inputs_for(1, h, s, t, d, d, None, seed=60)
    bundle = grapec.compile(m, shapes={k: v.shape for k, v in feeds.items()}, targets=[])
    steps = bundle.plans[0].steps
    assert len(attention_kernels(bundle)) == 1 and [st.op for st in steps] == ["kernel"]
    got = grapec.load(Bundle.from_bytes(bundle.to_bytes()), backend="cpu").run(feeds)["y"]
    assert_close(got, reference(feeds, mask, s, t, d), f"widened h{h} s{s} t{t} d{d}")


@pytest.mark.parametrize("name,dims", [("gpt2", {"batch": 1, "seq": 8}), ("bert", {"batch": 1, "seq": 8}),
                                       ("wav2vec2", {"batch": 1, "samples": 1600})])
def test_zoo_attention_fuses_in_fp16(name, dims):
    """The exporters' own spellings (GPT-2's causal mask, BERT's padding mask, Wav2Vec2's scaled q)."""
    import os
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models", "tiny", f"{name}.onnx")
    bundle = grapec.compile(path, dims=dims, precision="fp16", targets=[])
    used = {st.kernel for st in bundle.plans[0].steps if st.op == "kernel"}
    fused = [i for i, k in enumerate(bundle.kernels) if k.get("kind") == "attention"]
    assert fused and set(fused) <= used
    assert sum(1 for st in bundle.plans[0].steps if st.op == "kernel" and st.kernel in fused) == 2   # 2 layers


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_attention_kernel_on_gpu(case):
    b, h, s, t, d, dv, mask = CASES[case]
    bundle, feeds = compile_case(case, targets=["sm_90"])
    got = grapec.load(bundle, backend="cuda").run(feeds)["y"]
    cpu = grapec.load(bundle, backend="cpu").run(feeds)["y"]
    assert_close(got, reference(feeds, mask, s, t, d), f"{case} (cuda vs float64)")
    assert rel_err(got, cpu) < 2e-3, f"{case}: cuda vs cpu backend {rel_err(got, cpu):.3g}"


@pytest.mark.gpu
def test_fused_attention_bf16_on_gpu():
    b, h, s, t, d, dv, mask = 1, 4, 40, 90, 64, 64, "causal"
    m = attention_model(b, h, s, t, d, dv, mask, dtype="bfloat16")
    import ml_dtypes
    feeds = {k: v.astype(np.float32).astype(ml_dtypes.bfloat16) for k, v in inputs_for(b, h, s, t, d, dv, mask).items()}
    bundle = grapec.compile(m, shapes={k: v.shape for k, v in feeds.items()}, targets=["sm_90"])
    assert len(attention_kernels(bundle)) == 1
    got = grapec.load(bundle, backend="cuda").run(feeds)["y"].astype(np.float64)
    ref = reference({k: v.astype(np.float64) for k, v in feeds.items()}, mask, s, t, d)
    assert rel_err(got, ref) < 1.5e-2   # bfloat16: 8 bits of mantissa, p and y rounded to it


def test_few_query_tiles_split_their_keys_over_warps():
    """One warp per block and still fewer blocks than SMs: warps split the keys (a slice per 32, at
    most 4, fewer where the merge's partial outputs would not fit in the key tile's room)."""
    from grapec.codegen.attention import attention_launch
    bert, _ = compile_case("bert-s128-key-slices", targets=[])
    wide, _ = compile_case("head-dim-128-two-slices", targets=[])
    short, _ = compile_case("head-dim-80", targets=[])
    assert [(la.split, la.block, la.grid) for la in map(attention_launch, attention_kernels(bert))] == [(4, 128, 96)]
    assert [la.split for la in map(attention_launch, attention_kernels(wide))] == [2]
    assert [la.split for la in map(attention_launch, attention_kernels(short))] == [1]   # 20 keys: one slice
    many = attention_model(8, 16, 128, 128, 64, 64, None)   # 128 heads x 2 query tiles fill the GPU
    feeds = inputs_for(8, 16, 128, 128, 64, 64, None)
    b = grapec.compile(many, shapes={k: v.shape for k, v in feeds.items()}, targets=[], attention="kernel")
    assert [(la.split, la.block) for la in map(attention_launch, attention_kernels(b))] == [(1, 128)]


def test_a_decode_steps_keys_split_over_a_cluster_of_blocks():
    """Few query rows a head and long keys (a decode step): one block a head fills few SMs, so the keys are
    split over a cluster's blocks, merged through distributed shared memory; many query tiles never are."""
    from grapec.codegen.attention import attention_launch, attention_tiling, render_attention
    bundle, _ = compile_case("decode-grouped-cluster", targets=[])
    (k,) = attention_kernels(bundle)
    warps, slices, tile, ranks = attention_tiling(k)
    assert (warps, slices, ranks) == (1, 4, 6) and slices * tile * ranks >= 384
    launch = attention_launch(k)
    assert (launch.grid, launch.block, launch.split) == (8 * 6, 128, 4)
    assert "__cluster_dims__(6, 1, 1)" in render_attention(k, launch, "f")
    prefill, _ = compile_case("bert-s128-key-slices", targets=[])
    assert [attention_tiling(k)[3:] for k in attention_kernels(prefill)] == [(1,)]


def test_cluster_attention_compiles_for_sm_90():
    from helpers import needs_nvrtc
    needs_nvrtc()
    bundle, _ = compile_case("decode-cluster-ragged-keys", targets=["sm_90"])
    assert "__cluster_dims__(5, 1, 1)" in bytes(bundle.extra_sections["cuda.source"]).decode()


BATCHED = [("bert", {"batch": 4, "seq": 16}), ("gpt2", {"batch": 3, "seq": 37}), ("bert", {"batch": 2, "seq": 5})]


def _zoo(name):
    import os
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models", "tiny", f"{name}.onnx")


def _copies_around_attention(bundle) -> int:
    """Plan steps that only move elements into an attention kernel's q/k/v or out of its output."""
    plan = bundle.plans[0]
    att = [st for st in plan.steps if st.op == "kernel" and bundle.kernels[st.kernel].get("kind") == "attention"]

    def where(b):   # a View is another buffer over the same bytes
        buf = plan.buffers[b]
        return buf.space, buf.offset, buf.nbytes
    feeding = {where(a) for st in att for a in st.args[:3]}
    fed = {where(st.out) for st in att}
    from grapec.ir.kinds import kernel_from_json
    from grapec.passes.fuse import is_gather
    copies = 0
    for st in plan.steps:
        if st.op != "kernel" or bundle.kernels[st.kernel].get("kind"):
            continue
        if is_gather(kernel_from_json(bundle.kernels[st.kernel])) and (where(st.out) in feeding or
                                                                       any(where(a) in fed for a in st.args)):
            copies += 1
    return copies


@pytest.mark.parametrize("name,dims", BATCHED)
def test_batched_attention_reads_and_writes_through_the_head_copies(name, dims):
    """At batch > 1 the head split before attention and the merge after it are strides of the fused
    kernel (passes/attention_operands.py), not copies; the answers still match onnxruntime."""
    from grapec.tools.check import check_model
    bundle = grapec.compile(_zoo(name), dims=dims, precision="fp16", targets=[])
    assert attention_kernels(bundle) and _copies_around_attention(bundle) == 0
    results, _ = check_model(_zoo(name), dims=dims, precision="fp16", seed=9)
    assert all(r.ok for r in results), [(r.name, r.rel) for r in results]


@pytest.mark.gpu
@pytest.mark.parametrize("name,dims", BATCHED + [("bert", {"batch": 16, "seq": 64}), ("gpt2", {"batch": 8, "seq": 64})])
def test_batched_attention_through_the_head_copies_on_gpu(name, dims):
    from grapec.tools.check import check_model
    results, _ = check_model(_zoo(name), dims=dims, precision="fp16", backend="cuda", seed=9)
    assert all(r.ok for r in results), [(r.name, r.rel) for r in results]


def test_index_maps_evaluated_at_points_equal_folding_and_the_whole_table():
    """attention_operands composes copies point by point (ir/interpret.py eval_at_points): at every point, the value
    that folding the index at that point's constants gives; and a transpose's inverse from its strides equals the one
    from its whole gather table (_inverse_table)."""
    from grapec.ir import kernel as K
    from grapec.ir.interpret import eval_at_points
    from grapec.passes.attention_operands import _inverse_permutation, _inverse_table, _reads_at
    rng = np.random.default_rng(48)
    # [B, S, H, D] -> [B, H, S, D] (the head split), as its load index: (b, s, h, d) read at (b, h, s, d)
    B, S, H, D = 3, 5, 4, 6
    body = K.load(0, (K.idx(0), K.idx(2), K.idx(1), K.idx(3)), "float16")
    copy = K.Kernel((B, H, S, D), "float16", body, (((B, S, H, D), "float16"),))
    flat = K.idx(0) * K.const(7, "int64") + (K.idx(1) + K.const(3, "int64")) % K.const(4, "int64") - K.idx(2) // K.const(2, "int64")
    points = np.stack([rng.integers(0, n, 40) for n in (B, H, S, D)], axis=1).astype(np.int64)
    got = eval_at_points([flat, *body.args[1]], points)
    for p, row in enumerate(points):
        folded = [K.rebuild(e, tuple(K.const(int(v), "int64") for v in row)) for e in [flat, *body.args[1]]]
        assert all(f.is_const for f in folded)
        assert [int(g[p]) for g in got] == [f.value for f in folded], row
    assert eval_at_points([K.load(0, (K.idx(0),), "int64")], points) is None   # an index that reads memory
    by_strides = _inverse_permutation(_reads_at(copy), copy.shape)
    by_table = _inverse_table(copy, copy.size)
    f = np.arange(copy.size, dtype=np.int64)
    assert by_strides is not None and np.array_equal(by_strides(f), by_table(f))
    assert by_strides(np.array([copy.size])) is None
    # a gather that reads one element twice is no permutation either way
    twice = K.Kernel((2, 3), "float16", K.load(0, (K.const(0, "int64"), K.idx(1)), "float16"), (((2, 3), "float16"),))
    assert _inverse_permutation(_reads_at(twice), twice.shape) is None and _inverse_table(twice, twice.size) is None


def test_a_size_takes_its_structures_attention_tiling_only_where_priced_close():
    """A range's size repeating its launch structure's choices (passes/mappings.py _tiling) takes the
    structure's attention tiling where it differs only in warps per block and key tile and the cost model
    prices it within PINNED_TILING_WITHIN of the size's own; a tiling with key slices, on either side, never."""
    from dataclasses import replace
    from grapec.codegen.attention import attention_tiling
    from grapec.cost.device import load_profile
    from grapec.cost.model import estimate
    from grapec.cost.work import attention_work
    from grapec.passes.mappings import PINNED_TILING_WITHIN, _tiling
    bundle, _ = compile_case("gpt2-s128-causal-key-slices", targets=[])
    (k0,) = attention_kernels(bundle)
    profile = load_profile("h100")
    at = lambda b, s: replace(k0, batch=(b, 12), seq_q=s, seq_k=s, tiling=())   # noqa: E731
    top = attention_tiling(at(64, 512))
    assert top[:2] == (4, 1)
    taken = refused = 0
    for b in range(1, 65, 3):
        for s in (1, 7, 40, 65, 100, 200, 300, 511):
            k = at(b, s)
            own, got = attention_tiling(k), _tiling(k, top, profile)
            assert got in (own, top)
            if own[1] > 1:
                assert got == own, (b, s)   # key slices: never the structure's
            if got != own:
                taken += 1
                price = lambda t: estimate(attention_work(replace(k, tiling=t)), profile).us   # noqa: E731
                assert price(got) <= PINNED_TILING_WITHIN * price(own)
            elif own != top:
                refused += 1
    assert taken >= 10 and refused >= 10, (taken, refused)
    sliced = attention_tiling(at(1, 128))
    assert sliced[1] > 1 and _tiling(at(64, 512), sliced, profile) == top   # a sliced tiling is not pinned either


@pytest.mark.gpu
@pytest.mark.parametrize("tiling,case", [((4, 1, 64), "head-dim-80"), ((4, 1, 64), "plain-odd-sizes"),
                                         ((2, 1, 64), "causal-two-tiles"), ((4, 1, 64), "additive-padding"),
                                         ((1, 4, 16, 8), "decode-one-row")])   # 6 of 8 blocks without keys
def test_an_attention_kernel_runs_right_with_a_larger_sizes_tiling_on_gpu(tiling, case, monkeypatch):
    """A size of a range may run its launch structure's tiling, chosen for its largest size: more warps
    per block than its query tiles fill, a key tile past all of its keys. Against float64 and the CPU."""
    from grapec.passes import mappings
    monkeypatch.setattr(mappings, "attention_tiling", lambda k: tiling)
    b, h, s, t, d, dv, mask = CASES[case]
    bundle, feeds = compile_case(case, targets=["sm_90"])
    assert [k.tiling for k in attention_kernels(bundle)] == [tiling]
    got = grapec.load(bundle, backend="cuda").run(feeds)["y"]
    cpu = grapec.load(bundle, backend="cpu").run(feeds)["y"]
    assert_close(got, reference(feeds, mask, s, t, d), f"{case} at tiling {tiling} (cuda vs float64)")
    assert rel_err(got, cpu) < 2e-3


def shape_masked_attention_model(h=2, d=16):
    """Wav2Vec2's attention as exported: the scores plus where(arange(S) >= 0, 0, -65504), a mask computed from
    the shapes. One size folds it to a constant; a range of sizes keeps it as a kernel of the indices alone."""
    f16 = TensorProto.FLOAT16
    nodes = [helper.make_node("Shape", ["q"], ["qs"]),
             helper.make_node("Gather", ["qs", "two"], ["s"], axis=0),
             helper.make_node("Range", ["zero_i", "s", "one_i"], ["rows"]),
             helper.make_node("GreaterOrEqual", ["rows", "zero_i"], ["keep"]),
             helper.make_node("Unsqueeze", ["keep", "axes"], ["keep4"]),
             helper.make_node("Where", ["keep4", "zero_h", "low_h"], ["mask"]),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["qk"]),
             helper.make_node("Mul", ["qk", "scale"], ["scores"]),
             helper.make_node("Add", ["scores", "mask"], ["masked"]),
             helper.make_node("Softmax", ["masked"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    inits = [init("two", np.array(2, np.int64)), init("zero_i", np.array(0, np.int64)), init("one_i", np.array(1, np.int64)),
             init("axes", np.array([0, 1, 3], np.int64)), init("zero_h", np.array(0, np.float16)),
             init("low_h", np.array(-65504, np.float16)), init("scale", np.array(1 / np.sqrt(d), np.float16))]
    inputs = [tinfo("q", f16, [1, h, "seq", d]), tinfo("k", f16, [1, h, "seq", d]), tinfo("v", f16, [1, h, "seq", d])]
    return model(nodes, inputs, [tinfo("y", f16, [1, h, "seq", d])], inits, opset=17)


@pytest.mark.no_round_trip("checked here: every size of the range is run from the bundle read back")
def test_a_mask_of_the_indices_alone_leaves_every_size_of_a_range_one_attention_kernel():
    """The arange >= 0 kernel was inlined into the softmax's row max and sum (read once a row) but loaded where the
    softmax reads the score per element (too many reads to recompute, by the rule for loaded values): one softmax
    held two forms of its score, fuse_attention took none, and a range's widest sizes ran GEMM + softmax + GEMM
    where the others ran one kernel (Wav2Vec2 at 160000 samples: 36 us a layer against 14)."""
    h, d, lo, hi = 2, 16, 70, 73
    bundle = grapec.compile(shape_masked_attention_model(h, d), dynamic={"seq": (lo, hi)}, targets=[])
    bundle = Bundle.from_bytes(bundle.to_bytes())
    sess = grapec.load(bundle, backend="cpu")
    rng = np.random.default_rng(5)
    for s in range(lo, hi + 1):
        steps = bundle.plans[sess.select_bucket({"q": (1, h, s, d), "k": (1, h, s, d), "v": (1, h, s, d)})].steps
        assert not [st for st in steps if st.op == "library"], f"seq {s}: attention left as GEMM + kernels + GEMM"
        feeds = {n: rng.standard_normal((1, h, s, d)).astype(np.float16) for n in "qkv"}
        assert_close(sess.run(feeds)["y"], reference(feeds, None, s, s, d), f"seq {s}")


def test_attention_fuses_over_a_sweep_of_heads_and_query_rows():
    """Every heads x query rows x keys of a grid fuses into one attention kernel. Before the few-rows rule
    compared a row's width (passes/fuse.py), 5 to 7 rows of scores (heads x query rows) were left as
    GEMM + 3 kernels + GEMM, with no note."""
    import itertools
    unfused = []
    for h, s, t in itertools.product((1, 2, 3, 5, 8), range(1, 10), (7, 100)):
        m = attention_model(1, h, s, t, 64, 64, None)
        feeds = inputs_for(1, h, s, t, 64, 64, None)
        b = grapec.compile(m, shapes={k: v.shape for k, v in feeds.items()}, targets=[])
        if not attention_kernels(b):
            unfused.append((h, s, t))
    assert not unfused, unfused
