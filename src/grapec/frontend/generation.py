"""A decoder's whole generation as one ONNX model: the prompt's pass, then a Loop of decode steps
that feeds each step's token back, until max_new_tokens or every row's end-of-sequence token.

A decoder as onnxruntime-genai's model builder (or torch.onnx/optimum) writes it takes token ids,
an attention mask and one past key and value per layer, and gives logits and the presents. Its
caller runs the loop on the host, a session call per token. Here the loop is part of the model, so
grapec compiles it to one CUDA graph whose conditional WHILE node runs every step on the device.

The KV cache is one buffer per past input, [batch, kv_heads, prompt + N, head_dim], allocated once:
the decoder is called as onnxruntime-genai calls its CUDA builds, with a past as long as the whole
generation and an attention mask whose ones say how much of it is filled. The decoder then gives a
present as long as its past (GroupQueryAttention does: onnxruntime's shared past/present buffer).

A decoder whose present is Concat(past, new keys) on the sequence axis (torch.onnx's and optimum's,
with a position_ids input) keeps its cache as a window of S = prompt + N - 1 positions instead: the
prompt's pass gets S empty positions (masked out) as its past, and each pass's present, longer by
what it fed, drops as many of its oldest positions to be the next past. The empty ones go first, so
no token ever leaves the window; the attention mask says where the prompt's and the generated
tokens sit in it (_window_mask), and the positions come from position_ids. Each step copies the
window (the Concat and the Slice), where GroupQueryAttention's buffer is written in place.

    inputs : prompt_ids      int64 [batch, prompt]  each row's prompt, right-padded (any id past its length)
             prompt_lengths  int64 [batch]          each row's prompt length, 1..prompt
             max_new_tokens  int64 []               tokens to generate, clipped to 1..N
             eos_token_id    int64 []               a row stops after emitting it; -1: never
    outputs: generated       int64 [batch, N]       each row's new ids, then -1
             num_generated   int64 [batch]          how many ids each row generated (its eos included)

Decoding is greedy (the first largest logit), or, compiled with top_k, sampled: each row's token is
drawn from its top_k logits (divided by the run-time `temperature`), cut to the smallest head whose
probabilities reach `top_p` (nucleus sampling), by a uniform number that a counter-based hash makes
of (`seed`, the token's index, the row) -- the same seed gives the same tokens on every backend and
every run, and no generator state lives between launches. Those three are then inputs too:

             temperature     float32 []             > 0; the logits are divided by it
             top_p           float32 []             (0, 1]: 1 keeps all top_k
             seed            int64 []               any value

The prompt's pass writes its keys and values at
positions 0..prompt-1 of each row (a right-padded row's padding too: those positions are masked
out and overwritten as the row grows), and step i feeds row b's token i at position
prompt_lengths[b] + i.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import onnx
from onnx import TensorProto, helper

from .onnx_import import without_weight_data
from .proto import NodeBuilder, Unsupported, inline_if, subgraphs

_PAST = re.compile(r"^past(_key_values)?[._]")
_END = 2**62   # a Slice end past any length
_CACHE_BRANCH = "use_cache_branch"   # optimum's merged decoder: which of its two graphs runs


@dataclass
class KVInput:
    """One past input of the decoder and the present output that continues it."""
    past: str
    present: str
    elem_type: int
    heads: int | str      # its dim 1: a number, or a dim name the caller gives a value
    head_dim: int | str   # its dim 3


@dataclass
class Decoder:
    """What the generation loop feeds and reads of a decoder."""
    input_ids: str
    attention_mask: str
    position_ids: str | None
    kv: list
    logits: str
    growing: bool = False   # each present is Concat(past, new keys) (torch.onnx, optimum): a sliding window


def _dims(v: onnx.ValueInfoProto) -> list:
    return [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]


def find_decoder(graph: onnx.GraphProto, where: str) -> Decoder:
    """The decoder's inputs and outputs by their usual names (onnxruntime-genai's builder and
    optimum use the same ones); Unsupported naming what is missing or unknown."""
    inputs = {v.name: v for v in graph.input if v.name not in {t.name for t in graph.initializer}}
    outputs = [o.name for o in graph.output]
    missing = [n for n in ("input_ids", "attention_mask") if n not in inputs]
    if missing:
        raise Unsupported(f"{where}: --generate needs a decoder with inputs input_ids and attention_mask; "
                          f"it has no {' or '.join(missing)} (inputs: {', '.join(inputs)})")
    kv = []
    for name, v in inputs.items():
        if not _PAST.match(name):
            continue
        present = _PAST.sub("present.", name)
        if present not in outputs:
            raise Unsupported(f"{where}: past input '{name}' has no present output '{present}' to continue it "
                              f"(outputs: {', '.join(outputs)})")
        dims = _dims(v)
        if len(dims) != 4:
            raise Unsupported(f"{where}: past input '{name}' has rank {len(dims)}; expected [batch, kv_heads, "
                              "past_sequence_length, head_dim]")
        kv.append(KVInput(name, present, v.type.tensor_type.elem_type, dims[1], dims[3]))
    if not kv:
        raise Unsupported(f"{where}: --generate needs a decoder with past key/value inputs (past_key_values.N.key "
                          f"and .value); it has none (inputs: {', '.join(inputs)})")
    fed = {"input_ids", "attention_mask", "position_ids"} | {k.past for k in kv}
    extra = [n for n in inputs if n not in fed]
    if extra:
        raise Unsupported(f"{where}: --generate does not know how to feed input(s) {', '.join(extra)}")
    seq = _dims(inputs["input_ids"])[1:2]
    if seq and isinstance(seq[0], int) and seq[0] > 0:
        raise Unsupported(f"{where}: input_ids is declared {_dims(inputs['input_ids'])}, its sequence length fixed at "
                          f"{seq[0]}; --generate feeds it the prompt, then one token a row: export the decoder with a "
                          "dynamic sequence length (torch.onnx.export's dynamic_shapes / dynamic_axes)")
    logits = "logits" if "logits" in outputs else outputs[0]
    growing = [_grows(graph, k) for k in kv]
    if any(growing) and not all(growing):
        grown = ", ".join(k.present for k, g in zip(kv, growing) if g)
        kept = ", ".join(k.present for k, g in zip(kv, growing) if not g)
        raise Unsupported(f"{where}: {grown} grow(s) by concatenating the new keys to the past, {kept} not; "
                          "--generate needs every present in one form (all Concat(past, new), or all as long as "
                          "their past)")
    if any(growing) and "position_ids" not in inputs:
        raise Unsupported(f"{where}: its presents grow by concatenation, so --generate keeps the cache as a window "
                          "whose length never changes, and the positions must come from a position_ids input, "
                          "which this decoder does not have")
    return Decoder("input_ids", "attention_mask", "position_ids" if "position_ids" in inputs else None, kv, logits,
                   any(growing))


def _with_past_branch(model: onnx.ModelProto, where: str) -> tuple:
    """-> (the decoder's graph, its initializers). optimum's merged decoder (decoder_model_merged.onnx:
    optimum 1.x's legacy export, transformers.js) is an If on a use_cache_branch input between its
    graph with a past (then) and without one. The generation loop always feeds a past (the prompt's
    pass an empty one), so the If gives way to its then branch and the input goes. The graph is then
    inlined in a copy without the weights' values (a 1 B decoder's would double the compile's
    memory); the initializers come from the model as they are."""
    g = model.graph
    if _CACHE_BRANCH not in {i.name for i in g.input}:
        return g, g.initializer
    ifs = [i for i, n in enumerate(g.node) if n.op_type == "If" and n.input and n.input[0] == _CACHE_BRANCH]
    readers = [n.name or n.op_type for n in g.node if _CACHE_BRANCH in n.input]
    if len(ifs) != 1 or len(readers) != 1:
        raise Unsupported(f"{where}: its {_CACHE_BRANCH} input is read by {', '.join(readers) or 'nothing'}; "
                          f"--generate knows optimum's merged decoder, one If on it")
    inlined = inline_if(without_weight_data(model), ifs[0], take_then=True)
    if inlined is None:
        raise Unsupported(f"{where}: the with-past branch of its If on {_CACHE_BRANCH} reuses names of the graph")
    kept = [i for i in inlined.graph.input if i.name != _CACHE_BRANCH]
    del inlined.graph.input[:]
    inlined.graph.input.extend(kept)
    then = next(a.g for a in g.node[ifs[0]].attribute if a.name == "then_branch")
    return inlined.graph, list(g.initializer) + list(then.initializer)


def _grows(graph: onnx.GraphProto, k: KVInput) -> bool:
    """Is k's present its past with the new positions concatenated along the sequence axis (torch.onnx's
    and optimum's form), rather than a buffer as long as the past (GroupQueryAttention's)?"""
    made = {o: n for n in graph.node for o in n.output}
    past_type = next((i.type.tensor_type.elem_type for i in graph.input if i.name == k.past), None)
    name = k.present
    while name in made and (made[name].op_type == "Identity" or _casts_to(made[name], past_type)):
        name = made[name].input[0]
    n = made.get(name)
    if n is None or n.op_type != "Concat" or not n.input or n.input[0] != k.past:
        return False
    axis = next((a.i for a in n.attribute if a.name == "axis"), None)
    return axis in (2, -2)


def _casts_to(n: onnx.NodeProto, elem_type: int | None) -> bool:
    """A Cast to the past's own type: GPT-J's exporter casts the concatenated keys back to the model's dtype
    (`key.to(dtype)`, rotary having run in float32), a no-op where they already are."""
    return n.op_type == "Cast" and elem_type is not None and any(a.name == "to" and a.i == elem_type for a in n.attribute)


def _renamed_nodes(graph: onnx.GraphProto, prefix: str, keep: set, feeds: dict) -> list:
    """The decoder's nodes with every value they define named prefix + name, its inputs read from
    `feeds` (decoder input -> value), and its initializers (in `keep`) read as they are."""
    for n in graph.node:
        if any(True for _ in subgraphs(n)):
            raise Unsupported(f"node '{n.name}' ({n.op_type}): a decoder with If/Loop inside cannot be wrapped "
                              "for --generate yet")

    def name(x: str) -> str:
        if not x or x in keep:
            return x
        return feeds.get(x, prefix + x)
    nodes = []
    for n in graph.node:
        m = onnx.NodeProto()
        m.CopyFrom(n)
        m.name = prefix + (n.name or n.output[0])
        m.input[:] = [name(x) for x in n.input]
        m.output[:] = [name(x) for x in n.output]
        nodes.append(m)
    return nodes


def _dim_value(d, dims: dict, known: int | None, what: str) -> int:
    if isinstance(d, int) and d > 0:
        return d
    if d in dims:
        return int(dims[d])
    if known:
        return int(known)
    raise Unsupported(f"the KV cache's {what} is the named dim '{d}': give it with --dim {d}=N")


def decoder_config(model_path: str) -> dict:
    """What the files beside the model say of the decoder, or {}: onnxruntime-genai's genai_config.json
    (its builder writes one) sizes the KV cache where the ONNX leaves a dim named (the builder's
    kv_cache_dim) and gives the eos token; without one, HF's generation_config.json or config.json
    (optimum's export writes both) give the eos token. Of several eos ids, the first."""
    import json
    import os
    folder = os.path.dirname(os.path.abspath(model_path))

    def read(name: str) -> dict:
        try:
            with open(os.path.join(folder, name)) as f:
                d = json.load(f)
        except (OSError, ValueError):
            return {}
        return d if isinstance(d, dict) else {}

    def first(eos):
        return eos[0] if isinstance(eos, list) and eos else eos if isinstance(eos, int) else None
    model = read("genai_config.json").get("model")
    if isinstance(model, dict):
        decoder = model.get("decoder", {}) if isinstance(model.get("decoder"), dict) else {}
        return {"heads": decoder.get("num_key_value_heads"), "head_dim": decoder.get("head_size"),
                "eos_token_id": first(model.get("eos_token_id"))}
    for name in ("generation_config.json", "config.json"):
        eos = first(read(name).get("eos_token_id"))
        if eos is not None:
            return {"eos_token_id": eos}
    return {}


def generation_model(model: onnx.ModelProto, max_new_tokens: int, dims: dict | None = None,
                     where: str = "model", config: dict | None = None, top_k: int | None = None) -> tuple:
    """-> (the decoder `model` wrapped in its generation loop (see the module docstring), the names in
    `dims` it used). N = max_new_tokens, the cache's room past the prompt. dims: values of the
    decoder's named dims that size its KV cache (kv_cache_dim); config: decoder_config()'s, for those
    dims not given and the default eos token; top_k: sample from the top_k logits (None: greedy)."""
    if max_new_tokens < 1:
        raise Unsupported(f"--generate {max_new_tokens}: the number of new tokens must be at least 1")
    if top_k is not None and top_k < 1:
        raise Unsupported(f"--top-k {top_k}: sampling needs at least 1 candidate token")
    dims = dims or {}
    g, weights = _with_past_branch(model, where)
    dec = find_decoder(g, where)
    opset = max([o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] + [13])
    keep = {t.name for t in g.initializer}
    b = NodeBuilder("gen", opset)
    n_new = max_new_tokens
    config = config or {}
    shapes = [(_dim_value(k.heads, dims, config.get("heads"), f"heads of '{k.past}'"),
               _dim_value(k.head_dim, dims, config.get("head_dim"), f"head size of '{k.past}'")) for k in dec.kv]

    # the prompt's pass: an empty cache as long as the whole generation (a growing decoder's: its
    # window), the prompt at its first (the window's last) P positions
    batch, prompt = b.dim("prompt_ids", 0), b.dim("prompt_ids", 1)
    # a growing decoder's past is a window of P + N - 1 positions: its present, one longer, slides by one
    room = b.node("Add", [prompt, b.const(n_new - 1 if dec.growing else n_new)], "cache_length")
    lengths = b.node("Clip", ["prompt_lengths", b.const(1), prompt], "lengths")   # a row holds 1..P tokens
    positions = b.unsqueeze(b.node("Range", [b.const(0), prompt, b.const(1)]), 0)                  # [1, P]
    filled = b.node("Cast", [b.node("Less", [positions, b.unsqueeze(lengths, 1)])], to=TensorProto.INT64)   # [B, P]
    if dec.growing:   # the empty window masked out, then the prompt: [B, window + P]
        empty = b.node("Expand", [b.const(0), b.node("Concat", [b.unsqueeze(batch, 0), b.unsqueeze(room, 0)], axis=0)])
        filled = b.node("Concat", [empty, filled], axis=1)
    feeds = {dec.input_ids: "prompt_ids", dec.attention_mask: filled}
    if dec.position_ids:
        feeds[dec.position_ids] = b.node("Expand", [positions, b.node("Concat", [b.unsqueeze(batch, 0),
                                                                                 b.unsqueeze(prompt, 0)], axis=0)])
    for k, (heads, head_dim) in zip(dec.kv, shapes):
        shape = b.node("Concat", [b.unsqueeze(batch, 0), b.const([heads]), b.unsqueeze(room, 0), b.const([head_dim])], axis=0)
        zero = helper.make_tensor("zero", k.elem_type, [1], [0])
        feeds[k.past] = b.node("ConstantOfShape", [shape], "empty_cache", value=zero)
    before = len(b.out)
    prefill = _renamed_nodes(g, "prompt/", keep, feeds)
    last = b.unsqueeze(b.unsqueeze(b.node("Sub", [lengths, b.const(1)]), 1), 2)                    # [B, 1, 1]
    at = b.node("Expand", [last, b.node("Concat", [b.unsqueeze(batch, 0), b.const([1]),
                                                   b.span(b.node("Shape", ["prompt/" + dec.logits]), 2, 3)], axis=0)])
    row = b.node("Squeeze", [b.node("GatherElements", ["prompt/" + dec.logits, at], axis=1), b.const([1])])   # [B, V]
    first = _chosen(b, row, b.const(0), top_k)                                                      # [B, 1]
    done = b.node("Equal", [b.node("Squeeze", [first, b.const([1])]), "eos_token_id"])              # [B]
    column = b.unsqueeze(b.node("Range", [b.const(0), b.const(n_new), b.const(1)]), 0)              # [1, N]
    nothing = b.node("Expand", [b.const(-1), b.node("Concat", [b.unsqueeze(batch, 0), b.const([n_new])], axis=0)])
    generated = b.node("Where", [b.node("Equal", [column, b.const(0)]), first, nothing])            # [B, N]
    count = b.node("Expand", [b.const(1), b.unsqueeze(batch, 0)])                                   # [B]
    steps = b.node("Sub", [b.node("Clip", ["max_new_tokens", b.const(1), b.const(n_new)]), b.const(1)])
    body = _step_body(g, dec, keep, n_new, opset, room, column, lengths, top_k)
    caches = [f"cache/{k.past}" for k in dec.kv]
    # a growing decoder's window drops the P oldest (empty) positions the prompt pushed in
    presents = [b.node("Slice", ["prompt/" + k.present, b.unsqueeze(prompt, 0), b.const([_END]), b.const([2])])
                if dec.growing else "prompt/" + k.present for k in dec.kv]
    b.out.append(helper.make_node("Loop", [steps, _not_all(b, done), first, done, generated, count] + presents,
                                  ["last_token", "all_done", "generated", "num_generated"] + caches,
                                  name="generation", body=body))
    graph = helper.make_graph(
        b.out[:before] + prefill + b.out[before:], f"{g.name or 'decoder'}_generate",
        [helper.make_tensor_value_info("prompt_ids", TensorProto.INT64, ["batch", "prompt"]),
         helper.make_tensor_value_info("prompt_lengths", TensorProto.INT64, ["batch"]),
         helper.make_tensor_value_info("max_new_tokens", TensorProto.INT64, []),
         helper.make_tensor_value_info("eos_token_id", TensorProto.INT64, [])]
        + ([] if top_k is None else [helper.make_tensor_value_info("temperature", TensorProto.FLOAT, []),
                                     helper.make_tensor_value_info("top_p", TensorProto.FLOAT, []),
                                     helper.make_tensor_value_info("seed", TensorProto.INT64, [])]),
        [helper.make_tensor_value_info("generated", TensorProto.INT64, ["batch", n_new]),
         helper.make_tensor_value_info("num_generated", TensorProto.INT64, ["batch"])])
    out = helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    out.graph.initializer.extend(weights)   # the weights copied once, not again by make_model
    out.metadata_props.extend(model.metadata_props)
    for key, value in _metadata(g, dec, n_new, where, config, top_k):
        out.metadata_props.append(onnx.StringStringEntryProto(key=key, value=value))
    used = {d for k in dec.kv for d in (k.heads, k.head_dim) if isinstance(d, str) and d in dims}
    return out, used


def _metadata(g: onnx.GraphProto, dec: Decoder, n_new: int, where: str, config: dict, top_k: int | None) -> list:
    """What the bundle says of the generation: N, the default eos, the tokens and count outputs (grapec
    bench reports ms per generated token by them), and the inputs' valid values."""
    meta = [("grapec.generate.max_new_tokens", str(n_new)), ("grapec.generate.decoder", where),
            ("grapec.input_range.prompt_lengths", "1:prompt_ids[1]"),
            ("grapec.generated_tokens_output", "generated"), ("grapec.generated_count_output", "num_generated")]
    if top_k is not None:
        meta.append(("grapec.generate.top_k", str(top_k)))
    if isinstance(config.get("eos_token_id"), int):
        meta.append(("grapec.generate.eos_token_id", str(config["eos_token_id"])))
    vocab = _dims(next(o for o in g.output if o.name == dec.logits))[-1:]
    if vocab and isinstance(vocab[0], int) and vocab[0] > 0:   # the ids index the embedding: the logits' width
        meta.append(("grapec.input_range.prompt_ids", f"0:{vocab[0] - 1}"))
    return meta


def growing_cache(problem: str) -> str | None:
    """A compile problem said in the decoder's terms where it is a KV cache that does not keep its
    length across the loop's steps (a present made by concatenation); else None."""
    m = re.search(r"loop-carried value \d+ \('past/([^']+)'\) changes from (.+?) to (.+?) across", problem)
    if not m:
        return None
    past, before, after = m.groups()
    return (f"--generate: the decoder's '{_PAST.sub('present.', past)}' is longer than its '{past}' ({before} -> "
            f"{after}), but not as Concat(past, new keys) on the sequence axis, the growing form --generate turns "
            "into a sliding window (torch.onnx's, optimum's). It needs that form, or a present as long as its past, "
            "as GroupQueryAttention's is (onnxruntime-genai's model builder)")


def _not_all(b: NodeBuilder, done: str) -> str:
    """Not every row done: the loop's condition."""
    least = b.node("ReduceMin", [b.node("Cast", [done], to=TensorProto.INT64)], keepdims=0)
    return b.node("Not", [b.node("Cast", [least], to=TensorProto.BOOL)])


def _step_body(g: onnx.GraphProto, dec: Decoder, keep: set, n_new: int, opset: int, room: str, column: str,
               lengths: str, top_k: int | None):
    """The Loop body: one decode step of every row, its token written into `generated`."""
    b = NodeBuilder("step", opset)
    at = b.node("Add", [lengths, "in/iteration"], "position")                                  # [B]
    if dec.growing:
        mask = _window_mask(b, room, lengths, n_new)                                          # [B, L + 1]
    else:
        keys = b.unsqueeze(b.node("Range", [b.const(0), room, b.const(1)]), 0)                      # [1, L]
        mask = b.node("Cast", [b.node("LessOrEqual", [keys, b.unsqueeze(at, 1)])], to=TensorProto.INT64)   # [B, L]
    feeds = {dec.input_ids: "in/token", dec.attention_mask: mask}
    if dec.position_ids:
        feeds[dec.position_ids] = b.unsqueeze(at, 1)
    feeds.update({k.past: f"past/{k.past}" for k in dec.kv})
    before = len(b.out)
    decoder = _renamed_nodes(g, "step/", keep, feeds)
    presents = [b.span("step/" + k.present, 1, _END, axis=2) if dec.growing else "step/" + k.present
                for k in dec.kv]   # a growing decoder's window drops its oldest position
    row = b.node("Squeeze", ["step/" + dec.logits, b.const([1])])                                   # [B, V]
    token = _chosen(b, row, b.node("Add", ["in/iteration", b.const(1)]), top_k)                    # [B, 1]
    flat = b.node("Squeeze", [token, b.const([1])])
    written = b.node("Where", ["in/done", b.const(-1), flat])
    here = b.node("Equal", [column, b.node("Add", ["in/iteration", b.const(1)])])                       # [1, N]
    generated = b.node("Where", [here, b.unsqueeze(written, 1), "in/generated"])
    count = b.node("Add", ["in/count", b.node("Cast", [b.node("Not", ["in/done"])], to=TensorProto.INT64)])
    done = b.node("Or", ["in/done", b.node("Equal", [flat, "eos_token_id"])])
    go = _not_all(b, done)
    kv_type = {k.past: k.elem_type for k in dec.kv}
    return helper.make_graph(
        b.out[:before] + decoder + b.out[before:], "generation_step",
        [helper.make_tensor_value_info("in/iteration", TensorProto.INT64, []),
         helper.make_tensor_value_info("in/cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("in/token", TensorProto.INT64, None),
         helper.make_tensor_value_info("in/done", TensorProto.BOOL, None),
         helper.make_tensor_value_info("in/generated", TensorProto.INT64, None),
         helper.make_tensor_value_info("in/count", TensorProto.INT64, None)]
        + [helper.make_tensor_value_info(f"past/{k.past}", kv_type[k.past], None) for k in dec.kv],
        [helper.make_tensor_value_info(go, TensorProto.BOOL, []),
         helper.make_tensor_value_info(token, TensorProto.INT64, None),
         helper.make_tensor_value_info(done, TensorProto.BOOL, None),
         helper.make_tensor_value_info(generated, TensorProto.INT64, None),
         helper.make_tensor_value_info(count, TensorProto.INT64, None)]
        + [helper.make_tensor_value_info(p, kv_type[k.past], None) for k, p in zip(dec.kv, presents)])


def _window_mask(b: NodeBuilder, window: str, lengths: str, n_new: int) -> str:
    """Decode step i of a growing decoder: which of the S + 1 positions of its present (the window of
    S = P + N - 1 past positions, then the new one) hold a token, [B, S + 1] int64. The prompt pass
    laid out S empty positions, then the P prompt positions (row b's first lengths[b] real); it and
    every step since dropped the oldest, so the prompt's real positions now start at N - 1 - i, and
    the i tokens generated since sit just before the new one, at S - i..S."""
    keys = b.unsqueeze(b.node("Range", [b.const(0), b.node("Add", [window, b.const(1)]), b.const(1)]), 0)   # [1, S+1]
    first = b.node("Sub", [b.const(n_new - 1), "in/iteration"])
    prompt = b.node("And", [b.node("GreaterOrEqual", [keys, first]),
                            b.node("Less", [keys, b.unsqueeze(b.node("Add", [lengths, first]), 1)])])
    made = b.node("GreaterOrEqual", [keys, b.node("Sub", [window, "in/iteration"])])
    return b.node("Cast", [b.node("Or", [prompt, made])], to=TensorProto.INT64)


# the hash behind each sampled token: rounds of a multiplicative generator modulo the prime 2^31 - 1
# (Park and Miller's), with the token's index and the row mixed in. Every product stays below 2^47,
# so int64 arithmetic is exact on every backend.
_PRIME = 2**31 - 1
_MULTIPLIER = 48271
_MIX = 69621   # another of Park and Miller's multipliers: spreads the token index and the row


def _uniform(b: NodeBuilder, t: str, rows: str) -> str:
    """[B, 1] float32 in [0, 1): a counter-based hash of (seed, t, row)."""
    x = b.node("Add", [b.node("Mod", ["seed", b.const(_PRIME - 1)]), b.const(1)])                   # 1..p-1
    for mix in (b.node("Add", [t, b.const(1)]), b.node("Add", [rows, b.const(1)]), b.const(0), b.const(0)):
        x = b.node("Mod", [b.node("Add", [b.node("Mul", [x, b.const(_MULTIPLIER)]),
                                         b.node("Mul", [mix, b.const(_MIX)])]), b.const(_PRIME)])
    low = b.node("Mod", [x, b.const(1 << 24)])          # 24 bits: exact in float32, and below 1
    return b.unsqueeze(b.node("Mul", [b.node("Cast", [low], to=TensorProto.FLOAT), b.fconst(1.0 / (1 << 24))]), 1)


def _chosen(b: NodeBuilder, logits: str, t: str, top_k: int | None) -> str:
    """[B, 1] int64: each row's next token from its logits [B, V]: the first largest (greedy), or
    drawn from the top_k (_sampled); t: the token's index, int64 []."""
    if top_k is None:
        return b.node("ArgMax", [logits], axis=1, keepdims=1)
    return _sampled(b, logits, t, top_k)


def _sampled(b: NodeBuilder, logits: str, t: str, top_k: int) -> str:
    """[B, 1] int64: each row's token drawn from softmax(logits / temperature) over its top_k logits,
    cut to the smallest head (in order) whose probabilities reach top_p, by inverse CDF at
    _uniform(seed, t, row). logits: [B, V], any float type; t: the token's index, int64 []."""
    x = b.node("Div", [b.node("Cast", [logits], to=TensorProto.FLOAT), "temperature"])
    values, ids = b.multi("TopK", [x, b.const([top_k])], ["", ""], axis=1)                           # [B, K], sorted
    p = b.node("Softmax", [values], axis=1)
    before = b.node("Sub", [b.node("CumSum", [p, b.const(1)]), p])       # mass ahead of each candidate
    kept = b.node("Where", [b.node("Less", [before, "top_p"]), p, b.fconst(0.0)])                    # the first stays
    cdf = b.node("CumSum", [kept, b.const(1)])                                                      # [B, K]
    total = b.node("ReduceSum", [kept, b.const([1])], keepdims=1)                                   # [B, 1]
    rows = b.node("Range", [b.const(0), b.dim(logits, 0), b.const(1)])
    below = b.node("LessOrEqual", [cdf, b.node("Mul", [_uniform(b, t, rows), total])])
    pick = b.node("ReduceSum", [b.node("Cast", [below], to=TensorProto.INT64), b.const([1])], keepdims=1)
    pick = b.node("Min", [pick, b.const(top_k - 1)])                                                # [B, 1]
    return b.node("GatherElements", [ids, pick], axis=1)
