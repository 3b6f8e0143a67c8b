"""GPU: IOBinding with torch tensors on the CUDA backend. A bound input's reader nodes and a bound
output's writer are repointed at the caller's buffers where that is cheaper than a copy (alias
prediction: a pointer bound run after run), outputs always match onnxruntime, and nothing bound
lingers in the graph once a run binds something else."""
import os

import numpy as np
import onnxruntime as ort
import pytest

import grapec
from grapec.compiler import compile_model
from grapec.runtime.devices import gpu_count

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_count(), reason="needs an NVIDIA GPU")]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPT2 = os.path.join(ROOT, "models", "tiny", "gpt2.onnx")


@pytest.fixture(scope="module")
def bundle():
    return compile_model(GPT2, dims={"batch": 1}, dynamic={"seq": (1, 24)})


@pytest.fixture(scope="module")
def ref():
    return ort.InferenceSession(GPT2, providers=["CPUExecutionProvider"])


def _check(got, want):
    got = got.detach().cpu().numpy() if hasattr(got, "detach") else np.asarray(got)
    rel = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert rel < 1e-4 and np.abs(got - want).max() < 1e-3, rel


def test_bound_buffers_are_patched_in_and_match_onnxruntime(bundle, ref):
    sess = grapec.load(bundle, backend="cuda")
    rng = np.random.default_rng(0)
    ids_np = rng.integers(0, 256, (1, 16)).astype(np.int64)
    ids = torch.from_numpy(ids_np).cuda()
    out = torch.empty((1, 16, 256), dtype=torch.float32, device="cuda")
    binding = sess.io_binding()
    binding.bind_input("input_ids", ids)
    binding.bind_output("logits", out)
    want = ref.run(None, {"input_ids": ids_np})[0]
    reports = []
    for _ in range(40):   # the same tensors run after run: the logits' copies add up until a patch pays
        sess.run_with_iobinding(binding)
        _check(out, want)
        reports.append({c["name"]: c for c in sess.io_report()})
    first, last = reports[0], reports[-1]
    assert first["input_ids"]["mode"] == "patched", first
    logits = first["logits"]
    runs_to_pay = int(np.ceil(logits["patch_us"] / logits["copy_us"]))
    assert runs_to_pay < 40, logits
    assert [r["logits"]["mode"] for r in reports[:runs_to_pay + 1]] == \
        ["copied"] * (runs_to_pay - 1) + ["patched"] * 2, [r["logits"] for r in reports[:runs_to_pay + 1]]
    assert last["logits"]["mode"] == "patched" and last["logits"]["patch_us"] == 0.0   # nothing left to move
    report = last
    assert report["input_ids"]["nodes"] >= 1 and report["logits"]["nbytes"] == out.numel() * 4
    # new data in the same tensor: read through the patched nodes
    ids_np2 = rng.integers(0, 256, (1, 16)).astype(np.int64)
    ids.copy_(torch.from_numpy(ids_np2))
    sess.run_with_iobinding(binding)
    _check(out, ref.run(None, {"input_ids": ids_np2})[0])
    # a plain run puts the nodes back on the arena: its own input and output, not the tensors bound
    ids_np3 = rng.integers(0, 256, (1, 16)).astype(np.int64)
    before = out.clone()
    got = sess.run({"input_ids": ids_np3})["logits"]
    _check(got, ref.run(None, {"input_ids": ids_np3})[0])
    assert torch.equal(out, before)
    assert not any(b.moved for b in sess._runner._built.values())
    sess._runner.close()


def test_fresh_or_misaligned_buffers_are_copied_and_say_why(bundle, ref):
    sess = grapec.load(bundle, backend="cuda")
    rng = np.random.default_rng(1)
    binding = sess.io_binding()
    for _ in range(3):   # new tensors every run: a patch of the logits' GEMM would cost more than its copy
        ids_np = rng.integers(0, 256, (1, 9)).astype(np.int64)
        binding.bind_input("input_ids", torch.from_numpy(ids_np).cuda())
        out = torch.empty((1, 9, 256), dtype=torch.float32, device="cuda")
        binding.bind_output("logits", out)
        sess.run_with_iobinding(binding)
        _check(out, ref.run(None, {"input_ids": ids_np})[0])
    assert {c["name"]: c["mode"] for c in sess.io_report()}["logits"] == "copied"
    ids_np = rng.integers(0, 256, (1, 10)).astype(np.int64)
    padded = torch.zeros(11, dtype=torch.int64, device="cuda")
    padded[1:] = torch.from_numpy(ids_np.reshape(-1))
    binding.bind_input("input_ids", padded[1:].view(1, 10))   # 8 bytes past an aligned start
    binding.bind_output("logits")
    sess.run_with_iobinding(binding)
    got = binding.copy_outputs_to_cpu()[0]
    _check(got, ref.run(None, {"input_ids": ids_np})[0])
    report = {c["name"]: c for c in sess.io_report()}
    assert report["input_ids"]["mode"] == "copied" and "aligned" in report["input_ids"]["reason"]
    sess._runner.close()


@pytest.mark.parametrize("shared", ["1", "0"], ids=["shared-execs", "own-execs"])
def test_bindings_follow_bucket_switches_and_evictions(bundle, ref, shared, monkeypatch):
    """Bound buffers over sizes of several launch structures, more than the 2 execs kept: with shared
    execs (the default) a structure's exec is given back and made again, with an exec per size
    (GRAPEC_SHARED_EXECS=0) a size's; the bindings follow either way."""
    monkeypatch.setenv("GRAPEC_SHARED_EXECS", shared)
    sess = grapec.load(bundle, backend="cuda", max_graphs=2)
    rng = np.random.default_rng(2)
    tensors = {}
    for n in [4, 17, 4, 9, 24, 17, 4]:   # more sizes than graphs kept: evicted, rebuilt, patched execs
        if n not in tensors:
            tensors[n] = (torch.from_numpy(rng.integers(0, 256, (1, n)).astype(np.int64)).cuda(),
                          torch.empty((1, n, 256), dtype=torch.float32, device="cuda"))
        ids, out = tensors[n]
        binding = sess.io_binding()
        binding.bind_input("input_ids", ids)
        binding.bind_output("logits", out)
        for _ in range(2):
            sess.run_with_iobinding(binding)
            _check(out, ref.run(None, {"input_ids": ids.cpu().numpy()})[0])
    runner = sess._runner
    if shared == "1":
        keys = {runner.shared.key_of[sess.select_bucket({"input_ids": (1, n)})] for n in tensors}
        assert len(keys) >= 3 and len(runner.shared.structures) <= 2
        assert runner.switches["evicted"] >= 2, runner.switches
    else:
        assert runner.switches["evicted"] >= 3, runner.switches
    runner.close()
