"""grapec's greedy tokens against onnxruntime-genai's own Generator, on the CPU (issue 35: "greedy tokens
equal onnxruntime-genai's for 64 tokens in fp32"). Runs where onnxruntime-genai is installed next to
grapec's dependencies (a venv of its own: `pip install onnxruntime-genai onnx click numpy`):

    PYTHONPATH=src python tools/genai_greedy.py BUILDER_FOLDER [OTHER.onnx ..] [--new 64] [--rows 4]

BUILDER_FOLDER is what onnxruntime-genai's model builder wrote (`-e cpu -p fp32`: genai_config.json,
model.onnx). Its Generator makes each row's tokens from random prompts, up to --new or the config's
eos (min_length is left alone: it would forbid the eos, which grapec's loop has no way to mirror);
grapec compiles the folder's model.onnx with --generate and runs them in one launch on the CPU
backend with the same eos, then each OTHER decoder of the same weights (optimum's export, say).
Prints, per model, whether every row's tokens are equal and where each first differs. Exit 1 if any
differ.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np


def genai_tokens(folder: str, prompts: list, new: int) -> list:
    import onnxruntime_genai as og
    model = og.Model(folder)
    out = []
    for p in prompts:
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(p) + new, do_sample=False)
        gen = og.Generator(model, params)
        gen.append_tokens([p])
        while not gen.is_done():
            gen.generate_next_token()
        out.append([int(t) for t in gen.get_sequence(0)[len(p):]])
    return out


def grapec_tokens(path: str, prompts: list, new: int, eos: int) -> list:
    import grapec
    from grapec.bundle.format import Bundle
    bundle = grapec.compile(path, generate=new, bucket_dims=[{"batch": len(prompts), "prompt": max(map(len, prompts))}],
                            targets=[])
    return grapec.generate(grapec.load(Bundle.from_bytes(bundle.to_bytes())), prompts, eos_token_id=eos).tokens


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", help="onnxruntime-genai's builder output (genai_config.json, model.onnx)")
    ap.add_argument("others", nargs="*", help="other decoders of the same weights (optimum's export, ...)")
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--seed", type=int, default=11)
    a = ap.parse_args()
    import json
    with open(os.path.join(a.folder, "genai_config.json")) as f:
        config = json.load(f)["model"]
    vocab, eos = int(config["vocab_size"]), config["eos_token_id"]
    eos = int(eos[0] if isinstance(eos, list) else eos)
    rng = np.random.default_rng(a.seed)
    prompts = [rng.integers(3, vocab, int(n)).tolist() for n in rng.integers(1, 13, a.rows)]
    want = genai_tokens(a.folder, prompts, a.new)   # a row that met the eos ends before it (0.18)
    ok = True
    for path in [os.path.join(a.folder, "model.onnx")] + a.others:
        # onnxruntime-genai's sequence ends before the eos it stopped at; grapec's rows end with it
        got = [t[:-1] if t and t[-1] == eos else t for t in grapec_tokens(path, prompts, a.new, eos)]
        first = [next((i for i, (x, y) in enumerate(zip(g, w)) if x != y), None) for g, w in zip(got, want)]
        same = got == want
        ok &= same
        print(f"{path}: {a.rows} rows, {[len(t) for t in want]} tokens (eos {eos}), {'equal to' if same else 'DIFFER from'} "
              f"onnxruntime-genai's (prompt lengths {[len(p) for p in prompts]}; first difference per row: {first})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
