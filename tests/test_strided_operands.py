"""passes/strided_operands.py: GEMMs read the attention heads straight out of the QKV projection and
write the merged heads straight into place; the copy kernels are gone and the answers unchanged."""
import os

import numpy as np
import pytest

import grapec
from grapec.ir.kinds import kernel_from_json
from grapec.bundle.format import Bundle
from grapec.tools.check import check_model
from grapec.errors import BundleError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPT2 = os.path.join(ROOT, "models", "tiny", "gpt2.onnx")


def views_of(b):
    return [st.attrs["views"] for st in b.plans[0].steps if st.op == "library" and st.attrs.get("views")]


def test_head_split_and_merge_copies_become_strided_gemm_operands():
    b = grapec.compile(GPT2, dims={"batch": 1, "seq": 8}, targets=[])
    copies = [st for st in b.plans[0].steps if st.op == "kernel" and any("transpose" in o.lower() for o in st.origin)]
    assert not copies, [c["origin"] for c in copies]
    views = views_of(b)
    layers = 2
    assert sum(len(v) for v in views) == 4 * layers          # Q, K, V read in place; the merge written in place
    assert sum("out" in v for v in views) == layers
    hidden = 64   # Q, K and V: rows of the [seq, 3 * hidden] projection, ld 3 * hidden, a head every 16 floats
    assert all(v[2] == 3 * hidden and v[1] == 16 for vs in views for k, v in vs.items() if k != "out")
    results, _ = check_model(GPT2, dims={"batch": 1, "seq": 8}, backend="cpu", rtol=1e-5, seed=2)
    assert all(r.ok for r in results), [(r.name, r.rel) for r in results]


def test_batched_heads_without_one_batch_stride_keep_their_copy():
    """batch 2: (batch, head) has no single stride in the QKV buffer, so cuBLASLt cannot take it. The
    pooler (2 rows) is a gemv kernel (passes/gemv.py) that reads the first-token rows itself."""
    b = grapec.compile(os.path.join(ROOT, "models", "tiny", "bert.onnx"), dims={"batch": 2, "seq": 8}, targets=[])
    views = [v for vs in views_of(b) for v in vs.values()]
    assert views == [], views
    last = b.plans[0].steps[-1]   # tanh(first-token rows @ W + b): one kernel
    assert last.op == "kernel" and "node_tanh" in last.origin and "node_select" in last.origin, last.origin
    results, _ = check_model(os.path.join(ROOT, "models", "tiny", "bert.onnx"), dims={"batch": 2, "seq": 8},
                             backend="cpu", rtol=1e-5, seed=2)
    assert all(r.ok for r in results)


def test_fp16_attention_reads_in_place_too():
    results, _ = check_model(GPT2, dims={"batch": 1, "seq": 8}, backend="cpu", rtol=1e-2, seed=4, precision="fp16")
    assert all(r.ok for r in results), [(r.name, r.rel) for r in results]
    # in half, attention is one kernel (passes/attention.py) that reads q, k and v from the one QKV
    # projection buffer through the views the GEMMs had, and writes merged heads in place
    b = grapec.compile(GPT2, dims={"batch": 1, "seq": 8}, targets=[], precision="fp16")
    fused = [(st, kernel_from_json(b.kernels[st.kernel])) for st in b.plans[0].steps if st.op == "kernel"
             and b.kernels[st.kernel].get("kind") == "attention"]
    assert len(fused) == 2
    for st, k in fused:
        assert len(set(st.args[:3])) == 1, "q, k, v are slices of one buffer"
        assert [k.q.offset, k.k.offset, k.v.offset] == [0, 64, 128]   # tiny GPT-2: hidden 64
        assert k.out.strides[-2] == 64 and k.out.strides[-3] == 16     # [1, 8, 4, 16]: heads merged in place


def test_a_view_reaching_past_its_buffer_is_refused_at_load():
    b = grapec.compile(GPT2, dims={"batch": 1, "seq": 8}, targets=[])
    st = next(st for st in b.plans[0].steps if st.op == "library" and "1" in (st.attrs.get("views") or {}))
    st.attrs["views"]["1"][0] += 10**6
    with pytest.raises(BundleError, match="view 1.*reaches element"):
        Bundle.from_bytes(b.to_bytes())


@pytest.mark.parametrize("precision,ld", [("fp32", 260), ("fp16", 264)])
def test_gemm_with_odd_rows_writes_padded_rows_for_its_kernel_readers(precision, ld):
    """cuBLASLt wants 16-byte aligned rows: 257 columns are written with a padded leading dimension,
    and the kernel that reads them (a softmax over the logits, here) reads the padded buffer."""
    from helpers import init, model, tinfo
    from onnx import helper
    rng = np.random.default_rng(0)
    m = model([helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Softmax", ["y"], ["z"], axis=-1)],
              [tinfo("x", shape=[1, 32, 64])], [tinfo("z", shape=[1, 32, 257])],
              [init("w", rng.standard_normal((64, 257)).astype(np.float32) / 8)])
    x = rng.standard_normal((1, 32, 64)).astype(np.float32)   # 32 rows: cuBLASLt's (8 would be a small_gemm)
    b = grapec.compile(m, shapes={"x": x.shape}, targets=[], precision=precision)
    mm = [st for st in b.plans[0].steps if st.op == "library"]
    bufs = b.plans[0].buffers
    assert len(mm) == 1 and bufs[mm[0].out].shape[-1] == ld
    assert bufs[mm[0].args[1]].shape == (64, ld)   # the weight, padded with zero columns
    got = grapec.load(Bundle.from_bytes(b.to_bytes()), backend="cpu").run({"x": x})["z"]
    from helpers import ort_run, rel_err
    ref = ort_run(m, {"x": x})["z"]
    assert rel_err(got, ref) < (1e-5 if precision == "fp32" else 2e-3)


def test_gemm_with_odd_rows_against_an_input_writes_through_an_output_view():
    from helpers import model, ort_run, rel_err, tinfo
    from onnx import helper
    rng = np.random.default_rng(1)
    m = model([helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Softmax", ["y"], ["z"], axis=-1)],
              [tinfo("x", shape=[1, 8, 64]), tinfo("w", shape=[64, 257])], [tinfo("z", shape=[1, 8, 257])])
    feeds = {"x": rng.standard_normal((1, 8, 64)).astype(np.float32),
             "w": (rng.standard_normal((64, 257)) / 8).astype(np.float32)}
    b = grapec.compile(m, shapes={k: v.shape for k, v in feeds.items()}, targets=[])
    mm = next(st for st in b.plans[0].steps if st.op == "library")
    assert mm.attrs["views"]["out"] == [0, 8 * 260, 260, [1, 8, 257]]
    got = grapec.load(Bundle.from_bytes(b.to_bytes()), backend="cpu").run(feeds)["z"]
    assert rel_err(got, ort_run(m, feeds)["z"]) < 1e-5


def _evaluated(kernel, shape):
    """The copy's strides as every element's offset says (the evaluation copy_strides falls back to)."""
    from grapec.passes import strided_operands as so
    return so._copy_strides.__wrapped__(kernel.body, tuple(kernel.shape), tuple(kernel.inputs[0][0]), tuple(shape))


def _reshapes(shape, rng):
    """shape itself, its axes merged pairwise, a split of its last axis, and all merged into two."""
    out = [tuple(shape)]
    for a in range(len(shape) - 1):
        out.append(tuple(shape[:a]) + (shape[a] * shape[a + 1],) + tuple(shape[a + 2:]))
    last = shape[-1]
    div = [d for d in range(2, last) if last % d == 0]
    if div:
        d = int(rng.choice(div))
        out.append(tuple(shape[:-1]) + (last // d, d))
    out.append((int(np.prod(shape[:2])), int(np.prod(shape[2:]))))
    return out


def test_affine_copies_get_the_strides_that_evaluating_every_element_finds():
    """A copy whose index has no div or mod is fitted from its index (no element evaluated): the strides,
    and None where a reshape makes it non-affine, must be what evaluating every offset gives."""
    from grapec.ir import kernel as K
    from grapec.passes import strided_operands as so
    rng = np.random.default_rng(7)
    decided = 0
    for _ in range(80):
        rank = int(rng.integers(2, 5))
        in_shape = tuple(int(d) for d in rng.choice([1, 2, 3, 4, 6], rank))
        perm = [int(p) for p in rng.permutation(rank)]
        out_shape = tuple(in_shape[p] for p in perm)
        index = []
        for a in range(rank):   # in axis a read at out axis perm.index(a), scaled or shifted now and then
            i = K.idx(perm.index(a))
            kind = int(rng.integers(0, 4))
            index.append(i * 2 if kind == 1 else i + 3 if kind == 2 else 1 + i - 1 if kind == 3 else i)
        kernel = K.Kernel(out_shape, "float32", K.load(0, tuple(index), "float32"), ((in_shape, "float32"),))
        read = so._affine(kernel.body, in_shape)
        assert read is not None
        for shape in _reshapes(out_shape, rng):
            want = _evaluated(kernel, shape)
            got = so._reshaped(out_shape, read, shape)
            if got is not so._UNDECIDED:
                decided += 1
                assert got == want, (in_shape, perm, shape)
            assert so.copy_strides(kernel, shape) == want
    assert decided > 250


def test_a_copy_past_the_evaluation_limit_is_fitted_from_its_index():
    """A head split of 25 million elements (GPT-2 batch 64 x seq 512) evaluated no offset table, so it kept
    its copy; fitted from its index it becomes a view, and a merge that is not affine stays refused."""
    from grapec.ir import kernel as K
    from grapec.passes.strided_operands import MAX_FIT_ELEMENTS, copy_strides
    b, s, h, d = 64, 512, 12, 64
    assert b * s * h * d > MAX_FIT_ELEMENTS
    i0, i1, i2, i3 = (K.idx(a) for a in range(4))
    split = K.Kernel((b, h, s, d), "float16", K.load(0, (i0, i2, i1 * d + i3), "float16"), (((b, s, 3 * h * d), "float16"),))
    assert copy_strides(split) == (0, (s * 3 * h * d, d, 3 * h * d, 1))
    merge = K.Kernel((b, s, h, d), "float16", K.load(0, (i0, i2, i1, i3), "float16"), (((b, h, s, d), "float16"),))
    assert copy_strides(merge, (b * s, h * d)) is None


def test_a_head_split_read_from_a_fused_projection_fits_from_its_index():
    """GPT-2's Q/K/V copies: a slice of the [b, s, 3 * heads * d] projection, split into heads, with a
    constant offset; the index-fitted answer equals the evaluated one, also as the GEMM's merged view."""
    from grapec.ir import kernel as K
    from grapec.passes.strided_operands import copy_strides
    b, s, h, d = 3, 5, 4, 8
    i0, i1, i2, i3 = (K.idx(a) for a in range(4))
    for part in range(3):
        body = K.load(0, (i0, i2, i1 * d + i3 + part * h * d), "float16")
        kernel = K.Kernel((b, h, s, d), "float16", body, (((b, s, 3 * h * d), "float16"),))
        for shape in [(b, h, s, d), (b * h, s, d), (b, h * s, d), (b, h, s * d)]:
            want = _evaluated(kernel, shape)
            assert copy_strides(kernel, shape) == want, (part, shape)
    assert copy_strides(kernel)[1] == (s * 3 * h * d, d, 3 * h * d, 1)
