"""Running a bundle compiled with --generate (frontend/generation.py): prompts of any lengths in, each
row's new token ids out, the whole generation one launch of the bundle.

    sess = grapec.load("llama.grape")          # grapec compile decoder.onnx --generate 128 ...
    result = generate(sess, [[1, 15, 8], [1, 9]], max_new_tokens=32, eos_token_id=2)
    result.tokens                               # [[...], [...]]: each row's ids, its eos included
    for new in stream(sess, [[1, 15, 8]]):      # the same, each row's ids as the launch makes them
        print(new[0])

The prompts are right-padded into the smallest bucket (batch x prompt) that holds them; rows the
bucket has beyond them repeat the first prompt and are dropped from the result.
"""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass

import numpy as np

from ..errors import BackendError, BundleError, InputError
from ..plan import LoopStep

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
    [default: the model's, from onnxruntime-genai's genai_config.json or HF's generation_config.json where
    one was beside the decoder, else none]."""
    request = _Request(session, prompts, max_new_tokens, eos_token_id, temperature, top_p, seed)
    return request.result(session.run(request.feeds))


def stream(session, prompts: list, max_new_tokens: int | None = None, eos_token_id: int | None = None,
           temperature: float | None = None, top_p: float | None = None, seed: int | None = None) -> "TokenStream":
    """generate()'s tokens as the one launch makes them (onnxruntime-genai's Generator loop, without a
    call per token): an iterator of lists, one per prompt, of the ids each row made since the last
    item. Its `.result` is generate()'s answer once the iterator has ended.

        for new in grapec.stream(sess, [[1, 15, 8]], max_new_tokens=64):
            print(*new[0], end=" ", flush=True)

    The CPU backend hands over the tokens after every step; on the GPU they are read beside the
    running graph (runtime/cuda/watcher.py), so an item may hold a few steps' tokens at once."""
    return TokenStream(session, _Request(session, prompts, max_new_tokens, eos_token_id, temperature, top_p, seed))


class _Request:
    """One generation asked of a bundle: its feeds, checked, and how its outputs read back."""

    def __init__(self, session, prompts, max_new_tokens, eos_token_id, temperature, top_p, seed):
        n = room(session)
        sampling = sampling_feeds(session, temperature, top_p, seed)
        if eos_token_id is None:
            eos_token_id = int((session.bundle.manifest.get("metadata") or {}).get("grapec.generate.eos_token_id", -1))
        self.max_new_tokens = n if max_new_tokens is None else int(max_new_tokens)
        if not 1 <= self.max_new_tokens <= n:
            raise InputError(f"max_new_tokens {self.max_new_tokens}: this bundle generates 1 to {n} tokens (its KV cache "
                             f"was sized by --generate {n}; recompile with a larger one)")
        prompts = [list(map(int, p)) for p in prompts]
        if not prompts or any(not p for p in prompts):
            raise InputError("every prompt needs at least one token id")
        longest = max(len(p) for p in prompts)
        fits = [b for b in session.buckets if b["prompt_ids"][0] >= len(prompts) and b["prompt_ids"][1] >= longest]
        if not fits:
            have = ", ".join("x".join(map(str, b["prompt_ids"])) for b in session.buckets)
            raise InputError(f"{len(prompts)} prompt(s) of up to {longest} tokens fit no bucket of this bundle "
                             f"(batch x prompt: {have}); compile one with --bucket batch=B,prompt=P")
        self.bucket = min(fits, key=lambda b: (b["prompt_ids"][0] * b["prompt_ids"][1], b["prompt_ids"]))
        rows, width = self.bucket["prompt_ids"]
        ids = np.zeros((rows, width), np.int64)
        lengths = np.zeros(rows, np.int64)
        for r in range(rows):
            p = prompts[r] if r < len(prompts) else prompts[0]
            ids[r, :len(p)] = p
            ids[r, len(p):] = p[-1]   # any id within the vocabulary: the padding is masked out
            lengths[r] = len(p)
        self.rows = len(prompts)
        self.feeds = {"prompt_ids": ids, "prompt_lengths": lengths,
                      "max_new_tokens": np.array(self.max_new_tokens, np.int64),
                      "eos_token_id": np.array(eos_token_id, np.int64), **sampling}

    def result(self, out: dict) -> Generation:
        tokens = [out["generated"][r, :int(out["num_generated"][r])].tolist() for r in range(self.rows)]
        return Generation(tokens, {k: tuple(v) for k, v in self.bucket.items()}, self.max_new_tokens)


def tokens_slot(plan) -> int:
    """The buffer the generation Loop keeps its tokens in as it goes: the carried slot of the plan's
    `generated` output (its own bytes from the first step: compiler/pipeline.py streamed_outputs)."""
    out = dict(plan.outputs)["generated"]
    for st in plan.steps:
        if isinstance(st, LoopStep) and st.carried is not None and out in st.outputs[:len(st.carried)]:
            slot = st.carried[st.outputs.index(out)]
            if plan.buffers[slot].offset == plan.buffers[out].offset and plan.buffers[slot].space == "arena":
                return slot
    raise BundleError("this bundle's plan does not say where its generation loop keeps its tokens, so they cannot "
                      "be streamed (a bundle from an older grapec?); compile it again, or call generate()")


def _so_far(generated: np.ndarray, rows: int) -> list:
    """Each row's tokens in a copy of the tokens slot: the ids before its first -1 (no token yet, or
    none after the row's eos)."""
    out = []
    for r in range(rows):
        row = generated[r]
        stop = np.flatnonzero(row < 0)
        out.append(row[:stop[0] if stop.size else row.size].tolist())
    return out


class TokenStream:
    """stream()'s iterator. The run goes on in a thread of its own, which hands over copies of the
    tokens slot; an abandoned iterator still waits for its run to end when it is closed."""

    def __init__(self, session, request: _Request):
        self.session, self.request = session, request
        self.result: Generation | None = None

    def __iter__(self):
        updates: queue.SimpleQueue = queue.SimpleQueue()

        def work():
            try:
                updates.put(("done", self.session.run_watching(self.request.feeds, tokens_slot,
                                                               lambda a: updates.put(("tokens", a)))))
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
                updates.put(("error", e))

        worker = threading.Thread(target=work, name="grapec-stream", daemon=True)
        worker.start()
        sent = [[] for _ in range(self.request.rows)]
        try:
            while True:
                kind, value = updates.get()
                if kind == "error":
                    raise value
                if kind == "done":
                    self.result = self.request.result(value)
                    rows = self.result.tokens
                else:
                    rows = _so_far(value, self.request.rows)
                new = []
                for r, got in enumerate(rows):
                    if got[:len(sent[r])] != sent[r]:
                        raise BackendError(f"internal error, please report it: row {r}'s streamed tokens {sent[r]} "
                                           f"are not how its tokens {got} begin")
                    new.append(got[len(sent[r]):])
                    sent[r] = got
                if any(new):
                    yield new
                if kind == "done":
                    return
        finally:
            worker.join()
