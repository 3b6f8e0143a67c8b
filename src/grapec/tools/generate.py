"""`grapec generate`: greedy or sampled generation from token-id prompts, with a bundle compiled with --generate or
a decoder .onnx compiled on the spot for these prompts."""
from __future__ import annotations

import json
import os
import time

import click

from ..errors import GrapecError, InputError


def generate_command(model: str, prompts: tuple, max_new_tokens: int | None, eos_token_id: int | None, backend: str,
                     device: int, dims: tuple, top_k: int | None, sampling: dict, repeat: int, stream: bool,
                     as_json: bool, quiet: bool):
    """`grapec generate`'s work (cli.py has its options and help)."""
    from ..frontend.shapes import parse_dims
    from ..runtime.devices import resolve_backend
    if stream and repeat > 1:
        raise InputError("--stream runs the generation once; --repeat times runs that are not streamed")
    say = None if quiet or as_json else (lambda m: click.echo(f"[grapec] {m}", err=True))
    backend, why = resolve_backend(backend, device)
    if say:
        say(f"running on the {why}")
    rows = [parse_prompt(p) for p in prompts]
    sess, how = load_generator(model, rows, max_new_tokens, backend, device, parse_dims(list(dims)), say, top_k)
    if say:
        say(f"{os.path.basename(model)}: {how}")
    if stream:
        echo_result(stream_generate(sess, rows, max_new_tokens, eos_token_id, sampling, as_json), as_json)
    else:
        echo_result(run_generate(sess, rows, max_new_tokens, eos_token_id, repeat, sampling), as_json)


def parse_prompt(text: str) -> list:
    """'1 15 8' or '1,15,8' -> [1, 15, 8]."""
    parts = text.replace(",", " ").split()
    try:
        ids = [int(p) for p in parts]
    except ValueError:
        raise InputError(f"--prompt-ids {text!r}: expected token ids as integers, e.g. --prompt-ids '1 15 8'") from None
    if not ids:
        raise InputError("--prompt-ids: a prompt needs at least one token id")
    if min(ids) < 0:
        raise InputError(f"--prompt-ids {text!r}: token ids are not negative")
    return ids


def load_generator(model: str, prompts: list, max_new_tokens: int | None, backend: str, device: int, dims: dict,
                   say, top_k: int | None = None) -> tuple:
    """-> (session, how): a bundle as it is, or a decoder .onnx compiled for these prompts (batch = their
    number, prompt = the longest, N = max_new_tokens; sampled from the top_k where given)."""
    import grapec
    from ..bundle.format import MAGIC
    if os.path.isdir(model):   # onnxruntime-genai's builder and optimum write a folder: its model.onnx
        if not os.path.isfile(os.path.join(model, "model.onnx")):
            raise InputError(f"{model}: a folder without a model.onnx; give the decoder's .onnx file or a bundle")
        model = os.path.join(model, "model.onnx")
    if not os.path.isfile(model):
        raise GrapecError(f"{model}: no such file")
    with open(model, "rb") as f:
        is_bundle = f.read(8) == MAGIC
    if is_bundle:
        if dims or top_k is not None:
            raise InputError(f"{'--dim' if dims else '--top-k'} applies when MODEL is a decoder .onnx; a bundle's "
                             "shapes and sampling were fixed when it was compiled")
        return grapec.load(model, backend=backend, device=device), "bundle"
    n = max_new_tokens or 32
    at = {"batch": len(prompts), "prompt": max(len(p) for p in prompts), **dims}
    t0 = time.perf_counter()
    bundle = grapec.compile(model, dims=at, generate=n, top_k=top_k, progress=say,
                            targets=[] if backend == "cpu" else "auto")
    how = f"compiled for batch {at['batch']}, prompt {at['prompt']}, {n} new tokens in {time.perf_counter() - t0:.1f}s"
    return grapec.load(bundle, backend=backend, device=device), how


def run_generate(session, prompts: list, max_new_tokens: int | None, eos_token_id: int | None, repeat: int,
                 sampling: dict | None = None) -> dict:
    """Generate `repeat` times (the first run builds the GPU graph); -> the result and the timings.
    sampling: temperature, top_p and seed for a bundle compiled with --top-k."""
    from ..runtime.generation import generate
    times, result = [], None
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        result = generate(session, prompts, max_new_tokens, eos_token_id, **(sampling or {}))
        times.append(time.perf_counter() - t0)
    return _report(result, times)


def stream_generate(session, prompts: list, max_new_tokens: int | None, eos_token_id: int | None,
                    sampling: dict | None, as_json: bool) -> dict:
    """One generation, each row's tokens printed as the launch makes them ('row R: ids', or a JSON line
    {"row": R, "tokens": [..]} a row per arrival); -> the result and the timing, as run_generate's."""
    from ..runtime.generation import stream
    t0 = time.perf_counter()
    tokens = stream(session, prompts, max_new_tokens, eos_token_id, **(sampling or {}))
    for new in tokens:
        for r, ids in enumerate(new):
            if ids:
                click.echo(json.dumps({"row": r, "tokens": ids}) if as_json else f"row {r}: {' '.join(map(str, ids))}")
    return _report(tokens.result, [time.perf_counter() - t0], streamed=True)


def _report(result, times: list, streamed: bool = False) -> dict:
    new = sum(len(t) for t in result.tokens)
    best = min(times)
    return {"tokens": result.tokens, "bucket": {k: list(v) for k, v in result.bucket.items()},
            "max_new_tokens": result.max_new_tokens, "new_tokens": new, "ms": [round(t * 1e3, 3) for t in times],
            "ms_per_step": round(best * 1e3 / max(1, max(len(t) for t in result.tokens)), 4), "streamed": streamed}


def echo_result(report: dict, as_json: bool):
    """The tokens (unless they were streamed already) and the timing line."""
    if as_json:
        click.echo(json.dumps(report))
        return
    if not report["streamed"]:
        for i, ids in enumerate(report["tokens"]):
            click.echo(f"row {i}: {' '.join(map(str, ids))}")
    ms = report["ms"]
    how = "one launch, streamed" if report["streamed"] else "one launch"
    click.echo(f"{report['new_tokens']} new tokens in {min(ms):.2f} ms ({how}; {report['ms_per_step']:.3f} ms per "
               f"step), at bucket {'x'.join(map(str, report['bucket']['prompt_ids']))}"
               + (f"; first call {ms[0]:.2f} ms" if len(ms) > 1 else ""))
