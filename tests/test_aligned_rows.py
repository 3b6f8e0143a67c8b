"""passes/aligned_rows.py: GEMM rows padded to 16 bytes through the kernels that write and read them.

A ResNet bottleneck on a 14x14 map, convolutions on the im2col path (--conv gemm): every convolution is a GEMM whose rows are 196 columns (392
bytes in fp16, 784 in fp32: neither a multiple of 16 bytes in fp16). After the pass every GEMM
operand and output has aligned rows, the count of steps is unchanged (the padding is written by the
kernels that were there: the im2col gather and the ReLU/residual kernels), and the answers match
onnxruntime."""
import numpy as np
import pytest
from onnx import TensorProto, helper

import grapec
from grapec.bundle.format import Bundle
from helpers import init, model, ort_run, rel_err, tinfo


def bottleneck(hw: int, c: int = 32, mid: int = 16, seed: int = 0):
    rng = np.random.default_rng(seed)
    w = lambda *s: (rng.standard_normal(s) / np.sqrt(np.prod(s[1:]))).astype(np.float32)  # noqa: E731
    b = lambda n: (rng.standard_normal(n) * 0.1).astype(np.float32)  # noqa: E731
    nodes = [
        helper.make_node("Relu", ["x"], ["x_relu"]),
        helper.make_node("Conv", ["x_relu", "w1", "b1"], ["c1"], kernel_shape=[1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"], kernel_shape=[1, 1]),
        helper.make_node("Add", ["c3", "x_relu"], ["s"]),
        helper.make_node("Relu", ["s"], ["y"]),
    ]
    inits = [init("w1", w(mid, c, 1, 1)), init("b1", b(mid)), init("w2", w(mid, mid, 3, 3)), init("b2", b(mid)),
             init("w3", w(c, mid, 1, 1)), init("b3", b(c))]
    m = model(nodes, [tinfo("x", shape=[1, c, hw, hw])], [tinfo("y", shape=[1, c, hw, hw])], inits)
    return m, {"x": rng.standard_normal((1, c, hw, hw)).astype(np.float32)}


def gemm_rows(b, itemsize, plan=0):
    """-> (row widths of every GEMM's B operand and output buffer, how many are not 16-byte rows)."""
    bufs = b.plans[plan].buffers
    widths = [bufs[a].shape[-1] for st in b.plans[plan].steps if st.op == "library" for a in [st.out, st.args[1]]]
    return widths, sum(w * itemsize % 16 != 0 for w in widths)


@pytest.mark.parametrize("precision,itemsize,tol", [("fp32", 4, 1e-5), ("fp16", 2, 3e-3)])
@pytest.mark.parametrize("hw", [14, 7])
def test_convolutions_on_odd_maps_get_aligned_rows_and_the_same_answers(hw, precision, itemsize, tol):
    m, feeds = bottleneck(hw)
    b = grapec.compile(m, shapes={"x": feeds["x"].shape}, targets=[], precision=precision, conv="gemm")
    widths, unaligned = gemm_rows(b, itemsize)
    assert len(widths) == 6 and unaligned == 0, widths
    assert min(widths) >= hw * hw
    plain = grapec.compile(m, shapes={"x": feeds["x"].shape}, targets=[], precision=precision, fusion="rules",
                           conv="gemm")
    assert len(b.plans[0].steps) == len(plain.plans[0].steps), "no copy kernels were added"
    got = grapec.load(Bundle.from_bytes(b.to_bytes()), backend="cpu").run(feeds)["y"]
    ref = ort_run(m, feeds)["y"]
    assert rel_err(got, ref) < tol
    assert np.allclose(got, ref, rtol=10 * tol, atol=10 * tol)


def test_a_graph_output_read_as_a_gemm_operand_keeps_its_rows():
    """The 1x1 convolution reads the graph input straight (no kernel writes it): its B operand
    cannot be padded, so that GEMM writes its odd width through an output view instead."""
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((8, 16, 1, 1)) / 4).astype(np.float32)
    m = model([helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[1, 1]), helper.make_node("Sigmoid", ["c"], ["y"])],
              [tinfo("x", shape=[1, 16, 7, 7])], [tinfo("y", shape=[1, 8, 7, 7])], [init("w", w)])
    x = rng.standard_normal((1, 16, 7, 7)).astype(np.float32)
    b = grapec.compile(m, shapes={"x": x.shape}, targets=[], conv="gemm")   # fp32: no cast kernel writes x
    mm = next(st for st in b.plans[0].steps if st.op == "library")
    assert mm.attrs["views"]["out"] == [0, 8 * 52, 52, [1, 8, 49]]
    got = grapec.load(Bundle.from_bytes(b.to_bytes()), backend="cpu").run({"x": x})["y"]
    assert rel_err(got, ort_run(m, {"x": x})["y"]) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("hw", [14, 7])
def test_padded_rows_on_the_gpu_match_onnxruntime(hw, tmp_path):
    """The kernels that write padded rows (the tail masked to zero) and read them, and the GEMMs on
    the padded width, as CUDA code and cuBLASLt."""
    import onnx
    from grapec.tools.check import check_model
    m, feeds = bottleneck(hw, c=64, mid=32)
    onnx.save(m, tmp_path / "m.onnx")
    for precision, tol in (("fp32", 1e-4), ("fp16", 1e-2)):
        results, _ = check_model(str(tmp_path / "m.onnx"), shapes={"x": feeds["x"].shape}, backend="cuda",
                                 rtol=tol, seed=4, precision=precision, conv="gemm")
        assert all(r.ok for r in results), [(precision, r.name, r.rel) for r in results]


def test_a_gemm_with_a_residual_and_an_unpaddable_operand_stays_dense():
    """A C operand (the residual cuBLASLt adds) and an output view do not go together, so a GEMM
    whose B cannot be padded keeps its odd rows when it has a C (the ONNX attention tests with a 4-D
    mask hit this)."""
    rng = np.random.default_rng(5)
    m = model([helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Add", ["y", "r"], ["s"]),
               helper.make_node("Sigmoid", ["s"], ["z"])],
              [tinfo("x", shape=[1, 8, 16]), tinfo("w", shape=[16, 7]), tinfo("r", shape=[1, 8, 7])],
              [tinfo("z", shape=[1, 8, 7])])
    feeds = {"x": rng.standard_normal((1, 8, 16)).astype(np.float32),
             "w": rng.standard_normal((16, 7)).astype(np.float32), "r": rng.standard_normal((1, 8, 7)).astype(np.float32)}
    b = grapec.compile(m, shapes={k: v.shape for k, v in feeds.items()}, targets=[])
    mm = next(st for st in b.plans[0].steps if st.op == "library")
    assert mm.args[2] >= 0 and "out" not in (mm.attrs.get("views") or {})
    got = grapec.load(Bundle.from_bytes(b.to_bytes()), backend="cpu").run(feeds)["z"]
    assert rel_err(got, ort_run(m, feeds)["z"]) < 1e-5


@pytest.mark.parametrize("precision,itemsize,tol", [("fp32", 4, 1e-5), ("fp16", 2, 3e-3)])
def test_a_tied_embedding_is_stored_once_with_its_padded_rows(precision, itemsize, tol):
    """GPT-2's lm_head is its token table read transposed (trans_b, in a range of sizes, where the
    Transpose is not folded into a copy; over 16 rows, where cuBLASLt runs it): the GEMM's B gets padded rows (1001 columns are not 16-byte
    rows), and the Gather reads the padded copy, whose first rows are the table, instead of the
    table being stored a second time."""
    vocab, dim = 1001, 64
    rng = np.random.default_rng(11)
    table = (rng.standard_normal((vocab, dim)) / 8).astype(np.float32)
    m = model([helper.make_node("Gather", ["table", "ids"], ["h"]), helper.make_node("Tanh", ["h"], ["t"]),
               helper.make_node("Transpose", ["table"], ["table_t"], perm=[1, 0]),
               helper.make_node("MatMul", ["t", "table_t"], ["logits"]), helper.make_node("Softmax", ["logits"], ["p"])],
              [tinfo("ids", TensorProto.INT64, [1, "seq"])], [tinfo("p", shape=[1, "seq", vocab])], [init("table", table)])
    b = grapec.compile(m, dynamic={"seq": (15, 17)}, targets=[], precision=precision, jobs=1)
    widths, unaligned = gemm_rows(b, itemsize, plan=-1)   # seq 17: cuBLASLt
    assert widths and unaligned == 0, widths
    if precision == "fp16":
        assert any(k.get("kind") == "small_gemm" for k in b.kernels)
    table_bytes = vocab * dim * itemsize
    assert table_bytes <= len(b.weights) < 1.2 * table_bytes, (len(b.weights), table_bytes)
    sess = grapec.load(Bundle.from_bytes(b.to_bytes()), backend="cpu")
    for seq in (15, 17):
        feeds = {"ids": np.concatenate([[0, vocab - 1], rng.integers(0, vocab, seq - 2)]).reshape(1, seq).astype(np.int64)}
        got, ref = sess.run(feeds)["p"].astype(np.float32), ort_run(m, feeds)["p"]
        assert rel_err(got, ref) < tol, seq
        assert np.allclose(got, ref, rtol=10 * tol, atol=10 * tol), seq


def test_the_weight_store_keeps_a_prefix_inside_the_longer_entry():
    """Entries added in any order: one that begins another is stored inside it, and every entry's
    bytes are at its new offset."""
    from grapec.passes.build_plan import WEIGHT_ALIGN, WeightStore
    rng = np.random.default_rng(2)
    table = rng.standard_normal((300, 16)).astype(np.float32)
    padded = np.pad(table, [(0, 4), (0, 0)])
    other, short = rng.standard_normal(1000).astype(np.float32), table[:8].copy()   # short: under 4 KiB, kept apart
    store = WeightStore()
    arrays = [table, other, padded, short]
    old = [store.add(a) for a in arrays]
    moved = store.share_prefixes()
    blob = np.frombuffer(store.blob(), np.uint8)
    new = [moved[o] for o in old]
    assert new[0] == new[2] and len({new[1], new[2], new[3]}) == 3
    assert all(o % WEIGHT_ALIGN == 0 for o in new)
    for a, o in zip(arrays, new):
        assert np.array_equal(blob[o:o + a.nbytes], a.view(np.uint8).reshape(-1))
    assert store.size < padded.nbytes + other.nbytes + short.nbytes + 3 * WEIGHT_ALIGN


def _linear_to_output(rows: tuple, seed: int = 6):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((32, 50)) / 6).astype(np.float32)
    m = model([helper.make_node("MatMul", ["x", "w"], ["y"])], [tinfo("x", shape=[*rows, 32])],
              [tinfo("y", shape=[*rows, 50])], [init("w", w)])
    return m, {"x": rng.standard_normal((*rows, 32)).astype(np.float32)}


@pytest.mark.parametrize("rows,padded", [((2, 40), True), ((1, 8), False)])
def test_a_gemm_writing_an_odd_graph_output_writes_padded_rows_the_output_their_leading_columns(rows, padded):
    """GPT-2's LM head with half outputs: cuBLASLt wrote 50257-wide rows at 14% of peak. From
    COPY_OUTPUT_FROM_ROWS rows the GEMM writes padded rows (50 -> 52 here) and the output is their
    first 50 columns (a buffer with a row pitch: no copy kernel, the runtimes compact the rows on
    the way out); under it, the GEMM writes the output as it is."""
    m, feeds = _linear_to_output(rows)
    b = Bundle.from_bytes(grapec.compile(m, shapes={"x": feeds["x"].shape}, targets=[]).to_bytes())
    widths, unaligned = gemm_rows(b, 4)
    plan = b.plans[0]
    out = plan.buffers[dict(plan.outputs)["y"]]
    assert [st.op for st in plan.steps] == ["library"], "no copy kernel"
    assert (widths[0], unaligned, out.pitch) == ((52, 0, 52) if padded else (50, 2, 0)), (widths, out)
    got = grapec.load(b, backend="cpu").run(feeds)["y"]
    assert got.shape == (*rows, 50) and got.flags.c_contiguous
    ref = ort_run(m, feeds)["y"]
    assert rel_err(got, ref) < 1e-5 and np.allclose(got, ref, rtol=1e-4, atol=1e-5)


def test_a_padded_output_is_checked_when_a_bundle_loads():
    from dataclasses import replace
    from grapec.bundle.format import validate_plan
    from grapec.errors import BundleError
    m, feeds = _linear_to_output((2, 40))
    b = grapec.compile(m, shapes={"x": feeds["x"].shape}, targets=[])
    plan = b.plans[0]
    out = dict(plan.outputs)["y"]
    validate_plan(plan, len(b.weights), b.kernels, len(b.kernels))
    plan.buffers[out] = replace(plan.buffers[out], pitch=48)
    with pytest.raises(BundleError, match="row pitch 48 is shorter than its rows"):
        validate_plan(plan, len(b.weights), b.kernels, len(b.kernels))
    plan.buffers[out] = replace(plan.buffers[out], pitch=60)
    with pytest.raises(BundleError, match="does not match float32.* in rows of 60"):
        validate_plan(plan, len(b.weights), b.kernels, len(b.kernels))


@pytest.mark.gpu
def test_an_odd_graph_output_through_padded_rows_on_the_gpu(tmp_path):
    import onnx
    from grapec.tools.check import check_model
    m, feeds = _linear_to_output((3, 40))
    onnx.save(m, tmp_path / "m.onnx")
    for precision, tol in (("fp32", 1e-4), ("fp16", 1e-2)):
        results, _ = check_model(str(tmp_path / "m.onnx"), shapes={"x": feeds["x"].shape}, backend="cuda",
                                 rtol=tol, seed=4, precision=precision)
        assert all(r.ok for r in results), [(precision, r.name, r.rel) for r in results]


@pytest.mark.gpu
def test_a_padded_output_on_the_gpu_to_the_host_to_a_bound_buffer_and_as_a_strided_device_array():
    """The three ways out of padded rows: run() (the copy to the host compacts them), a bound
    device buffer (a 2-D device copy; the output cannot be repointed, and io_report says why) and
    on_device (a strided device array, as torch.compile's own padded logits)."""
    torch = pytest.importorskip("torch")
    m, feeds = _linear_to_output((3, 40))
    b = grapec.compile(m, shapes={"x": feeds["x"].shape}, targets=["sm_90"])
    assert b.plans[0].buffers[dict(b.plans[0].outputs)["y"]].pitch == 52
    sess = grapec.load(Bundle.from_bytes(b.to_bytes()), backend="cuda")
    ref = ort_run(m, feeds)["y"]
    assert rel_err(sess.run(feeds)["y"], ref) < 1e-5
    out = torch.full((3, 40, 50), float("nan"), device="cuda")
    binding = sess.io_binding()
    binding.bind_input("x", torch.from_numpy(feeds["x"]).cuda())
    binding.bind_output("y", out)
    for _ in range(3):
        sess.run_with_iobinding(binding)
        assert rel_err(out.cpu().numpy(), ref) < 1e-5
    (report,) = [r for r in sess.io_report() if r["name"] == "y"]
    assert report["mode"] == "copied" and "padded" in report["reason"], report
    dev = sess.run(feeds, on_device=True)["y"]
    t = torch.as_tensor(dev, device="cuda")
    assert t.stride() == (40 * 52, 52, 1)
    assert rel_err(t.cpu().numpy(), ref) < 1e-5 and rel_err(sess.to_host(dev), ref) < 1e-5


def test_an_odd_graph_output_whose_gemm_cannot_pad_gets_no_copy():
    """B a graph input and a residual C: the GEMM can neither compute the padded width nor write
    through an output view, so the copy is taken back out and the GEMM writes the output."""
    rng = np.random.default_rng(8)
    m = model([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "r"], ["y"])],
              [tinfo("x", shape=[2, 40, 32]), tinfo("w", shape=[32, 50]), tinfo("r", shape=[2, 40, 50])],
              [tinfo("y", shape=[2, 40, 50])])
    feeds = {"x": rng.standard_normal((2, 40, 32)).astype(np.float32), "w": rng.standard_normal((32, 50)).astype(np.float32),
             "r": rng.standard_normal((2, 40, 50)).astype(np.float32)}
    b = grapec.compile(m, shapes={k: v.shape for k, v in feeds.items()}, targets=[])
    assert [st.op for st in b.plans[0].steps] == ["library"]
    assert b.plans[0].steps[0].args[2] >= 0, "the residual is the GEMM's C"
    got = grapec.load(Bundle.from_bytes(b.to_bytes()), backend="cpu").run(feeds)["y"]
    assert rel_err(got, ort_run(m, feeds)["y"]) < 1e-5


def test_an_odd_graph_output_of_a_gemm_with_an_input_weight_goes_through_an_output_view():
    """B a graph input: the GEMM writes its 50 columns into rows of 52 (an output view), and the
    copy compacts them."""
    rng = np.random.default_rng(9)
    m = model([helper.make_node("MatMul", ["x", "w"], ["y"])], [tinfo("x", shape=[2, 40, 32]), tinfo("w", shape=[32, 50])],
              [tinfo("y", shape=[2, 40, 50])])
    feeds = {"x": rng.standard_normal((2, 40, 32)).astype(np.float32), "w": rng.standard_normal((32, 50)).astype(np.float32)}
    b = grapec.compile(m, shapes={k: v.shape for k, v in feeds.items()}, targets=[])
    mm, copy = b.plans[0].steps
    assert (mm.op, copy.op) == ("library", "kernel") and mm.attrs["views"]["out"][2] == 52
    got = grapec.load(Bundle.from_bytes(b.to_bytes()), backend="cpu").run(feeds)["y"]
    assert rel_err(got, ort_run(m, feeds)["y"]) < 1e-5
