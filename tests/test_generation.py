"""The gpt2_generate zoo model: GPT-2 greedy decoding with a static KV cache, the whole loop one ONNX
Loop. grapec must give the very tokens onnxruntime and a plain PyTorch greedy loop give, keep the loop
inside the graph (no compile note but float32 attention's), update the caches in place, and refuse inputs the model cannot serve."""
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest

import grapec
from grapec.bundle.format import Bundle
from grapec.errors import InputError
from grapec.plan import LoopStep, walk_steps
from helpers import only_float32_attention_notes, ort_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATH = os.path.join(ROOT, "models", "tiny", "gpt2_generate.onnx")
VOCAB, PROMPT, MAX_NEW = 256, 8, 24


@pytest.fixture(scope="module")
def bundle():
    b = grapec.compile(PATH, targets=[])
    only_float32_attention_notes(b)   # all in the graph; --strict would refuse the float32 attention notes alone
    return b


@pytest.fixture(scope="module")
def session(bundle):
    return grapec.load(Bundle.from_bytes(bundle.to_bytes()), backend="cpu")


def feeds(seed, max_new=MAX_NEW, eos=-1):
    rng = np.random.default_rng(seed)
    return {"prompt_ids": rng.integers(0, VOCAB, (1, PROMPT), dtype=np.int64),
            "max_new_tokens": np.array(max_new, np.int64), "eos_token_id": np.array(eos, np.int64)}


def test_tokens_match_onnxruntime_with_and_without_eos(session):
    m = onnx.load(PATH)
    distinct = set()
    for seed in (1, 2, 3):
        f = feeds(seed)
        ref = ort_run(m, f)
        got = session.run(f)
        np.testing.assert_array_equal(got["generated"], ref["generated"])
        assert int(got["num_generated"]) == MAX_NEW
        distinct.add(tuple(ref["generated"]))
        # stop at the 6th token's id: the run ends there (or earlier, if that id came before)
        eos = int(ref["generated"][5])
        f = feeds(seed, max_new=20, eos=eos)
        ref, got = ort_run(m, f), session.run(f)
        np.testing.assert_array_equal(got["generated"], ref["generated"])
        n = int(got["num_generated"])
        assert n == int(ref["num_generated"]) <= 6 and got["generated"][n - 1] == eos
        assert (got["generated"][n:] == -1).all()
    assert len(distinct) == 3   # the tokens depend on the prompt: a weak model would repeat itself


def test_tokens_match_a_pytorch_greedy_loop(session):
    pytest.importorskip("torch", reason="torch not installed: no PyTorch reference")
    pytest.importorskip("transformers", reason="transformers not installed")
    sys.path.insert(0, os.path.join(ROOT, "models"))
    import zoo
    zm = zoo.get("gpt2_generate", "tiny")
    meta = {p.key: p.value for p in onnx.load(PATH, load_external_data=False).metadata_props}
    if zm.weights_digest() != meta["grapec.zoo.weights_sha256"]:
        pytest.skip("this torch/transformers build does not reproduce the committed weights")
    for seed, max_new in ((4, MAX_NEW), (5, 9)):
        f = feeds(seed, max_new)
        want_tokens, want_count = zm.run_torch(f)
        got = session.run(f)
        np.testing.assert_array_equal(got["generated"], want_tokens)
        assert int(got["num_generated"]) == int(want_count) == max_new


def test_the_loop_is_graphed_and_the_caches_update_in_place(bundle):
    plan = bundle.plans[0]
    loops = [s for s in walk_steps(plan.steps) if isinstance(s, LoopStep)]
    assert len(loops) == 1 and loops[0].graphed
    assert len(bundle.manifest["notes"]) == 2   # the decode step's two float32 attentions, said (the fixture checks)
    loop = loops[0]
    names = {i: plan.buffers[i].name for i in loop.outputs}
    caches = [i for i, n in names.items() if "cache" in n]
    assert len(caches) == 4   # 2 layers x (key, value)
    # each cache is written by one body step, straight into the Loop's output bytes: no copy home
    assert loop.exit == []
    body_outs = [plan.buffers[s.out] for s in loop.body.steps]
    for c in caches:
        home = plan.buffers[c]
        writers = [b for b in body_outs if b.space == "arena" and b.offset == home.offset and b.nbytes == home.nbytes]
        assert len(writers) == 1, (home.name, [b.name for b in writers])


@pytest.mark.parametrize("max_new", [0, MAX_NEW + 1, -1])
def test_max_new_tokens_beyond_the_cache_is_refused(session, max_new):
    with pytest.raises(InputError, match=rf"input 'max_new_tokens' = {max_new}, outside the valid range 1\.\.{MAX_NEW}"):
        session.run(feeds(0, max_new=max_new))


def test_token_ids_outside_the_vocabulary_are_refused(session):
    f = feeds(0)
    f["prompt_ids"][0, 3] = VOCAB
    with pytest.raises(InputError, match=rf"input 'prompt_ids' holds {VOCAB}, outside the valid range 0\.\.{VOCAB - 1}"):
        session.run(f)


def test_cli_exit_code_2_for_max_new_tokens_beyond_the_cache(tmp_path):
    np.save(tmp_path / "n.npy", np.array(MAX_NEW + 8, np.int64))
    r = subprocess.run([sys.executable, "-m", "grapec.tools.cli", "run", PATH, "--backend", "cpu",
                        "--input", f"max_new_tokens={tmp_path / 'n.npy'}"],
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.path.join(ROOT, "src")})
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "max_new_tokens" in r.stderr and "grapec.input_range.max_new_tokens" in r.stderr


# --- on the GPU ----------------------------------------------------------------------------------

@pytest.mark.gpu
def test_generation_on_gpu_is_one_launch_and_matches_onnxruntime():
    m = onnx.load(PATH)
    b = grapec.compile(PATH)
    only_float32_attention_notes(b)
    sess = grapec.load(Bundle.from_bytes(b.to_bytes()), backend="cuda")
    for seed in (1, 2):
        f = feeds(seed)
        ref, got = ort_run(m, f), sess.run(f)
        np.testing.assert_array_equal(got["generated"], ref["generated"])
        assert sess._runner.launched == 1
        eos = int(ref["generated"][7])
        f = feeds(seed, max_new=16, eos=eos)
        ref, got = ort_run(m, f), sess.run(f)
        np.testing.assert_array_equal(got["generated"], ref["generated"])
        assert int(got["num_generated"]) == int(ref["num_generated"])


def test_the_decode_step_is_compiled_as_the_top_level_is(bundle):
    """The Loop body (the decode step) gets the compile's options: the cost model picks each of its
    kernels' mappings (inspect --fusion lists them as step a/b), its notes are the compile's, and
    --fusion none reaches it."""
    rows = bundle.manifest["buckets"][0]["fusion_report"]
    loop = next(i for i, s in enumerate(bundle.plans[0].steps) if isinstance(s, LoopStep))
    body = [r for r in rows if isinstance(r["step"], str) and r["step"].startswith(f"{loop}/")
            and r["step"].split("/")[1].isdigit()]
    assert len(body) > 10
    mapped = [r for r in body if r["kind"] == "kernel" and r["alternatives"]]
    assert mapped and all(a["us"] >= r["us"] for r in mapped for a in r["alternatives"]), \
        [(r["step"], r["us"], [a["us"] for a in r["alternatives"]]) for r in mapped]
    assert bundle.manifest["buckets"][0]["estimated_us"] == pytest.approx(
        sum(r["us"] for r in rows if isinstance(r["step"], int)), abs=0.2)
    none = grapec.compile(PATH, targets=[], fusion="none")
    full_steps, none_steps = (len(next(s for s in b.plans[0].steps if isinstance(s, LoopStep)).body.steps)
                              for b in (bundle, none))
    assert none_steps > 2 * full_steps, (none_steps, full_steps)
