"""Running a bundle compiled with --generate (frontend/generation.py): prompts of any lengths in, each
row's new token ids out, the whole generation one launch of the bundle.

    sess = grapec.load("llama.grape")          # grapec compile decoder.onnx --generate 128 ...
    result = generate(sess, [[1, 15, 8], [1, 9]], max_new_tokens=32, eos_token_id=2)
    result.tokens                               # [[...], [...]]: each row's ids, its eos included

The prompts are right-padded into the smallest bucket (batch x prompt) that holds them; rows the
bucket has beyond them repeat the first prompt and are dropped from the result.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import BundleError, InputError

INPUTS = ("prompt_ids", "prompt_lengths", "max_new_tokens", "eos_token_id")
SAMPLING = ("temperature", "top_p", "seed")   # a bundle compiled with --top-k takes these too


@dataclass
class Generation:
    """What one generate() call gave."""
    tokens: list          # per prompt: its new ids, the eos (if reached) last
    bucket: dict          # the bundle's shapes it ran at: {"prompt_ids": (batch, prompt), ...}
    max_new_tokens: int   # what the call asked for, after the default


def room(session) -> int:
    """N, the most new tokens the bundle's cache holds (compile's --generate N)."""
    manifest = session.bundle.manifest
    names = [i["name"] for i in manifest["inputs"]]
    n = (manifest.get("metadata") or {}).get("grapec.generate.max_new_tokens")
    if names not in (list(INPUTS), list(INPUTS + SAMPLING)) or n is None:
        raise BundleError(f"this bundle was not compiled with --generate (its inputs are {', '.join(names)}); "
                          "compile the decoder with: grapec compile decoder.onnx --generate N --dim batch=B --dim prompt=P")
    return int(n)


def top_k(session) -> int | None:
    """K of a bundle compiled with --generate N --top-k K; None for a greedy one."""
    k = (session.bundle.manifest.get("metadata") or {}).get("grapec.generate.top_k")
    return None if k is None else int(k)


def sampling_feeds(session, temperature: float | None, top_p: float | None, seed: int | None) -> dict:
    """The sampling inputs of a --top-k bundle, checked [defaults: temperature 1, top_p 1, seed 0]; {}
    for a greedy bundle, which refuses them."""
    if top_k(session) is None:
        given = [name for name, v in zip(SAMPLING, (temperature, top_p, seed)) if v is not None]
        if given:
            raise InputError(f"{', '.join(given)}: this bundle generates greedily; compile it with --top-k K to "
                             "sample (grapec compile decoder.onnx --generate N --top-k 50 ...)")
        return {}
    temperature = 1.0 if temperature is None else float(temperature)
    top_p = 1.0 if top_p is None else float(top_p)
    if not temperature > 0:
        raise InputError(f"temperature {temperature}: expected a value > 0 (the logits are divided by it)")
    if not 0 < top_p <= 1:
        raise InputError(f"top_p {top_p}: expected a value in (0, 1] (the probability mass kept)")
    return {"temperature": np.array(temperature, np.float32), "top_p": np.array(top_p, np.float32),
            "seed": np.array(0 if seed is None else int(seed), np.int64)}


def generate(session, prompts: list, max_new_tokens: int | None = None, eos_token_id: int | None = None,
             temperature: float | None = None, top_p: float | None = None, seed: int | None = None) -> Generation:
    """Generation for each prompt (a list of token ids) with a bundle compiled with --generate: greedy,
    or sampled where it was compiled with --top-k (temperature, top_p and seed apply then).
    max_new_tokens: at most the bundle's N [default: N]; eos_token_id: a row stops after it (-1: none)
    [default: the model's, from onnxruntime-genai's genai_config.json where there was one, else none]."""
    n = room(session)
    sampling = sampling_feeds(session, temperature, top_p, seed)
    if eos_token_id is None:
        eos_token_id = int((session.bundle.manifest.get("metadata") or {}).get("grapec.generate.eos_token_id", -1))
    max_new_tokens = n if max_new_tokens is None else int(max_new_tokens)
    if not 1 <= max_new_tokens <= n:
        raise InputError(f"max_new_tokens {max_new_tokens}: this bundle generates 1 to {n} tokens (its KV cache was "
                         f"sized by --generate {n}; recompile with a larger one)")
    prompts = [list(map(int, p)) for p in prompts]
    if not prompts or any(not p for p in prompts):
        raise InputError("every prompt needs at least one token id")
    longest = max(len(p) for p in prompts)
    fits = [b for b in session.buckets if b["prompt_ids"][0] >= len(prompts) and b["prompt_ids"][1] >= longest]
    if not fits:
        have = ", ".join("x".join(map(str, b["prompt_ids"])) for b in session.buckets)
        raise InputError(f"{len(prompts)} prompt(s) of up to {longest} tokens fit no bucket of this bundle "
                         f"(batch x prompt: {have}); compile one with --bucket batch=B,prompt=P")
    bucket = min(fits, key=lambda b: (b["prompt_ids"][0] * b["prompt_ids"][1], b["prompt_ids"]))
    rows, width = bucket["prompt_ids"]
    ids = np.zeros((rows, width), np.int64)
    lengths = np.zeros(rows, np.int64)
    for r in range(rows):
        p = prompts[r] if r < len(prompts) else prompts[0]
        ids[r, :len(p)] = p
        ids[r, len(p):] = p[-1]   # any id within the vocabulary: the padding is masked out
        lengths[r] = len(p)
    out = session.run({"prompt_ids": ids, "prompt_lengths": lengths, "max_new_tokens": np.array(max_new_tokens, np.int64),
                       "eos_token_id": np.array(eos_token_id, np.int64), **sampling})
    tokens = [out["generated"][r, :int(out["num_generated"][r])].tolist() for r in range(len(prompts))]
    return Generation(tokens, {k: tuple(v) for k, v in bucket.items()}, max_new_tokens)
