"""An onnxruntime-genai builder decoder's whole generation (grapec compile --generate) against the
PyTorch peers on the same weights, in one process on one GPU (issue 35).

    python models/llm.py llama1b --out /tmp/llm --precision fp16     # the models (onnxruntime-genai's builder)
    python benchmarks/llm.py --model /tmp/llm/llama1b_fp16/model.onnx --hf /tmp/llm/llama1b_hf \\
        --batch 1 4 16 --prompt 128 --new 256 --prefill 1024 [--peers hf,compile] [--json out.json]

Per batch size: grapec's bundle (one CUDA graph launch for the prompt and every decode step) timed
with CUDA events over whole generations, once for max_new_tokens = 1 (the prompt alone) and once
for all of them: decode ms/token = (all - prompt) / (new - 1). The peers, each timed the same way:
HF generate (eager, its dynamic cache) and the gpt-fast-style static-cache decode under
torch.compile(mode="reduce-overhead") through HF generate. The weight-read limit is the weights'
bytes over a device-to-device copy's measured bandwidth: no decode step can read them faster.

onnxruntime-genai (`--peers genai`; onnxruntime-genai-cuda with onnxruntime-gpu on a GPU machine)
runs the same builder folder the way its users run it: a Generator per generation, `append_tokens`
with the prompt, then `generate_next_token` once per token, min_length = max_length so that no row
stops early; once with the builder's config (CUDA graphs off) and once with `enable_cuda_graph` on.
Its times are wall-clock around the whole generation (its API has no stream to put events on;
grapec's one launch loses nothing to that difference). Greedy tokens are compared with HF's and
onnxruntime-genai's at batch 1; with random weights the top logits are close, so fp16 runs part
where rounding flips a near tie, and fp32 runs should agree.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "src")]


def copy_bandwidth() -> float:
    """Bytes per second of a 1 GiB device-to-device copy (read + write counted once: the bytes a
    decode step must stream are read once)."""
    import torch
    a = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(10):
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    del a, b
    return 2 * 2**30 / float(np.median(times))   # a copy reads and writes each byte


def grapec_rows(path: str, batches: list, prompt: int, new: int, prefill: int | None, iters: int, say) -> tuple:
    import grapec
    from grapec.tools.bench import bench_grapec
    buckets = [{"batch": b, "prompt": prompt} for b in batches] + ([{"batch": 1, "prompt": prefill}] if prefill else [])
    t0 = time.perf_counter()
    bundle = grapec.compile(path, generate=new, bucket_dims=buckets, progress=say)
    say(f"compiled {len(buckets)} buckets in {time.perf_counter() - t0:.0f}s; weights {bundle.manifest['weights_bytes'] / 2**30:.2f} GiB")
    rng = np.random.default_rng(0)
    vocab = int(bundle.manifest["metadata"].get("grapec.input_range.prompt_ids", "0:32000").split(":")[1]) + 1
    rows, tokens = {}, None
    for b in batches + ([("prefill", 1)] if prefill else []):
        batch, width = (1, prefill) if isinstance(b, tuple) else (b, prompt)
        feeds = {"prompt_ids": rng.integers(0, vocab, (batch, width)).astype(np.int64),
                 "prompt_lengths": np.full(batch, width, np.int64), "max_new_tokens": np.array(1, np.int64),
                 "eos_token_id": np.array(-1, np.int64)}
        first = bench_grapec(bundle, feeds, iters, warmup=2)
        if isinstance(b, tuple):
            rows["prefill"] = {"ms": first["replay"]["median_ms"], "tokens": width}
            continue
        full = bench_grapec(bundle, dict(feeds, max_new_tokens=np.array(new, np.int64)), iters, warmup=1)
        all_ms, pre_ms = full["replay"]["median_ms"], first["replay"]["median_ms"]
        rows[b] = {"prompt_ms": pre_ms, "all_ms": all_ms, "decode_ms_per_token": (all_ms - pre_ms) / (new - 1),
                   "tokens_per_s": b * new / (all_ms / 1e3), "launches": full["launches"],
                   "device_memory_mib": full["device_memory_mib"], "feeds": feeds}
        if b == batches[0] and batch == 1:
            tokens = full.get("tokens")
        say(f"grapec batch {b}: prompt {pre_ms:.2f} ms, all {all_ms:.2f} ms, {rows[b]['decode_ms_per_token']:.3f} ms/token")
    return bundle, rows, tokens


def static_decoder(model, batch: int, max_len: int):
    """gpt-fast's form over a transformers Llama's own modules and weights: a KV cache of max_len
    positions in module buffers, written in place at the step's positions, attention over the whole
    cache with a mask (SDPA, grouped heads); the decode step is what torch.compile captures."""
    import torch
    from torch import nn
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    cfg = model.config
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    dev, dtype = model.lm_head.weight.device, model.lm_head.weight.dtype

    class Static(nn.Module):
        def __init__(self):
            super().__init__()
            shape = (cfg.num_hidden_layers, batch, kv_heads, max_len, head_dim)
            self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=dev))
            self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=dev))

        def forward(self, ids, pos):   # ids [B, S]; pos [S]: the positions the S tokens take, every row alike
            inner, s = model.model, ids.shape[1]
            h = inner.embed_tokens(ids)
            cos, sin = inner.rotary_emb(h, pos[None].expand(ids.shape[0], -1))
            mask = torch.arange(max_len, device=dev)[None, :] <= pos[:, None]        # [S, max_len]
            for i, layer in enumerate(inner.layers):
                att = layer.self_attn
                a = layer.input_layernorm(h)
                q = att.q_proj(a).view(batch, s, heads, head_dim).transpose(1, 2)
                k = att.k_proj(a).view(batch, s, kv_heads, head_dim).transpose(1, 2)
                v = att.v_proj(a).view(batch, s, kv_heads, head_dim).transpose(1, 2)
                q, k = apply_rotary_pos_emb(q, k, cos, sin)
                self.k[i].index_copy_(2, pos, k)
                self.v[i].index_copy_(2, pos, v)
                o = torch.nn.functional.scaled_dot_product_attention(q, self.k[i], self.v[i], attn_mask=mask,
                                                                     enable_gqa=True)
                h = h + att.o_proj(o.transpose(1, 2).reshape(batch, s, heads * head_dim))
                h = h + layer.mlp(layer.post_attention_layernorm(h))
            return model.lm_head(inner.norm(h[:, -1]))
    return Static()


def static_generate(dec, step, ids, new: int, compiled: bool):
    """Greedy with a static_decoder: the prompt through the module itself, then `new` - 1 decode
    steps through `step` (the module, or its compiled form); -> [B, new] token ids."""
    import torch
    dev = ids.device
    tok = dec(ids, torch.arange(ids.shape[1], device=dev)).argmax(-1, keepdim=True)
    out = [tok]
    for t in range(ids.shape[1], ids.shape[1] + new - 1):
        if compiled:
            torch.compiler.cudagraph_mark_step_begin()
        tok = step(tok, torch.tensor([t], device=dev)).argmax(-1, keepdim=True).clone()
        out.append(tok)
    return torch.cat(out, 1)


def hf_rows(hf: str, grapec_rows_: dict, batches: list, new: int, prefill: int | None, eager: bool, compiled: bool,
            say) -> dict:
    """HF generate on the same prompts (eager), and with a static cache under torch.compile."""
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(hf, torch_dtype=torch.float16).cuda().eval()
    out = {}

    def timed(fn, n):
        fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(n):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            r = fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e))
        return float(np.median(times)), r

    modes = (["hf"] if eager else []) + (["compile"] if compiled else [])
    compiled_step = lambda dec: torch.compile(dec, mode="reduce-overhead", fullgraph=True)  # noqa: E731
    for mode in modes:
        for b in batches:
            ids = torch.from_numpy(grapec_rows_[b]["feeds"]["prompt_ids"]).cuda()
            mask = torch.ones_like(ids)
            try:
                if mode == "hf":
                    gen = lambda n: model.generate(ids, attention_mask=mask, max_new_tokens=n,  # noqa: E731
                                                   min_new_tokens=n, do_sample=False, pad_token_id=0)
                else:   # gpt-fast's loop: a static cache, the decode step under torch.compile
                    dec = static_decoder(model, b, ids.shape[1] + new)
                    step = compiled_step(dec)
                    gen = lambda n: static_generate(dec, step, ids, n, True)  # noqa: E731
                with torch.no_grad():
                    pre_ms, _ = timed(lambda: gen(1), 3)
                    all_ms, toks = timed(lambda: gen(new), 2)
            except Exception as e:  # noqa: BLE001 - a peer failing is reported, the others still run
                out[(mode, b)] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
                say(f"{mode} batch {b} failed: {out[(mode, b)]['error']}")
                continue
            out[(mode, b)] = {"prompt_ms": pre_ms, "all_ms": all_ms, "decode_ms_per_token": (all_ms - pre_ms) / (new - 1),
                              "tokens_per_s": b * new / (all_ms / 1e3),
                              "tokens": (toks[0, ids.shape[1]:] if mode == "hf" else toks[0]).tolist()}
            say(f"{mode} batch {b}: prompt {pre_ms:.2f} ms, all {all_ms:.2f} ms, "
                f"{out[(mode, b)]['decode_ms_per_token']:.3f} ms/token")
    if prefill and eager:
        ids = torch.from_numpy(grapec_rows_["prefill"]["feeds"]["prompt_ids"] if "feeds" in grapec_rows_["prefill"]
                               else np.random.default_rng(1).integers(0, model.config.vocab_size, (1, prefill))).cuda()
        with torch.no_grad():
            ms, _ = timed(lambda: model(ids, use_cache=False).logits, 5)
        out[("hf", "prefill")] = {"ms": ms}
    return out


def first_difference(ours: list, theirs: list) -> int:
    return next((i for i, (x, y) in enumerate(zip(ours, theirs)) if x != y), min(len(ours), len(theirs)))


def near_tie(model, prompt: np.ndarray, ours: list, theirs: list) -> dict:
    """Where grapec's and onnxruntime-genai's greedy tokens first differ: onnxruntime-genai's own logits
    after the prompt and the tokens both chose, for the two tokens, and fp16's spacing at that size (a
    gap within a few spacings is a rounding tie, not a wrong model)."""
    import onnxruntime_genai as og
    d = first_difference(ours, theirs)
    seq = np.concatenate([prompt, np.asarray(ours[:d], prompt.dtype)])[None]
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=seq.shape[1] + 1, do_sample=False, batch_size=1)
    g = og.Generator(model, params)
    g.append_tokens(seq)
    logits = np.asarray(g.get_logits(), np.float32).reshape(-1)
    a, b = float(logits[ours[d]]), float(logits[theirs[d]])
    return {"at": d, "grapec_token": int(ours[d]), "genai_token": int(theirs[d]), "logit_grapec_token": a,
            "logit_genai_token": b, "gap": b - a, "fp16_spacing": float(np.spacing(np.float16(max(abs(a), abs(b)))))}


def genai_generate(model, ids: np.ndarray, n: int) -> np.ndarray:
    """n greedy tokens after the prompt ids [batch, prompt], as onnxruntime-genai's users loop; -> row
    0's tokens, copied to the host (so the generation has finished)."""
    import onnxruntime_genai as og
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=ids.shape[1] + n, min_length=ids.shape[1] + n, do_sample=False,
                              batch_size=ids.shape[0])
    g = og.Generator(model, params)
    g.append_tokens(ids)
    for _ in range(n):
        g.generate_next_token()
    return g.get_sequence(0)[ids.shape[1]:]


def genai_timed(model, ids: np.ndarray, n: int, reps: int) -> tuple:
    """Median wall-clock ms of genai_generate after one warm-up, and its tokens."""
    genai_generate(model, ids, n)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        toks = genai_generate(model, ids, n)
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times)), toks


def genai_rows(model_dir: str, grapec_rows_: dict, batches: list, new: int, grapec_tokens: list | None, modes: set,
               say) -> dict:
    """onnxruntime-genai on the builder's folder, greedy, with CUDA graphs as the builder leaves them
    (off) and on: {(mode, batch): row}; where its batch-1 tokens part from grapec's, the row's
    "divergence" holds its logits there (near_tie)."""
    import onnxruntime_genai as og
    out = {}
    for mode, graph in (("genai", None), ("genai-graph", "1")):
        if mode not in modes:
            continue
        try:
            cfg = og.Config(model_dir)
            if graph:
                cfg.clear_providers()
                cfg.append_provider("cuda")
                cfg.set_provider_option("cuda", "enable_cuda_graph", graph)
            model = og.Model(cfg)
        except Exception as e:  # noqa: BLE001 - a peer failing is reported, the others still run
            say(f"{mode} failed to load: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
            continue
        for b in batches:
            ids = grapec_rows_[b]["feeds"]["prompt_ids"].astype(np.int32)
            try:
                pre_ms, _ = genai_timed(model, ids, 1, 3)
                all_ms, toks = genai_timed(model, ids, new, 2)
            except Exception as e:  # noqa: BLE001
                out[(mode, b)] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
                say(f"{mode} batch {b} failed: {out[(mode, b)]['error']}")
                continue
            out[(mode, b)] = {"prompt_ms": pre_ms, "all_ms": all_ms, "decode_ms_per_token": (all_ms - pre_ms) / (new - 1),
                              "tokens_per_s": b * new / (all_ms / 1e3), "tokens": [int(t) for t in toks]}
            if mode == "genai" and b == batches[0] == 1 and grapec_tokens and \
                    first_difference(grapec_tokens, out[(mode, b)]["tokens"]) < min(len(grapec_tokens), len(toks)):
                out[(mode, b)]["divergence"] = near_tie(model, ids[0], grapec_tokens, out[(mode, b)]["tokens"])
            say(f"{mode} batch {b}: prompt {pre_ms:.2f} ms, all {all_ms:.2f} ms, "
                f"{out[(mode, b)]['decode_ms_per_token']:.3f} ms/token")
    return out


def step_profiles(path: str, prefill: int, past: int, say, batch: int = 1) -> dict:
    """Each step's GPU time alone: the prompt pass of `prefill` tokens (the generation bundle with one
    new token; none where prefill is 0), and one decode step of the decoder compiled alone (`batch` rows,
    a past buffer `past` long, as onnxruntime-genai's CUDA runtime shares it with the present).
    -> {name: [step..]}, slowest first."""
    import onnx
    import grapec
    from grapec.tools.bench import bench_grapec
    out, launches = {}, {}
    if prefill:
        b = grapec.compile(path, generate=1, dims={"batch": 1, "prompt": prefill})
        feeds = {"prompt_ids": np.random.default_rng(0).integers(0, 1000, (1, prefill)).astype(np.int64),
                 "prompt_lengths": np.array([prefill]), "max_new_tokens": np.array(1), "eos_token_id": np.array(-1)}
        res = bench_grapec(b, feeds, 3, warmup=1, per_step=True)
        out[f"prompt {prefill}"], launches[f"prompt {prefill}"] = res["steps"], res["replay"]["median_ms"]
    m = onnx.load(path, load_external_data=False)
    kv = [i for i in m.graph.input if i.name.startswith("past_key_values")]
    kv_dtype = np.float16 if kv[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16 else np.float32
    feeds = {"input_ids": np.full((batch, 1), 5), "attention_mask": np.ones((batch, past), np.int64)}
    if any(i.name == "position_ids" for i in m.graph.input):
        # optimum's export: the mask spans the past and the new token, which sits at position `past`
        feeds["attention_mask"], feeds["position_ids"] = np.ones((batch, past + 1), np.int64), np.full((batch, 1), past)
    for i in kv:
        # [batch, kv heads, past, head size] in both the builder's and optimum's exports; the builder names the
        # head size (genai_config.json has it), optimum fixes it
        heads, head_size = (i.type.tensor_type.shape.dim[d].dim_value for d in (1, 3))
        if not head_size:
            head_size = json.load(open(os.path.join(os.path.dirname(path), "genai_config.json")))["model"][
                "decoder"]["head_size"]
        feeds[i.name] = np.zeros((batch, heads, past, head_size), kv_dtype)
    b = grapec.compile(path, shapes={k: v.shape for k, v in feeds.items()})
    res = bench_grapec(b, feeds, 20, warmup=3, per_step=True)
    step = f"decode step, batch {batch}, past {past}"
    out[step], launches[step] = res["steps"], res["replay"]["median_ms"]
    for name, steps in out.items():
        steps.sort(key=lambda st: -st["us"])
        # one launch of the graph against its steps alone: what the gaps between nodes add (a decode step in
        # the generation loop adds the loop's own cost to this: compare with the ms/token of a generation)
        say(f"{name}: {len(steps)} steps, {sum(st['us'] for st in steps):.0f} us alone, one launch of its graph "
            f"{1000 * launches[name]:.0f} us; slowest:")
        for st in steps[:12]:
            say(f"  {st['us']:9.1f} us  {st['kind']:10s} {' '.join(st['origin'])[:110]}")
    return out


def loop_profile(path: str, batch: int, prompt: int, new: int, say) -> dict:
    """The generation loop's body (runtime/cuda/profile.py profile_loop_body) at `batch` rows: each step alone,
    the body's steps as one launch, and the loop's measured time a token beside them; what the loop adds to
    the decoder's step (--steps times that compiled alone). -> {name: [step..]}, slowest first."""
    import grapec
    from grapec.tools.bench import bench_grapec
    bundle = grapec.compile(path, generate=new, dims={"batch": batch, "prompt": prompt}, progress=say)
    vocab = int(bundle.manifest["metadata"].get("grapec.input_range.prompt_ids", "0:32000").split(":")[1]) + 1
    feeds = {"prompt_ids": np.random.default_rng(0).integers(0, vocab, (batch, prompt)).astype(np.int64),
             "prompt_lengths": np.full(batch, prompt, np.int64), "max_new_tokens": np.array(1, np.int64),
             "eos_token_id": np.array(-1, np.int64)}
    first = bench_grapec(bundle, feeds, 3, warmup=1)["replay"]["median_ms"]
    # one token short of the cache: the body then re-runs at positions inside it (profile_loop_body)
    full = bench_grapec(bundle, dict(feeds, max_new_tokens=np.array(new - 1, np.int64)), 3, warmup=1, loop_body=True)
    per_token_us = (full["replay"]["median_ms"] - first) / (new - 2) * 1e3
    body = full["loop_body"]
    steps = sorted(body["steps"], key=lambda st: -st["us"])
    name = f"generation loop body, batch {batch}"
    say(f"{name}: {len(steps)} steps, {sum(st['us'] for st in steps):.0f} us alone, one launch of its steps "
        f"{body['one_launch_us']:.0f} us, the loop {per_token_us:.0f} us a token; slowest:")
    for st in steps[:16]:
        say(f"  {st['us']:9.1f} us  {st['kind']:10s} {' '.join(st['origin'])[:110]}")
    return {name: steps, f"{name}: one launch us": body["one_launch_us"], f"{name}: loop us a token": per_token_us}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="the builder's model.onnx (genai_config.json beside it)")
    ap.add_argument("--hf", help="the transformers checkpoint of the same weights (models/llm.py writes it)")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--prefill", type=int, default=1024, help="also time one prompt this long (0: no)")
    ap.add_argument("--peers", default="hf,compile,genai,genai-graph",
                    help="comma-separated: hf, compile, genai, genai-graph (or none)")
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--steps", action="store_true", help="only profile each step of a prompt pass (--prefill long) "
                    "and of one decode step (past --prompt + --new long), alone")
    ap.add_argument("--step-batch", type=int, default=1, help="with --steps or --loop-steps: the decode step's rows")
    ap.add_argument("--loop-steps", action="store_true", help="only profile the generation loop's body (--prompt, "
                    "--new): each step alone, the body as one launch, the loop's time a token")
    ap.add_argument("--bundle-per-batch", action="store_true",
                    help="also time each batch in a bundle of its own (one bucket), beside the bundle of all batches")
    a = ap.parse_args()
    say = lambda m: print(f"[llm] {m}", flush=True)  # noqa: E731
    if a.steps or a.loop_steps:
        prof = step_profiles(a.model, a.prefill, a.prompt + a.new, say, a.step_batch) if a.steps else \
            loop_profile(a.model, a.step_batch, a.prompt, a.new, say)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(prof, f, indent=1)
        return
    bw = copy_bandwidth()
    bundle, g, tokens = grapec_rows(a.model, a.batch, a.prompt, a.new, a.prefill or None, a.iterations, say)
    # a bundle of several buckets merges kernels that differ only in sizes into functions that take them as
    # arguments (codegen/module.py); one bucket keeps every literal. Sessions 58 and 61 saw batch 16 run 1.66 ms/token
    # alone and 2.21 in a bundle of three, in different processes
    own = {b: grapec_rows(a.model, [b], a.prompt, a.new, None, a.iterations, say)[1][b] for b in a.batch} \
        if a.bundle_per_batch and len(a.batch) > 1 else {}
    limit_ms = bundle.manifest["weights_bytes"] / bw * 1e3
    peers = {}
    wanted = {p for p in a.peers.split(",") if p and p != "none"}
    if wanted & {"genai", "genai-graph"}:
        peers.update(genai_rows(os.path.dirname(os.path.abspath(a.model)), g, a.batch, a.new, tokens, wanted, say))
    if wanted & {"hf", "compile"} and a.hf:
        peers.update(hf_rows(a.hf, g, a.batch, a.new, a.prefill or None, "hf" in wanted, "compile" in wanted, say))
    print(f"\n{os.path.basename(os.path.dirname(a.model))}: prompt {a.prompt}, {a.new} new tokens, greedy; "
          f"weights {bundle.manifest['weights_bytes'] / 2**30:.2f} GiB; copy bandwidth {bw / 1e9:.0f} GB/s -> "
          f"weight-read limit {limit_ms:.3f} ms/token")
    modes = {"genai": "onnxruntime-genai", "genai-graph": "onnxruntime-genai CUDA graph", "hf": "HF eager",
             "compile": "torch.compile static"}
    print("| batch | grapec ms/token | tokens/s | of limit | "
          + " | ".join(f"{name} ms/token (x)" for name in modes.values()) + " |")
    print("|---" * (4 + len(modes)) + "|")
    for b in a.batch:
        r = g[b]
        cells = []
        for mode in modes:
            p = peers.get((mode, b))
            cells.append("-" if not p else p.get("error", "")[:40] or
                         f"{p['decode_ms_per_token']:.3f} ({p['decode_ms_per_token'] / r['decode_ms_per_token']:.2f}x)")
        print(f"| {b} | {r['decode_ms_per_token']:.3f} | {r['tokens_per_s']:.0f} | "
              f"{limit_ms / r['decode_ms_per_token'] * 100:.0f}% | " + " | ".join(cells) + " |")
    for b, r in own.items():
        print(f"batch {b} in a bundle of its own: {r['decode_ms_per_token']:.3f} ms/token "
              f"(in the bundle of all batches: {g[b]['decode_ms_per_token']:.3f})")
    if a.prefill:
        hp = peers.get(("hf", "prefill"))
        print(f"prefill of {a.prefill} tokens (batch 1): grapec {g['prefill']['ms']:.2f} ms (its first token included)"
              + (f", HF forward {hp['ms']:.2f} ms" if hp else ""))
    for mode in ("genai", "hf"):
        theirs = peers.get((mode, a.batch[0]), {}).get("tokens")
        if tokens and theirs:
            same = first_difference(tokens, theirs)
            print(f"greedy tokens at batch {a.batch[0]}: grapec and {modes[mode]} agree on the first {same} of "
                  f"{len(tokens)}" + ("" if same == len(tokens) else f" (grapec {tokens[same]}, {modes[mode]} {theirs[same]})"))
            tie = peers[(mode, a.batch[0])].get("divergence")
            if tie:
                print(f"  there onnxruntime-genai's logits: {tie['logit_genai_token']:.4f} for its token, "
                      f"{tie['logit_grapec_token']:.4f} for grapec's: a gap of {tie['gap']:.4f}, fp16 spacing "
                      f"{tie['fp16_spacing']:.4f}")
    if a.json:
        dump = {"limit_ms_per_token": limit_ms, "bandwidth_gbs": bw / 1e9,
                "grapec": {str(k): {kk: vv for kk, vv in v.items() if kk != "feeds"} for k, v in g.items()},
                "peers": {f"{k[0]}:{k[1]}": v for k, v in peers.items()}, "grapec_tokens": tokens}
        with open(a.json, "w") as f:
            json.dump(dump, f, indent=1)


if __name__ == "__main__":
    main()
