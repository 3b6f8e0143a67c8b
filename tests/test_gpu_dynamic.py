"""GPU: a range of sizes (--dynamic) on the CUDA backend. The sizes of one launch structure share one
exec (the default), their numbers in a size record that the exec's first node loads, and a switch
sets only that node and any other whose launch differs; every size matches onnxruntime. With
GRAPEC_SHARED_EXECS=0 (the `own_execs` tests) each size has its own exec, few stay instantiated, a
switch to a size not kept patches a kept exec in place, and device memory stays flat however many
sizes run."""
import os

import numpy as np
import onnxruntime as ort
import pytest

import grapec
from grapec.compiler import compile_model
from grapec.runtime.devices import gpu_count

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_count(), reason="needs an NVIDIA GPU")]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPT2 = os.path.join(ROOT, "models", "tiny", "gpt2.onnx")
LO, HI = 1, 40


@pytest.fixture(scope="module")
def ranged():
    return compile_model(GPT2, dims={"batch": 1}, dynamic={"seq": (LO, HI)})


@pytest.fixture
def shared_execs(monkeypatch):
    monkeypatch.setenv("GRAPEC_SHARED_EXECS", "1")


@pytest.fixture
def own_execs(monkeypatch):
    monkeypatch.setenv("GRAPEC_SHARED_EXECS", "0")


def _exec_keys(bundle) -> set:
    """What the CUDA runner shares execs by (launch structure, band of sizes), from the bundle alone."""
    from grapec.runtime.cuda.shared_exec import exec_key, graph_shape
    return {exec_key(bundle, b, graph_shape(bundle.plans[b])) for b in range(len(bundle.plans))}


def _close(got, want):
    rel = np.linalg.norm(got - want) / np.linalg.norm(want)
    return rel < 1e-4 and np.abs(got - want).max() < 1e-3


def test_sizes_of_one_structure_share_one_exec_and_match_onnxruntime(ranged, shared_execs):
    """Every size built at load; the sizes run in random order, twice each, through one exec per
    launch structure: as many execs as structures, switches that patch nodes (not whole graphs),
    and every output equal to onnxruntime's."""
    sess = grapec.load(ranged, backend="cuda")
    runner = sess._runner
    sess.build_graphs()   # every size's graph on the host, every structure's exec instantiated
    made = runner.switches["instantiated"]
    ref = ort.InferenceSession(GPT2, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(11)
    sizes = [int(n) for n in rng.permutation(np.arange(LO, HI + 1))] * 2
    rng.shuffle(sizes)
    for n in sizes:
        feeds = {"input_ids": rng.integers(0, 256, (1, n)).astype(np.int64)}
        got, want = sess.run(feeds)["logits"], ref.run(None, feeds)[0]
        assert _close(got, want), n
    structures = {runner.shared.key_of[b] for b in range(len(ranged.plans))}
    # one exec per launch structure and band of sizes (shared_exec.size_band), as worked out from the
    # bundle alone; the structures themselves few (<=: positions are computed, not folded per size,
    # since a range's sized constants stop at 64 bytes, and seq 8's stay a constant: 10 for 40 sizes)
    keys = _exec_keys(ranged)
    assert len(runner.shared.structures) == len(structures) == len(keys), runner.switches
    assert len({k[:-1] for k in keys}) <= len(ranged.plans) // 4, keys
    assert made == runner.switches["instantiated"] == len(structures), runner.switches   # none on a request
    records = runner.shared.records
    assert runner.switches["patched"] > len(sizes) // 2, runner.switches
    # a switch sets only the nodes that differ, far fewer than the graph's: most steps are sized (their
    # numbers copied into the size record) or GEMMs at the structure's widest rows
    assert any(g.slots for g in records.groups.values())
    steps = max(len(ranged.plans[b].steps) for b in range(len(ranged.plans)))
    assert runner.switches["nodes_patched"] < steps * runner.switches["patched"] / 4, runner.switches
    assert runner.switch_us > 0
    sess._runner.close()


def test_sizes_stored_as_formulas_run_on_the_gpu_after_a_round_trip(shared_execs):
    """A sampled 2-D range (bundle/families.py): sizes stored as their structure's formulas are joined at
    their first run, their kernels and launch rows appended, and run in random order through their
    structures' shared execs, equal to onnxruntime, beside sizes stored as plans."""
    from grapec.bundle.format import Bundle
    b = Bundle.from_bytes(compile_model(GPT2, dynamic={"batch": (1, 2), "seq": (1, 64)}).to_bytes())
    docs = b.plans.docs
    members = [bk for f in docs.families for bk in f.buckets]
    assert members and docs.families[0].cuda is not None
    sess = grapec.load(b, backend="cuda")
    sess.build_graphs()
    ref = ort.InferenceSession(GPT2, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(12)
    picks = [int(x) for x in rng.permutation(members)[:16]] + [int(x) for x in rng.permutation(docs.stored_buckets)[:8]]
    rng.shuffle(picks)
    for bk in picks * 2:
        batch, seq = b.manifest["buckets"][bk]["shapes"]["input_ids"]
        feeds = {"input_ids": rng.integers(0, 256, (batch, seq)).astype(np.int64)}
        got, want = sess.run(feeds)["logits"], ref.run(None, feeds)[0]
        assert _close(got, want), (batch, seq)
    runner = sess._runner
    keys = _exec_keys(b)
    assert len(runner.shared.structures) <= len(keys), runner.switches   # the sizes run: not every band
    assert len({k[:-1] for k in keys}) < len(b.plans) // 4, keys
    sess._runner.close()


def test_fp16_sizes_share_execs_with_their_numbers_in_memory(shared_execs):
    """fp16 fuses attention per size; the causal mask is computed, not a constant stored per size (a
    range folds values computed from the inputs only up to 64 bytes), so with shared execs the
    attention node is one sized node and no size copies a constant larger than that. (The shortest
    sizes, whose small GEMMs merge across rows, share a structure, and copy the values folded for them,
    position ids and a short mask of at most 64 bytes, as they switch.) Random sizes match onnxruntime
    within fp16's accuracy."""
    b = compile_model(GPT2, dims={"batch": 1}, dynamic={"seq": (LO, HI)}, precision="fp16")
    sess = grapec.load(b, backend="cuda")
    runner = sess._runner
    ref = ort.InferenceSession(GPT2, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(13)
    sizes = [int(n) for n in rng.integers(LO, HI + 1, 30)]
    for n in sizes:
        feeds = {"input_ids": rng.integers(0, 256, (1, n)).astype(np.int64)}
        got, want = sess.run(feeds)["logits"].astype(np.float32), ref.run(None, feeds)[0]
        rel = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert rel < 1e-2, (n, rel)   # the fp16 compile itself refuses above 1e-2 (mixed_precision.py)
    groups = runner.shared.records.groups.values()
    assert any(g.slots for g in groups), [g.constants for g in groups]
    assert all(nbytes <= 64 for g in groups for nbytes in g.constants.values()), [g.constants for g in groups]
    sess._runner.close()


def test_a_shared_exec_sets_back_what_a_binding_patched(ranged, shared_execs):
    """A size run with bound device buffers patches the shared exec's nodes to the caller's pointers;
    the next size of the same structure, run without them, must not write into the caller's buffer
    or read the old input."""
    torch = pytest.importorskip("torch")
    sess = grapec.load(ranged, backend="cuda")
    runner = sess._runner
    by_key: dict = {}
    for n in range(LO, HI + 1):
        b = sess.select_bucket({"input_ids": (1, n)})
        runner._build_shared(b)
        by_key.setdefault(runner.shared.key(b, runner.segments(b)[0]), []).append(n)
    a, c = next(g for g in by_key.values() if len(g) >= 2)[:2]
    ref = ort.InferenceSession(GPT2, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(12)
    ids_a = torch.from_numpy(rng.integers(0, 256, (1, a)).astype(np.int64)).cuda()
    out_a = torch.empty((1, a, 256), dtype=torch.float32, device="cuda")
    binding = sess.io_binding()
    binding.bind_input("input_ids", ids_a)
    binding.bind_output("logits", out_a)
    for _ in range(3):   # bound run after run: the nodes are patched to the caller's buffers
        sess.run_with_iobinding(binding)
    want_a = ref.run(None, {"input_ids": ids_a.cpu().numpy()})[0]
    assert _close(out_a.cpu().numpy(), want_a)
    assert any(c.mode == "patched" for c in runner.zero_copy.choices.values()), runner.zero_copy.choices
    kept = out_a.clone()
    for n in (c, a):
        feeds = {"input_ids": rng.integers(0, 256, (1, n)).astype(np.int64)}
        assert _close(sess.run(feeds)["logits"], ref.run(None, feeds)[0]), n
    assert torch.equal(out_a, kept)   # the plain runs left the caller's buffer alone
    sess.run_with_iobinding(binding)
    assert _close(out_a.cpu().numpy(), want_a)
    sess._runner.close()


def test_sizes_switch_by_patching_and_match_onnxruntime(ranged, own_execs):
    sess = grapec.load(ranged, backend="cuda", max_graphs=3)
    runner = sess._runner
    ref = ort.InferenceSession(GPT2, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    # 9, 10, 11, 13 compile alike (one template): once 3 are kept, each new one patches the oldest's exec
    for n in [5, 9, 10, 11, 13, 9, 2, 40, 33, 17, 1, 40]:
        feeds = {"input_ids": rng.integers(0, 256, (1, n)).astype(np.int64)}
        got, want = sess.run(feeds)["logits"], ref.run(None, feeds)[0]
        rel = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert rel < 1e-4 and np.abs(got - want).max() < 1e-3, (n, rel)
        assert len(runner._built) <= 3
    assert runner.switches["patched"] >= 2, runner.switches
    assert runner.switches["evicted"] >= 8, runner.switches
    sess._runner.close()


def test_an_evicted_size_comes_back_from_its_parked_graph(ranged, own_execs):
    """A size whose exec was given back keeps its graph on the host: running it again patches that
    graph into a kept exec (no build, no GEMM tuning) and still matches onnxruntime."""
    sess = grapec.load(ranged, backend="cuda", max_graphs=2)
    runner = sess._runner
    ref = ort.InferenceSession(GPT2, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(6)
    sizes = [7, 12, 30, 3]
    for n in sizes:   # four sizes through two execs: the first two are evicted, parked
        sess.run({"input_ids": rng.integers(0, 256, (1, n)).astype(np.int64)})
    buckets = {sess.select_bucket({"input_ids": (1, n)}) for n in sizes}
    assert len(runner._parked) == 2 and set(runner._parked) <= buckets and len(buckets) == 4
    made = runner.switches["instantiated"] + runner.switches["patched"]
    before = runner.switches["restored"]
    for n in sizes * 2:
        feeds = {"input_ids": rng.integers(0, 256, (1, n)).astype(np.int64)}
        got, want = sess.run(feeds)["logits"], ref.run(None, feeds)[0]
        rel = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert rel < 1e-4 and np.abs(got - want).max() < 1e-3, (n, rel)
    restored = runner.switches["restored"] - before
    assert restored >= 4, runner.switches   # each size ran twice through two execs: at least half of them switched
    # every exec made since came from a parked graph: none was built anew
    assert runner.switches["instantiated"] + runner.switches["patched"] - made == restored, runner.switches
    assert len(runner._built) <= 2 and len(runner._parked) == 2
    sess._runner.close()


def test_a_switch_patches_the_exec_of_a_size_with_the_same_graph_shape(ranged, own_execs):
    """Two execs kept, one of each shape: the incoming size takes the exec of its own shape (patched)
    even where the other one was run less recently (whose exec CUDA would refuse to patch)."""
    sess = grapec.load(ranged, backend="cuda", max_graphs=2)
    runner = sess._runner
    by_shape = {}
    for n in range(LO, HI + 1):
        by_shape.setdefault(runner.graph_shape(sess.select_bucket({"input_ids": (1, n)})), []).append(n)
    groups = list(by_shape.values())
    xs = next(g for g in groups if len(g) >= 2)
    (x1, x2), y = xs[:2], next(g[0] for g in groups if g is not xs)
    rng = np.random.default_rng(8)
    ref = ort.InferenceSession(GPT2, providers=["CPUExecutionProvider"])
    for n in (y, x1):
        sess.run({"input_ids": rng.integers(0, 256, (1, n)).astype(np.int64)})
    patched = runner.switches["patched"]
    feeds = {"input_ids": rng.integers(0, 256, (1, x2)).astype(np.int64)}   # y is the least recently run
    got, want = sess.run(feeds)["logits"], ref.run(None, feeds)[0]
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-4
    assert runner.switches["patched"] == patched + 1, runner.switches
    assert sess.select_bucket({"input_ids": (1, y)}) in runner._built
    sess._runner.close()


def test_graphs_built_at_load_serve_random_sizes_without_a_build(ranged, own_execs):
    sess = grapec.load(ranged, backend="cuda", max_graphs=3)
    runner = sess._runner
    seen = []
    assert sess.build_graphs(lambda done, total: seen.append((done, total))) == len(ranged.plans)
    assert seen[-1] == (len(ranged.plans), len(ranged.plans))
    assert len(runner._built) == 3 and len(runner._parked) == len(ranged.plans) - 3
    ref = ort.InferenceSession(GPT2, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(7)
    built = runner.switches["instantiated"] + runner.switches["patched"] - runner.switches["restored"]
    for n in rng.permutation(np.arange(LO, HI + 1))[:12]:
        feeds = {"input_ids": rng.integers(0, 256, (1, int(n))).astype(np.int64)}
        got, want = sess.run(feeds)["logits"], ref.run(None, feeds)[0]
        rel = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert rel < 1e-4 and np.abs(got - want).max() < 1e-3, (n, rel)
    # every exec made since came from a parked graph: no graph was built again
    assert runner.switches["instantiated"] + runner.switches["patched"] - runner.switches["restored"] == built
    sess._runner.close()


@pytest.mark.device_memory
def test_device_memory_stays_flat_over_every_size(ranged, own_execs):
    sess = grapec.load(ranged, backend="cuda", max_graphs=4)
    runner = sess._runner
    rng = np.random.default_rng(1)
    outs = {}

    def sweep():
        for n in range(LO, HI + 1):
            feeds = {"input_ids": rng.integers(0, 256, (1, n)).astype(np.int64)}
            outs[n] = sess.run(feeds)["logits"]
    sweep()
    runner.synchronize()
    free_after_one, _ = runner.dev.mem_info()
    sweep()
    sweep()
    runner.synchronize()
    free_after_three, _ = runner.dev.mem_info()
    # two more sweeps of all 40 sizes build and patch graphs again and again: nothing accumulates
    assert abs(free_after_one - free_after_three) <= 2 * 2**20, (free_after_one - free_after_three) / 2**20
    assert len(runner._built) <= 4
    sess._runner.close()


def test_graph_memory_budget_limits_the_graphs_kept(ranged, own_execs):
    sess = grapec.load(ranged, backend="cuda", graph_memory=1)   # one byte: only the bucket running stays
    rng = np.random.default_rng(2)
    for n in (3, 30, 12):
        sess.run({"input_ids": rng.integers(0, 256, (1, n)).astype(np.int64)})
        assert len(sess._runner._built) == 1
    sess._runner.close()


def test_fp16_range_shares_attention_functions_and_matches_onnxruntime():
    """fp16 fuses attention per size; the sizes share a few attention functions (their lengths as
    arguments), and every size still matches onnxruntime (fp32) within fp16's accuracy."""
    b = compile_model(GPT2, dims={"batch": 1}, dynamic={"seq": (LO, HI)}, precision="fp16")
    names = b.manifest["cuda"]["kernels"]
    attention = {names[i] for i, k in enumerate(b.kernels) if k.get("kind") == "attention"}
    assert len(attention) <= 6, len(attention)
    sess = grapec.load(b, backend="cuda", max_graphs=4)
    ref = ort.InferenceSession(GPT2, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(9)
    for n in [1, 7, 16, 17, 31, 40]:
        feeds = {"input_ids": rng.integers(0, 256, (1, n)).astype(np.int64)}
        got, want = sess.run(feeds)["logits"].astype(np.float32), ref.run(None, feeds)[0]
        rel = np.linalg.norm(got - want) / np.linalg.norm(want)
        # the fp16 compile itself refuses above 1e-2 against float32 (mixed_precision.py)
        assert rel < 1e-2, (n, rel)
    sess._runner.close()


def test_a_widened_layout_runs_on_the_gpu(shared_execs, tmp_path):
    """A structure whose layout was widened for a buffer largest at another size (the position table:
    compiler/shared_layout.py widened) runs its sizes, those that once kept their own layouts among
    them, in one exec each structure, equal to onnxruntime, in random order after a round trip."""
    from grapec.bundle.format import Bundle
    from helpers import gpt2_with_positions
    model = gpt2_with_positions(128, str(tmp_path / "gpt2_128.onnx"))
    said = []
    b = Bundle.from_bytes(compile_model(model, dynamic={"batch": (1, 4), "seq": (1, 128)}, progress=said.append).to_bytes())
    assert any("layouts widened" in m for m in said), said
    sess, ref = grapec.load(b, backend="cuda"), ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(11)
    shapes = [(3, 128), (2, 127), (2, 128), (4, 124), (1, 128), (3, 97), (4, 61), (2, 66)]
    for k in rng.permutation(len(shapes)):
        feeds = {"input_ids": rng.integers(0, 256, shapes[k]).astype(np.int64)}
        want, got = ref.run(None, feeds)[0], sess.run(feeds)["logits"]
        rel = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert rel < 1e-4 and np.allclose(got, want, rtol=1e-3, atol=1e-3), (shapes[k], rel)


def test_a_bert_range_runs_its_structures_attention_functions_on_the_gpu(shared_execs):
    """fp16 BERT over batch 1..2 x seq 1..64: each structure's sizes run the attention tiling its plans
    record (passes/mappings.py), small sizes of a structure with more key slices than they have keys'
    worth among them (an empty slice merges as nothing). Sizes stored as formulas and as plans, in random
    order after a round trip, match onnxruntime (fp32) within fp16's accuracy, some rows masked."""
    from grapec.bundle.format import Bundle
    bert = os.path.join(ROOT, "models", "tiny", "bert.onnx")
    b = Bundle.from_bytes(compile_model(bert, dynamic={"batch": (1, 2), "seq": (1, 64)}, precision="fp16").to_bytes())
    docs = b.plans.docs
    members = [bk for f in docs.families for bk in f.buckets]
    assert members
    sess = grapec.load(b, backend="cuda")
    ref = ort.InferenceSession(bert, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(14)
    picks = [int(x) for x in rng.permutation(members)[:16]] + [int(x) for x in rng.permutation(docs.stored_buckets)[:8]]
    rng.shuffle(picks)
    for bk in picks:
        batch, seq = b.manifest["buckets"][bk]["shapes"]["input_ids"]
        mask = np.ones((batch, seq), np.int64)
        mask[0, rng.integers(1, seq + 1):] = 0   # the first row padded at its end (none where it draws seq)
        feeds = {"input_ids": rng.integers(0, 512, (batch, seq)).astype(np.int64), "attention_mask": mask}
        got, want = sess.run(feeds)["last_hidden_state"].astype(np.float32), ref.run(None, feeds)[0]
        rel = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert rel < 1e-2, (batch, seq, rel)   # the fp16 compile itself refuses above 1e-2 (mixed_precision.py)
    sess._runner.close()
