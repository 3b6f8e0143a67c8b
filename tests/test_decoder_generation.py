"""A decoder's whole greedy generation compiled as one launch (`--generate N`, frontend/generation.py):
onnxruntime-genai's builder decoders (models/real/llama_genai_*.onnx) wrapped in a Loop over a KV cache
allocated once, against onnxruntime running the same decoder token by token with a growing past, as
onnxruntime-genai runs its CPU builds. Each bundle is written and loaded again.

The builder's models carry HF's initial weights (std 0.02), under which a tiny model only repeats its
last token, whatever a step computes. The tests scale the projections up (lively), so the tokens
depend on every position the attention reads."""
import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import grapec
from grapec.bundle.format import Bundle
from grapec.runtime.devices import gpu_count
from grapec.tools.check import _float_accuracy
from helpers import only_float32_attention_notes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REAL = os.path.join(ROOT, "models", "real")
LAYERS, KV_HEADS, HEAD, VOCAB = 2, 2, 16, 256


def lively(name: str, path: str, factor: float = 10.0) -> str:
    """models/real/llama_genai_{name}.onnx with its projections (float weights, or int4 scales)
    multiplied by `factor`, written to `path`."""
    m = onnx.load(os.path.join(REAL, f"llama_genai_{name}.onnx"))
    for t in m.graph.initializer:
        if "proj" in t.name and (t.name.endswith("weight") or t.name.endswith("scales")):
            a = numpy_helper.to_array(t)
            t.CopyFrom(numpy_helper.from_array((a * factor).astype(a.dtype), t.name))
    onnx.save(m, path)
    return path


def reference_greedy(path: str, prompts: list, n: int, eos: int = -1, choose=None) -> list:
    """Each prompt alone through onnxruntime's CPU kernels, a past growing by one per token; each token
    the first largest logit, or choose(logits, token index, the prompt's row)."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    with _float_accuracy(path) as source:
        sess = ort.InferenceSession(source, so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    inputs = {i.name for i in sess.get_inputs()}
    kv_type = np.float16 if next(i for i in sess.get_inputs() if i.name.startswith("past")).type == "tensor(float16)" \
        else np.float32
    pasts = {i.name: i.shape for i in sess.get_inputs() if i.name.startswith("past")}   # [batch, heads, length, dim]
    out = []
    for row, p in enumerate(prompts):
        past = {name: np.zeros((1, shape[1] if isinstance(shape[1], int) else KV_HEADS, 0,
                                shape[3] if isinstance(shape[3], int) else HEAD), kv_type) for name, shape in pasts.items()}
        ids, toks = np.array([p], np.int64), []
        while len(toks) < n:
            total = past["past_key_values.0.key"].shape[2] + ids.shape[1]
            feeds = {"input_ids": ids, "attention_mask": np.ones((1, total), np.int64), **past}
            if "position_ids" in inputs:   # torch.onnx's and optimum's decoders take the positions
                feeds["position_ids"] = np.arange(total - ids.shape[1], total, dtype=np.int64)[None]
            got = dict(zip(names, sess.run(None, feeds)))
            logits = got["logits"][0, -1]
            toks.append(int(logits.argmax()) if choose is None else int(choose(logits, len(toks), row)))
            if toks[-1] == eos:
                break
            past = {k: got[k.replace("past_key_values", "present")] for k in past}
            ids = np.array([[toks[-1]]], np.int64)
        out.append(toks)
    return out


def sampled_reference(k: int, temperature: float, top_p: float, seed: int):
    """frontend/generation.py's sampling in numpy: -> choose(logits, token index, row) for
    reference_greedy. The top k in order (ties: the lower id first, as TopK), softmax of logits /
    temperature, cut where the mass before a candidate reaches top_p, inverse CDF at the hash's u."""
    prime = 2**31 - 1

    def uniform(t: int, row: int) -> np.float32:
        x = seed % (prime - 1) + 1
        for mix in (t + 1, row + 1, 0, 0):
            x = (x * 48271 + mix * 69621) % prime
        return np.float32(x % (1 << 24)) * np.float32(1.0 / (1 << 24))

    def choose(logits, t, row):
        x = logits.astype(np.float32) / np.float32(temperature)
        order = np.argsort(-x, kind="stable")[:k]
        e = np.exp(x[order] - x[order].max())
        p = (e / e.sum()).astype(np.float32)
        kept = np.where(np.cumsum(p) - p < np.float32(top_p), p, np.float32(0))
        cdf = np.cumsum(kept)
        return order[min(int((cdf <= uniform(t, row) * kept.sum()).sum()), k - 1)]
    return choose


def prompts_of(lengths, seed: int) -> list:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, VOCAB, n).tolist() for n in lengths]


def compiled(path: str, n: int, buckets: list, **kw):
    """The bundle of `path` with --generate n at these (batch, prompt) buckets, written and read back."""
    b = grapec.compile(path, dims={"kv_cache_dim": HEAD}, generate=n,
                       bucket_dims=[{"batch": bt, "prompt": p} for bt, p in buckets], **kw)
    return Bundle.from_bytes(b.to_bytes())


@pytest.mark.parametrize("name", ["fp32", "int4"])
def test_generation_in_one_launch_gives_onnxruntimes_greedy_tokens(name, tmp_path):
    path = lively(name, str(tmp_path / "decoder.onnx"))
    prompts = prompts_of([6, 3, 5], seed={"fp32": 1, "int4": 2}[name])
    want = reference_greedy(path, prompts, 12)
    assert len({t for row in want for t in row}) > 6, "the lively weights give varied tokens"
    bundle = compiled(path, 12, [(1, 4), (4, 8)], targets=[])
    only_float32_attention_notes(bundle)   # nothing on the host: the whole loop is one graph
    assert bundle.manifest["inputs"][0]["name"] == "prompt_ids"
    sess = grapec.load(bundle)
    got = grapec.generate(sess, prompts)
    assert got.bucket["prompt_ids"] == (4, 8)   # 3 rows of up to 6 tokens: the 4x8 bucket, one row unused
    assert got.tokens == want
    # one prompt at a time through the small bucket, in another order
    for i in (2, 0):
        if len(prompts[i]) <= 4:
            assert grapec.generate(sess, [prompts[i]]).tokens == [want[i]]
    assert grapec.generate(sess, [prompts[1]], max_new_tokens=5).tokens == [want[1][:5]]


def test_a_row_stops_at_its_eos_and_the_others_go_on(tmp_path):
    path = lively("fp32", str(tmp_path / "decoder.onnx"))
    prompts = prompts_of([5, 2, 7, 4], seed=3)
    free = reference_greedy(path, prompts, 10)
    at = next(k for k in range(2, 10) if free[0][k] not in free[0][:k])   # a token row 0 first makes there
    eos = free[0][at]
    want = reference_greedy(path, prompts, 10, eos)
    assert len(want[0]) == at + 1 and any(len(row) == 10 for row in want)
    sess = grapec.load(compiled(path, 10, [(4, 8)], targets=[]))
    assert grapec.generate(sess, prompts, eos_token_id=eos).tokens == want
    # raw outputs: -1 after a row's last token, num_generated counts its eos
    ids = np.array([p + [0] * (8 - len(p)) for p in prompts], np.int64)
    out = sess.run({"prompt_ids": ids, "prompt_lengths": np.array([len(p) for p in prompts]),
                    "max_new_tokens": np.array(10), "eos_token_id": np.array(eos)})
    assert out["num_generated"].tolist() == [len(r) for r in want]
    assert (out["generated"][0, at + 1:] == -1).all()


def test_sampled_generation_is_the_seeds_draw_from_the_top_k(tmp_path):
    """--top-k: each token drawn from the top k (temperature, top_p, seed at run time) by a hash of
    (seed, token index, row): the same tokens as that sampling in numpy over onnxruntime's logits,
    the same for the same seed, others for another seed; top_k 1 is the greedy choice."""
    path = lively("fp32", str(tmp_path / "decoder.onnx"))
    prompts = prompts_of([6, 3, 5], seed=4)
    sess = grapec.load(compiled(path, 10, [(4, 8)], targets=[], top_k=8))
    for temperature, top_p, seed in ((0.7, 0.9, 3), (1.5, 1.0, -12), (1.0, 0.5, 2**40)):
        want = reference_greedy(path, prompts, 10, choose=sampled_reference(8, temperature, top_p, seed))
        got = grapec.generate(sess, prompts, temperature=temperature, top_p=top_p, seed=seed).tokens
        assert got == want, (temperature, top_p, seed)
    first = grapec.generate(sess, prompts, seed=5).tokens
    assert grapec.generate(sess, prompts, seed=5).tokens == first
    assert grapec.generate(sess, prompts, seed=6).tokens != first
    greedy = reference_greedy(path, prompts, 10)
    assert first != greedy   # sampling at temperature 1 strays from the greedy path
    assert grapec.generate(sess, prompts, top_p=1e-6).tokens == greedy   # only the top token left
    one = grapec.load(compiled(path, 10, [(4, 8)], targets=[], top_k=1))
    assert grapec.generate(one, prompts, seed=9).tokens == greedy
    with pytest.raises(grapec.errors.InputError, match="temperature 0.0: expected a value > 0"):
        grapec.generate(sess, prompts, temperature=0.0)
    with pytest.raises(grapec.errors.InputError, match=r"top_p 1.5: expected a value in \(0, 1\]"):
        grapec.generate(sess, prompts, top_p=1.5)
    plain = grapec.load(compiled(path, 4, [(1, 8)], targets=[]))
    with pytest.raises(grapec.errors.InputError, match="seed: this bundle generates greedily; compile it with --top-k"):
        grapec.generate(plain, [prompts[0]], seed=1)


def test_streamed_tokens_come_a_step_at_a_time_and_are_generates(tmp_path):
    """grapec.stream: the CPU backend hands over each row's tokens after every step of the one launch;
    together they are generate()'s tokens (and onnxruntime's), a row that stopped at its eos included.
    An iterator left early gives its runner back once the run ends."""
    path = lively("fp32", str(tmp_path / "decoder.onnx"))
    prompts = prompts_of([5, 2, 7, 4], seed=3)
    free = reference_greedy(path, prompts, 10)
    eos = free[0][next(k for k in range(2, 10) if free[0][k] not in free[0][:k])]
    want = reference_greedy(path, prompts, 10, eos)
    assert len(want[0]) < 10 and any(len(row) == 10 for row in want)   # row 0 stops early, others go on
    sess = grapec.load(compiled(path, 10, [(4, 8)], targets=[]))
    tokens = grapec.stream(sess, prompts, eos_token_id=eos)
    items = list(tokens)
    assert len(items) == 10 and all(len(ids) <= 1 for item in items for ids in item)   # a token a step, in order
    assert [sum((item[r] for item in items), []) for r in range(4)] == want
    assert tokens.result.tokens == want == grapec.generate(sess, prompts, eos_token_id=eos).tokens
    for item in grapec.stream(sess, prompts, max_new_tokens=4):   # left after the first item
        assert item == [[w[0]] for w in free]
        break
    assert grapec.generate(sess, prompts, max_new_tokens=4).tokens == [w[:4] for w in free]
    with pytest.raises(grapec.errors.InputError, match="1 to 10 tokens"):
        list(grapec.stream(sess, prompts, max_new_tokens=11))


def test_a_generations_tokens_have_bytes_of_their_own_from_the_first_step(tmp_path):
    """The GPU streams the tokens by reading their Loop slot while the graph runs, from before the
    prompt's pass: no other value may ever use those bytes (compiler/pipeline.py streamed_outputs)."""
    from grapec.plan import Plan
    from grapec.runtime.generation import tokens_slot
    plan = compiled(lively("fp32", str(tmp_path / "decoder.onnx")), 12, [(4, 8)], targets=[]).plans[0]
    out = dict(plan.outputs)["generated"]
    root = plan.storage_of()
    lo, hi = plan.buffers[out].offset, plan.buffers[out].offset + plan.buffers[out].nbytes
    sharing = [b.name for i, b in enumerate(plan.buffers)
               if b.space == "arena" and b.nbytes and root[i] != root[out] and b.offset < hi and lo < b.offset + b.nbytes]
    assert sharing == []
    assert root[tokens_slot(plan)] == root[out]
    old = plan.to_json()
    for st in old["steps"]:
        st.pop("carried", None)
    with pytest.raises(grapec.errors.BundleError, match="cannot be streamed"):
        tokens_slot(Plan.from_json(old))   # a plan from before grapec recorded a Loop's slots


OPTIMUM = os.path.join(REAL, "llama_optimum.onnx")   # optimum's export: presents grow by Concat, position_ids


@pytest.mark.parametrize("name, kv_heads", [("llama_optimum", KV_HEADS), ("phi3_optimum", KV_HEADS), ("gptj_optimum", 4)])
def test_a_decoder_whose_cache_grows_by_concat_generates_onnxruntimes_tokens(name, kv_heads, tmp_path):
    """optimum's export (torch.onnx underneath) of the same Llama shape, of a Phi-3 one (fused qkv and
    gate_up projections) and of a GPT-J one (Grape's model: no grouped heads, parallel attention and MLP,
    its keys' present a Cast of the Concat back to the model's type): each present is Concat(past, new
    keys). --generate keeps its cache
    as a window of prompt + N - 1 positions sliding by what each pass fed, the positions from
    position_ids: the tokens of onnxruntime running the decoder with a growing past, for rows of 1 to
    8 tokens in one bucket, one row stopping at its eos; and from the command line, the model's
    weights in an external data file."""
    path = os.path.join(REAL, f"{name}.onnx")
    prompts = prompts_of([6, 3, 8, 1], seed=8)
    free = reference_greedy(path, prompts, 12)
    assert len({t for row in free for t in row}) > 8, "the model's weights give varied tokens"
    eos = free[1][next(k for k in range(2, 12) if free[1][k] not in free[1][:k])]
    want = reference_greedy(path, prompts, 12, eos)
    assert len(want[1]) < 12 and any(len(row) == 12 for row in want)
    bundle = Bundle.from_bytes(grapec.compile(path, generate=12, bucket_dims=[{"batch": 4, "prompt": 8}],
                                              targets=[]).to_bytes())
    only_float32_attention_notes(bundle)   # the whole loop in the graph
    plan = bundle.plans[0]
    loop = next(st for st in plan.steps if st.op == "loop")
    caches = {plan.buffers[b].shape for b in loop.carried if plan.buffers[b].name.startswith("past/")}
    assert caches == {(4, kv_heads, 8 + 12 - 1, HEAD)}   # the window: prompt + N - 1 positions
    sess = grapec.load(bundle)
    assert grapec.generate(sess, prompts).tokens == free
    assert grapec.generate(sess, prompts, eos_token_id=eos).tokens == want
    assert grapec.generate(sess, [prompts[2]], max_new_tokens=5).tokens == [free[2][:5]]
    if name != "llama_optimum":   # the command line once (a process each call)
        return
    external = str(tmp_path / "model.onnx")   # as optimum writes a model over 2 GB: weights in a file beside it
    onnx.save(onnx.load(path), external, save_as_external_data=True, location="model.onnx_data", size_threshold=0)
    assert os.path.getsize(external) < os.path.getsize(path) / 4
    r = _cli("generate", external, "--prompt-ids", " ".join(map(str, prompts[0])), "--max-new-tokens", "6",
             "--backend", "cpu")
    assert r.returncode == 0 and r.stdout.splitlines()[0] == f"row 0: {' '.join(map(str, free[0][:6]))}", r.stderr
    # the folder optimum writes: the eos from HF's generation_config.json beside the model (the first of a list)
    stop = next(k for k in range(1, 6) if free[0][k] not in free[0][:k])
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [free[0][stop], VOCAB + 5]}))
    r = _cli("generate", str(tmp_path), "--prompt-ids", " ".join(map(str, prompts[0])), "--max-new-tokens", "6",
             "--backend", "cpu")
    assert r.returncode == 0 and r.stdout.splitlines()[0] == f"row 0: {' '.join(map(str, free[0][:stop + 1]))}", r.stderr


def _merged_decoder(path: str):
    """llama_optimum as optimum's merged decoder is laid out (decoder_model_merged.onnx: optimum 1.x's
    legacy export, transformers.js): one If on a use_cache_branch input, its then branch the graph with
    a past, its else branch a copy of it under other names, the branches' outputs named as the If's."""
    m = onnx.load(OPTIMUM)
    g = m.graph
    outer = {i.name for i in g.input} | {t.name for t in g.initializer}
    renamed = []
    for n in g.node:
        c = onnx.NodeProto()
        c.CopyFrom(n)
        c.input[:] = [x if not x or x in outer else "nopast/" + x for x in n.input]
        c.output[:] = ["nopast/" + x for x in n.output]
        renamed.append(c)
    nopast = [helper.make_tensor_value_info("nopast/" + o.name, o.type.tensor_type.elem_type, None) for o in g.output]
    branch = helper.make_node("If", ["use_cache_branch"], [o.name for o in g.output], name="optimum::if",
                              then_branch=helper.make_graph(list(g.node), "with_past", [], list(g.output)),
                              else_branch=helper.make_graph(renamed, "without_past", [], nopast))
    inputs = list(g.input) + [helper.make_tensor_value_info("use_cache_branch", TensorProto.BOOL, [1])]
    merged = helper.make_model(helper.make_graph([branch], g.name, inputs, list(g.output), list(g.initializer)),
                               opset_imports=list(m.opset_import))
    merged.ir_version = m.ir_version
    onnx.save(merged, path)


def test_optimums_merged_decoder_runs_its_with_past_branch(tmp_path):
    """A merged decoder's If on use_cache_branch gives way to its with-past branch (the loop always
    feeds a past): the tokens of the decoder it was made of."""
    path = str(tmp_path / "decoder_model_merged.onnx")
    _merged_decoder(path)
    prompts = prompts_of([6, 3, 8, 1], seed=8)
    bundle = Bundle.from_bytes(grapec.compile(path, generate=12, bucket_dims=[{"batch": 4, "prompt": 8}],
                                              targets=[]).to_bytes())
    assert [i["name"] for i in bundle.manifest["inputs"]] == ["prompt_ids", "prompt_lengths", "max_new_tokens",
                                                              "eos_token_id"]
    assert grapec.generate(grapec.load(bundle), prompts).tokens == reference_greedy(OPTIMUM, prompts, 12)


def test_a_growing_decoder_without_position_ids_is_refused_by_name(tmp_path):
    """optimum's Gemma export, and its legacy merged decoders, take no position_ids: the model counts
    positions from the past's length, which the window keeps fixed."""
    m = onnx.load(OPTIMUM)
    keep = [i for i in m.graph.input if i.name != "position_ids"]
    del m.graph.input[:]
    m.graph.input.extend(keep)
    m.graph.node.insert(0, helper.make_node("Constant", [], ["position_ids"],
                                            value=numpy_helper.from_array(np.zeros((1, 1), np.int64))))
    with pytest.raises(grapec.errors.ModelError, match="the positions must come from a position_ids input"):
        grapec.compile(m, generate=4, dims={"batch": 1, "prompt": 3}, targets=[])


def test_a_decoder_exported_for_one_sequence_length_is_refused_by_name(tmp_path):
    """torch.onnx's dynamo exporter specializes a dim left without a Dim to its example's size: a
    decoder whose input_ids is [1, 1] cannot take a prompt."""
    m = onnx.load(OPTIMUM)
    seq = m.graph.input[0].type.tensor_type.shape.dim[1]
    seq.Clear()
    seq.dim_value = 1
    path = str(tmp_path / "fixed.onnx")
    onnx.save(m, path)
    r = _cli("compile", path, "--generate", "4", "--dim", "batch=1,prompt=3", "--no-gpu", "-o", str(tmp_path / "f.grape"))
    assert r.returncode == 2 and "its sequence length fixed at 1" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not os.path.exists(tmp_path / "f.grape")


def test_bad_calls_name_what_is_wrong(tmp_path):
    sess = grapec.load(compiled(os.path.join(REAL, "llama_genai_fp32.onnx"), 4, [(1, 4)], targets=[]))
    with pytest.raises(grapec.errors.InputError, match="1 to 4 tokens"):
        grapec.generate(sess, [[1, 2]], max_new_tokens=5)
    with pytest.raises(grapec.errors.InputError, match="fit no bucket"):
        grapec.generate(sess, [[1, 2, 3, 4, 5]])
    with pytest.raises(grapec.errors.InputError, match="prompt_ids.*outside the valid range 0..255"):
        grapec.generate(sess, [[1, 256]])
    # the raw inputs: a row's length is at most the prompt's width (it was clipped to it, silently)
    raw = {"prompt_ids": np.array([[1, 2, 3, 4]]), "prompt_lengths": np.array([5]), "max_new_tokens": np.array(2),
           "eos_token_id": np.array(-1)}
    with pytest.raises(grapec.errors.InputError, match=r"input 'prompt_lengths' = 5, outside the valid range "
                       r"1\.\.4 \(.*at most the size of dim 1 of 'prompt_ids', 4 in this run\)"):
        sess.run(raw)
    raw["prompt_lengths"] = np.array([4])
    assert sess.run(raw)["num_generated"].tolist() == [2]
    plain = grapec.load(grapec.compile(os.path.join(ROOT, "models", "tiny", "gpt2.onnx"), dims={"batch": 1, "seq": 4},
                                       targets=[]))
    with pytest.raises(grapec.errors.BundleError, match="not compiled with --generate"):
        grapec.generate(plain, [[1, 2]])


def _growing_decoder(path: str):
    """A one-layer decoder whose present key is its past with the new keys concatenated (torch.onnx's
    DynamicCache form) but whose present value is not its past value's continuation: refused by name."""
    e = np.random.default_rng(0).standard_normal((16, 4)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["emb", "input_ids"], ["h"]),
             helper.make_node("Unsqueeze", ["h", "one"], ["k"]),
             helper.make_node("Concat", ["past_key_values.0.key", "k"], ["present.0.key"], axis=2),
             helper.make_node("Identity", ["present.0.key"], ["present.0.value"]),
             helper.make_node("MatMul", ["h", "emb_t"], ["logits"])]
    g = helper.make_graph(nodes, "grow", [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "s"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["b", "t"]),
        helper.make_tensor_value_info("past_key_values.0.key", TensorProto.FLOAT, ["b", 1, "p", 4]),
        helper.make_tensor_value_info("past_key_values.0.value", TensorProto.FLOAT, ["b", 1, "p", 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", "s", 16]),
         helper.make_tensor_value_info("present.0.key", TensorProto.FLOAT, ["b", 1, "t", 4]),
         helper.make_tensor_value_info("present.0.value", TensorProto.FLOAT, ["b", 1, "t", 4])],
        [numpy_helper.from_array(e, "emb"), numpy_helper.from_array(e.T.copy(), "emb_t"),
         numpy_helper.from_array(np.array([1], np.int64), "one")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "grapec.tools.cli", *args], capture_output=True, text=True, cwd=ROOT)


def test_the_generate_command(tmp_path):
    path = lively("fp32", str(tmp_path / "decoder.onnx"))
    prompts = prompts_of([4, 2], seed=5)
    want = reference_greedy(path, prompts, 6)
    out = str(tmp_path / "gen.grape")
    r = _cli("compile", path, "--generate", "6", "--dim", "batch=2,prompt=4,kv_cache_dim=16", "--no-gpu", "-o", out, "-q")
    assert r.returncode == 0, r.stderr
    args = [a for p in prompts for a in ("--prompt-ids", " ".join(map(str, p)))]
    r = _cli("generate", out, *args, "--backend", "cpu", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tokens"] == want
    r = _cli("generate", out, *args, "--backend", "cpu", "--stream")   # a line per row and step, as they come
    assert r.returncode == 0, r.stderr
    lines = [line.split(": ") for line in r.stdout.splitlines() if line.startswith("row ")]
    assert len(lines) == 12 and [[int(t) for k, t in lines if k == f"row {i}"] for i in range(2)] == want
    assert "(one launch, streamed;" in r.stdout
    r = _cli("generate", out, *args, "--backend", "cpu", "--stream", "--repeat", "2")
    assert r.returncode == 2 and "--stream runs the generation once" in r.stderr, r.stderr
    r = _cli("generate", path, *args, "--max-new-tokens", "6", "--dim", "kv_cache_dim=16", "--backend", "cpu")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[:2] == [f"row {i}: {' '.join(map(str, w))}" for i, w in enumerate(want)]
    assert "compiled for batch 2, prompt 4, 6 new tokens" in r.stderr
    for bad, says in ((["--prompt-ids", "1 x"], "expected token ids as integers"),
                      (["--prompt-ids", "1 999"], "prompt_ids' holds 999, outside the valid range 0..255")):
        r = _cli("generate", out, *bad, "--backend", "cpu")
        assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    r = _cli("generate", str(empty), "--prompt-ids", "1 2", "--backend", "cpu")
    assert r.returncode == 2 and "a folder without a model.onnx" in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = _cli("generate", os.path.join(ROOT, "models", "tiny", "bert.onnx"), "--prompt-ids", "1 2", "--backend", "cpu")
    assert r.returncode == 2 and "needs a decoder with past key/value inputs" in r.stderr, r.stderr
    r = _cli("compile", path, "--generate", "4", "--dim", "batch=1,prompt=4", "--no-gpu", "-o", out, "-q")
    assert r.returncode == 2 and "--dim kv_cache_dim=N" in r.stderr, r.stderr
    grow = str(tmp_path / "grow.onnx")
    _growing_decoder(grow)
    r = _cli("compile", grow, "--generate", "4", "--dim", "batch=1,prompt=3", "--no-gpu", "-o", out, "-q")
    assert r.returncode == 2 and "present.0.key grow(s) by concatenating the new keys to the past, present.0.value " \
        "not" in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.gpu
@pytest.mark.skipif(gpu_count() == 0, reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["fp32", "int4"])
def test_generation_on_the_gpu_gives_onnxruntimes_greedy_tokens(name, tmp_path):
    path = lively(name, str(tmp_path / "decoder.onnx"))
    prompts = prompts_of([7, 2, 5, 7], seed=6)
    want = reference_greedy(path, prompts, 16)
    bundle = compiled(path, 16, [(4, 8)])
    only_float32_attention_notes(bundle)
    sess = grapec.load(bundle, backend="cuda")
    for _ in range(2):   # the second run replays the graph built by the first
        assert grapec.generate(sess, prompts).tokens == want
    assert grapec.generate(sess, prompts, max_new_tokens=3).tokens == [w[:3] for w in want]
    # streamed: read beside the running graph, after a run that left other tokens in the slot
    other = prompts_of([3, 6, 4, 2], seed=7)
    want_other = reference_greedy(path, other, 16)
    tokens = grapec.stream(sess, other)
    items = list(tokens)
    assert items and [sum((item[r] for item in items), []) for r in range(4)] == want_other == tokens.result.tokens


@pytest.mark.gpu
@pytest.mark.skipif(gpu_count() == 0, reason="needs a CUDA GPU")
@pytest.mark.parametrize("path", [OPTIMUM, os.path.join(REAL, "gptj_optimum_fp16.onnx")])
def test_a_growing_cache_decoder_generates_on_the_gpu(path):
    """The Llama shape in float32, and GPT-J in fp16 (its widened q·kᵀ a half product inside the fused attention)."""
    prompts = prompts_of([6, 3, 8, 1], seed=8)
    want = reference_greedy(path, prompts, 12)
    bundle = Bundle.from_bytes(grapec.compile(path, generate=12, bucket_dims=[{"batch": 4, "prompt": 8}]).to_bytes())
    only_float32_attention_notes(bundle)
    sess = grapec.load(bundle, backend="cuda")
    for _ in range(2):
        assert grapec.generate(sess, prompts).tokens == want


@pytest.mark.gpu
@pytest.mark.skipif(gpu_count() == 0, reason="needs a CUDA GPU")
def test_sampled_generation_on_the_gpu_is_the_cpu_backends_draw(tmp_path):
    """--top-k on the GPU: TopK as grapec's selection kernel inside the graph, the same counter-based
    draw as the CPU backend's for the same seed (and onnxruntime's logits sampled in numpy)."""
    path = lively("fp32", str(tmp_path / "decoder.onnx"))
    prompts = prompts_of([6, 3, 5], seed=4)
    bundle = compiled(path, 10, [(4, 8)], top_k=8)
    only_float32_attention_notes(bundle)   # nothing on the host, the draw included
    gpu, cpu = grapec.load(bundle, backend="cuda"), grapec.load(bundle)
    for temperature, top_p, seed in ((0.7, 0.9, 3), (1.5, 1.0, -12)):
        want = reference_greedy(path, prompts, 10, choose=sampled_reference(8, temperature, top_p, seed))
        got = grapec.generate(gpu, prompts, temperature=temperature, top_p=top_p, seed=seed).tokens
        assert got == want == grapec.generate(cpu, prompts, temperature=temperature, top_p=top_p, seed=seed).tokens


def test_gptj_in_fp16_keeps_its_float32_scores_exact_and_its_attention_fused():
    """optimum's fp16 GPT-J widens q and k to float32 for q·kᵀ and its softmax (HF's GPT-J does), and
    writes its rotary as slices, a Neg and an interleaving Concat. The product of widened halves is exact
    as a half product into float32 (passes/upcast_operands.py), so each layer's attention is one fused
    kernel with no note, and the rotary and the key cache's write are a kernel each (passes/fuse.py
    `_read_share`): onnxruntime's greedy tokens."""
    path = os.path.join(REAL, "gptj_optimum_fp16.onnx")
    prompts = prompts_of([5, 3], seed=60)
    want = reference_greedy(path, prompts, 10)
    assert len({t for row in want for t in row}) > 4, "the model's weights give varied tokens"
    bundle = Bundle.from_bytes(grapec.compile(path, generate=10, bucket_dims=[{"batch": 2, "prompt": 5}],
                                              targets=[]).to_bytes())
    assert not bundle.manifest["notes"], bundle.manifest["notes"]
    fused = [k for k in bundle.kernels if k.get("kind") == "attention"]
    assert len(fused) >= 2, "each layer's attention is a fused kernel (2 layers)"
    assert grapec.generate(grapec.load(bundle), prompts).tokens == want


@pytest.mark.gpu
@pytest.mark.skipif(gpu_count() == 0, reason="needs a CUDA GPU")
def test_the_loop_bodys_profile_times_every_body_step_and_leaves_the_session_whole():
    """runtime/cuda/profile.py profile_loop_body (`benchmarks/llm.py --loop-steps`): after a generation stopped
    one token short of its cache, every step of the Loop's body timed alone and the body as one launch; the
    session then generates the reference's tokens again. A plan without a Loop is refused by name."""
    from grapec.errors import BackendError
    from grapec.runtime.cuda.profile import profile_loop_body
    path = os.path.join(REAL, "gptj_optimum_fp16.onnx")
    prompts = prompts_of([6, 3, 8, 1], seed=8)
    want = reference_greedy(path, prompts, 12)
    bundle = grapec.compile(path, generate=12, bucket_dims=[{"batch": 4, "prompt": 8}])
    sess = grapec.load(bundle, backend="cuda")
    assert grapec.generate(sess, prompts, max_new_tokens=11).tokens == [w[:11] for w in want]
    [loop] = [st for st in bundle.plans[0].steps if st.op == "loop"]
    body = profile_loop_body(sess._runner, 0, repeat=2, iterations=2)
    assert [t.index for t in body.steps] == list(range(len(loop.body.steps)))
    assert body.one_launch_us > 0 and all(t.us > 0 for t in body.steps), body
    assert grapec.generate(sess, prompts).tokens == want
    plain = grapec.load(_no_loop_bundle(), backend="cuda")
    with pytest.raises(BackendError, match="no Loop"):
        profile_loop_body(plain._runner, 0)


def _no_loop_bundle():
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    return grapec.compile(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
