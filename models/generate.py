"""gpt2_generate: greedy decoding with GPT-2 and a static KV cache, as one ONNX Loop.

The whole generation is one graph: a Loop whose body is one GPT-2 decode step at a position the loop
counter gives. There is no Python between tokens, so a compiler that keeps Loop on the device can run
all of it as one launch.

    inputs : prompt_ids      int64 [1, P]  the prompt (P fixed per size)
             max_new_tokens  int64 []      tokens to generate, 1..N (N = the cache's room past the prompt)
             eos_token_id    int64 []      stop after emitting this id; -1 never stops early
    outputs: generated       int64 [N]     the new ids, then -1
             num_generated   int64 []      how many ids were generated (the eos, if any, included)

Trip count P - 1 + max_new_tokens. Step i reads token i of the carried token buffer (prompt first, then
generated), writes its key and value into row i of each layer's cache [heads, P + N, head_dim] (a
one-hot Where, so the cache is updated in place), attends over rows 0..i, and takes the argmax of the
logits. Steps before P - 1 only fill the cache (token-at-a-time prefill); from step P - 1 on, the argmax
is stored at position i + 1 and counted, and an eos ends the loop.

The weights are a `transformers.GPT2LMHeadModel`'s (the gpt2 zoo model's), and `GreedyDecode` is the
reference: a plain PyTorch greedy loop over that model with its own KV cache.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MASKED_SCORE = -30000.0   # finite in float16, and far below any real attention score
LN_EPS = 1e-5


def gpt2_weights(model) -> dict[str, np.ndarray]:
    """A transformers GPT2LMHeadModel's parameters as float32 numpy arrays, with the names used below."""
    sd = {k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}
    w = {"wte": sd["transformer.wte.weight"], "wpe": sd["transformer.wpe.weight"],
         "lnf_g": sd["transformer.ln_f.weight"], "lnf_b": sd["transformer.ln_f.bias"]}
    w["lm_head"] = np.ascontiguousarray(sd["lm_head.weight"].T)   # [E, V]
    for layer in range(model.config.n_layer):
        p = f"transformer.h.{layer}."
        for ours, theirs in (("ln1_g", "ln_1.weight"), ("ln1_b", "ln_1.bias"), ("qkv_w", "attn.c_attn.weight"),
                             ("qkv_b", "attn.c_attn.bias"), ("proj_w", "attn.c_proj.weight"),
                             ("proj_b", "attn.c_proj.bias"), ("ln2_g", "ln_2.weight"), ("ln2_b", "ln_2.bias"),
                             ("fc_w", "mlp.c_fc.weight"), ("fc_b", "mlp.c_fc.bias"),
                             ("out_w", "mlp.c_proj.weight"), ("out_b", "mlp.c_proj.bias")):
            w[f"h{layer}.{ours}"] = sd[p + theirs]   # GPT-2's Conv1D weights are already [in, out]
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in w.items()}


class _Body:
    """Collects the decode step's nodes; each helper returns the name of its output."""

    def __init__(self):
        self.nodes: list[onnx.NodeProto] = []
        self.n = 0

    def add(self, op: str, inputs: list[str], name: str | None = None, **attrs) -> str:
        self.n += 1
        out = name or f"{op.lower()}_{self.n}"
        self.nodes.append(helper.make_node(op, inputs, [out], name=f"{op}_{self.n}", **attrs))
        return out

    def gelu_tanh(self, x: str) -> str:
        """GPT-2's gelu_new: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
        x3 = self.add("Mul", [self.add("Mul", [x, x]), x])
        inner = self.add("Add", [x, self.add("Mul", [x3, "c_gelu_a"])])
        t = self.add("Tanh", [self.add("Mul", [inner, "c_gelu_s"])])
        return self.add("Mul", [self.add("Mul", [x, "c_half"]), self.add("Add", [t, "c_one_f"])])


def _layer(b: _Body, layer: int, h: str, cfg: dict) -> str:
    """One transformer block at the step's position; returns the new hidden state [1, E]."""
    E, H = cfg["n_embd"], cfg["n_head"]
    p = f"h{layer}."
    a = b.add("LayerNormalization", [h, p + "ln1_g", p + "ln1_b"], axis=-1, epsilon=LN_EPS)
    qkv = b.add("Add", [b.add("MatMul", [a, p + "qkv_w"]), p + "qkv_b"])          # [1, 3E]
    q, k, v = f"q{layer}", f"k{layer}", f"v{layer}"
    b.nodes.append(helper.make_node("Split", [qkv, "split_qkv"], [q, k, v], name=f"Split_h{layer}", axis=1))
    q, k, v = (b.add("Reshape", [t, "heads_shape"]) for t in (q, k, v))            # [H, 1, D]
    # this position's key and value go into row i of the caches; the old caches are read only here
    k_cache = b.add("Where", ["at_pos", k, f"k_cache{layer}_in"], name=f"k_cache{layer}_out")
    v_cache = b.add("Where", ["at_pos", v, f"v_cache{layer}_in"], name=f"v_cache{layer}_out")
    kt = b.add("Transpose", [k_cache], perm=[0, 2, 1])                               # [H, D, T]
    scores = b.add("Mul", [b.add("MatMul", [q, kt]), "c_scale"])                     # [H, 1, T]
    scores = b.add("Where", ["visible", scores, "c_masked"])
    probs = b.add("Softmax", [scores], axis=-1)
    ctx = b.add("Reshape", [b.add("MatMul", [probs, v_cache]), "row_shape"])        # [1, E]
    h = b.add("Add", [h, b.add("Add", [b.add("MatMul", [ctx, p + "proj_w"]), p + "proj_b"])])
    m = b.add("LayerNormalization", [h, p + "ln2_g", p + "ln2_b"], axis=-1, epsilon=LN_EPS)
    m = b.gelu_tanh(b.add("Add", [b.add("MatMul", [m, p + "fc_w"]), p + "fc_b"]))
    m = b.add("Add", [b.add("MatMul", [m, p + "out_w"]), p + "out_b"])
    assert E % H == 0
    return b.add("Add", [h, m])


def decode_graph(w: dict[str, np.ndarray], cfg: dict, opset: int = 17) -> onnx.ModelProto:
    """The ONNX model (see the module docstring). cfg: n_layer, n_embd, n_head, vocab_size,
    n_positions, prompt_len, max_new_tokens."""
    L, E, H, V = cfg["n_layer"], cfg["n_embd"], cfg["n_head"], cfg["vocab_size"]
    P, N = cfg["prompt_len"], cfg["max_new_tokens"]
    T, D = P + N, E // H
    if T > cfg["n_positions"]:
        raise ValueError(f"prompt_len + max_new_tokens = {T} exceeds n_positions {cfg['n_positions']}")
    f32, i64, b8 = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
    vi = helper.make_tensor_value_info
    cache = [H, T, D]

    b = _Body()
    b.add("Gather", ["tokens_in", "iter"], name="token")                          # scalar
    x = b.add("Add", [b.add("Gather", ["wte", "token"], axis=0), b.add("Gather", ["wpe", "iter"], axis=0)])
    h = b.add("Unsqueeze", [x, "axes0"])                                           # [1, E]
    b.add("Reshape", [b.add("Equal", ["positions", "iter"]), "at_pos_shape"], name="at_pos")     # [1, T, 1]
    b.add("Reshape", [b.add("LessOrEqual", ["positions", "iter"]), "visible_shape"], name="visible")  # [1, 1, T]
    for layer in range(L):
        h = _layer(b, layer, h, cfg)
    h = b.add("LayerNormalization", [h, "lnf_g", "lnf_b"], axis=-1, epsilon=LN_EPS)
    logits = b.add("MatMul", [h, "lm_head"])                                       # [1, V]
    nxt = b.add("Squeeze", [b.add("ArgMax", [logits], axis=1, keepdims=0), "axes0"], name="next_token")
    j = b.add("Add", ["iter", "c_one"])
    generating = b.add("GreaterOrEqual", [j, "c_prompt_len"])                     # the argmax is a new token
    write = b.add("And", [b.add("Equal", ["positions", j]), generating])
    b.add("Where", [write, nxt, "tokens_in"], name="tokens_out")
    b.add("Add", ["count_in", b.add("Cast", [generating], to=i64)], name="count_out")
    b.add("Not", [b.add("And", [generating, b.add("Equal", [nxt, "eos_token_id"])])], name="cond_out")

    carried_in = [vi("tokens_in", i64, [T]), vi("count_in", i64, [])]
    carried_out = [vi("tokens_out", i64, [T]), vi("count_out", i64, [])]
    for layer in range(L):
        for kv in "kv":
            carried_in.append(vi(f"{kv}_cache{layer}_in", f32, cache))
            carried_out.append(vi(f"{kv}_cache{layer}_out", f32, cache))
    body = helper.make_graph(b.nodes, "decode_step",
                             [vi("iter", i64, []), vi("cond_in", b8, [])] + carried_in,
                             [vi("cond_out", b8, [])] + carried_out)

    def const(name, arr):
        return numpy_helper.from_array(np.asarray(arr), name)

    caches0 = [f"{kv}_cache{layer}_0" for layer in range(L) for kv in "kv"]
    nodes = [
        helper.make_node("Reshape", ["prompt_ids", "prompt_shape"], ["prompt_flat"]),
        helper.make_node("Concat", ["prompt_flat", "unwritten"], ["tokens_0"], axis=0),
        helper.make_node("Add", ["max_new_tokens", "c_prompt_len_m1"], ["trip_count"]),
        helper.make_node("ConstantOfShape", ["cache_shape"], ["cache_zeros"],
                         value=numpy_helper.from_array(np.zeros(1, np.float32))),
    ] + [helper.make_node("Identity", ["cache_zeros"], [c]) for c in caches0] + [
        helper.make_node("Loop", ["trip_count", "c_true", "tokens_0", "count_0"] + caches0,
                         ["tokens_final", "num_generated"] + [f"{c}_final" for c in caches0],
                         name="generate", body=body),
        helper.make_node("Slice", ["tokens_final", "gen_start", "gen_end"], ["generated"]),
    ]
    inits = [const(k, v) for k, v in sorted(w.items())] + [
        const("prompt_shape", np.array([P], np.int64)),
        const("unwritten", np.full((N,), -1, np.int64)),
        const("c_prompt_len_m1", np.array(P - 1, np.int64)),
        const("cache_shape", np.array(cache, np.int64)),
        const("c_true", np.array(True)),
        const("count_0", np.array(0, np.int64)),
        const("gen_start", np.array([P], np.int64)),
        const("gen_end", np.array([T], np.int64)),
        # read by the body (outer scope)
        const("positions", np.arange(T, dtype=np.int64)),
        const("axes0", np.array([0], np.int64)),
        const("at_pos_shape", np.array([1, T, 1], np.int64)),
        const("visible_shape", np.array([1, 1, T], np.int64)),
        const("heads_shape", np.array([H, 1, D], np.int64)),
        const("row_shape", np.array([1, E], np.int64)),
        const("split_qkv", np.array([E, E, E], np.int64)),
        const("c_scale", np.array(1.0 / np.sqrt(D), np.float32)),
        const("c_masked", np.array(MASKED_SCORE, np.float32)),
        const("c_gelu_a", np.array(0.044715, np.float32)),
        const("c_gelu_s", np.array(np.sqrt(2.0 / np.pi), np.float32)),
        const("c_half", np.array(0.5, np.float32)),
        const("c_one_f", np.array(1.0, np.float32)),
        const("c_one", np.array(1, np.int64)),
        const("c_prompt_len", np.array(P, np.int64)),
    ]
    graph = helper.make_graph(
        nodes, "gpt2_greedy_generate",
        [vi("prompt_ids", i64, [1, P]), vi("max_new_tokens", i64, []), vi("eos_token_id", i64, [])],
        [vi("generated", i64, [N]), vi("num_generated", i64, [])],
        initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             producer_name="grapec-zoo", ir_version=8)


def greedy_decode_module(model, prompt_len: int, max_new: int):
    """torch module: (prompt_ids [1, P], max_new_tokens [], eos_token_id []) -> (generated [N], count []).

    The reference the ONNX Loop is checked against: transformers' GPT-2 forward, one token at a time
    with its own KV cache, argmax, stop at eos."""
    import torch

    class GreedyDecode(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        @torch.no_grad()
        def forward(self, prompt_ids, max_new_tokens, eos_token_id):
            n, eos = int(max_new_tokens), int(eos_token_id)
            if not 1 <= n <= max_new:
                raise ValueError(f"max_new_tokens must be in 1..{max_new}, got {n}")
            out = torch.full((max_new,), -1, dtype=torch.int64)
            ids, past, count = prompt_ids, None, 0
            for step in range(n):
                o = self.model(input_ids=ids, past_key_values=past, use_cache=True, return_dict=True)
                past = o.past_key_values
                nxt = int(o.logits[0, -1].argmax())
                out[step] = nxt
                count += 1
                if nxt == eos:
                    break
                ids = torch.tensor([[nxt]], dtype=torch.int64)
            return out, torch.tensor(count, dtype=torch.int64)

        def generation_peers(self, feeds: dict, half: bool = False) -> dict:
            """What `grapec bench --vs torch` measures against a one-launch generation (see generation_peers)."""
            return generation_peers(self.model, feeds["prompt_ids"], int(feeds["max_new_tokens"]), half)

    return GreedyDecode().eval()


def static_cache_decoder(model, max_len: int):
    """gpt-fast-style GPT-2 over transformers' weights: the KV caches are fixed-size buffers, a step
    writes its keys and values at `input_pos` (index_copy_) and attends with a mask over all max_len
    rows, so every decode step has the same shapes and can be captured into a CUDA graph or compiled.
    forward(idx [1, S], input_pos [S]) -> the argmax token after the last position, [1]."""
    import torch
    import torch.nn.functional as F

    cfg = model.config
    L, H, E = cfg.n_layer, cfg.n_head, cfg.n_embd

    class StaticCacheGPT2(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gpt = model
            p = next(model.parameters())
            self.register_buffer("k", torch.zeros(L, 1, H, max_len, E // H, dtype=p.dtype, device=p.device))
            self.register_buffer("v", torch.zeros_like(self.k))
            self.register_buffer("causal", torch.ones(max_len, max_len, dtype=torch.bool, device=p.device).tril())

        def forward(self, idx, input_pos):
            t = self.gpt.transformer
            x = t.wte(idx) + t.wpe(input_pos)[None]
            mask = self.causal[input_pos][None, None]               # [1, 1, S, max_len]
            S = idx.shape[1]
            for layer, blk in enumerate(t.h):
                q, k, v = blk.attn.c_attn(blk.ln_1(x)).split(E, dim=2)
                q, k, v = (a.view(1, S, H, E // H).transpose(1, 2) for a in (q, k, v))
                self.k[layer].index_copy_(2, input_pos, k)
                self.v[layer].index_copy_(2, input_pos, v)
                o = F.scaled_dot_product_attention(q, self.k[layer], self.v[layer], attn_mask=mask)
                x = x + blk.attn.c_proj(o.transpose(1, 2).reshape(1, S, E))
                x = x + blk.mlp(blk.ln_2(x))
            return self.gpt.lm_head(t.ln_f(x[:, -1])).argmax(-1)

    return StaticCacheGPT2().eval()


def generation_peers(model, prompt_ids, max_new: int, half: bool = False) -> dict:
    """The peers of a one-launch generation, each a callable that runs one whole greedy generation of
    max_new tokens on the GPU and returns the tokens (a device tensor; the caller times and syncs):

      "HF generate (eager)"               transformers' generate: dynamic cache, one Python step per token
      "static cache, CUDA graph/token"    the static-cache decode step captured once, replayed per token;
                                          the token and position feed the next replay on the device
      "static cache, torch.compile"       the same step under torch.compile(mode="reduce-overhead"), the
                                          loop in Python as gpt-fast writes it
    The prompt is prefilled in one forward pass by each peer."""
    import torch

    dev = torch.device("cuda")
    model = model.to(dev).eval()
    if half:
        model = model.half()
    prompt = torch.as_tensor(prompt_ids, device=dev).view(1, -1)
    P = prompt.shape[1]
    total = P + max_new
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0

    def hf_generate():
        return model.generate(prompt, max_new_tokens=max_new, min_new_tokens=max_new, do_sample=False)[0, P:]

    decoder = static_cache_decoder(model, total)
    prompt_pos = torch.arange(P, device=dev)

    # per-token CUDA graph: tok/pos/out are the graph's own buffers, updated inside the graph
    tok = torch.zeros(1, 1, dtype=torch.long, device=dev)
    pos = torch.zeros(1, dtype=torch.long, device=dev)
    out = torch.full((max_new,), -1, dtype=torch.long, device=dev)
    graph = torch.cuda.CUDAGraph()

    def step_in_place():
        nxt = decoder(tok, pos)
        out.index_copy_(0, pos - (P - 1), nxt)
        tok.copy_(nxt.view(1, 1))
        pos.add_(1)

    with torch.no_grad():
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                pos.fill_(P)
                step_in_place()
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(graph):
            step_in_place()

    @torch.no_grad()
    def per_token_graph():
        first = decoder(prompt, prompt_pos)
        out[0] = first[0]
        tok.copy_(first.view(1, 1))
        pos.fill_(P)
        for _ in range(max_new - 1):
            graph.replay()
        return out

    compiled = torch.compile(decoder, mode="reduce-overhead", fullgraph=True)

    @torch.no_grad()
    def torch_compile():
        cur = decoder(prompt, prompt_pos)
        tokens = [cur]
        p = torch.tensor([P], device=dev)
        for _ in range(max_new - 1):
            cur = compiled(cur.view(1, 1), p).clone()
            tokens.append(cur)
            p += 1
        return torch.cat(tokens)

    return {"HF generate (eager)": hf_generate, "static cache, CUDA graph/token": per_token_graph,
            "static cache, torch.compile": torch_compile}
