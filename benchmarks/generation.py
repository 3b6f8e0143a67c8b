"""A whole greedy generation as one CUDA-graph launch, against the generation peers, in one process on
one GPU: the gpt2_generate zoo model (GPT-2 with a static KV cache, the decode loop an ONNX Loop).

    python benchmarks/generation.py --size full --precision fp16 fp32 [--iterations 20] [--json out.json]

For each precision: compile with --strict (nothing may run on the host; in fp32 the attention notes
only, as float32 attention is not fused), check the tokens against a
plain PyTorch greedy loop in fp32 on the CPU (the same weights), then time one whole generation
(prompt 16 ids, 128 new ones at full size) with CUDA events: grapec's one graph launch, HF generate
(eager), the static-cache decode step replayed per token as a CUDA graph, and the same step under
torch.compile(mode="reduce-overhead"). Prints ms per generated token and the ratio to grapec.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "src"), os.path.join(ROOT, "models")]


def fp32_margin(zm, feeds, tokens, at: int) -> float:
    """How far apart, in the fp32 model's own logits, the reference's token and the one grapec chose
    are at the first difference (a near-tie that fp16 rounding can flip, or a real error)."""
    import torch
    model = zm.module.model.float().cpu()
    ids = np.concatenate([feeds["prompt_ids"][0], np.asarray(tokens[:at], np.int64)])
    with torch.no_grad():
        logits = model(input_ids=torch.from_numpy(ids)[None], use_cache=False).logits[0, -1]
    return float(logits.max() - logits[tokens[at]])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="full", choices=["tiny", "full"])
    ap.add_argument("--precision", nargs="+", default=["fp16"], choices=["fp32", "fp16"])
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()

    import zoo
    import grapec
    from grapec.tools.bench import bench_grapec, bench_torch, generation_table

    t0 = time.perf_counter()
    zm = zoo.get("gpt2_generate", args.size)
    path = os.path.join(ROOT, "models", args.size, "gpt2_generate.onnx")
    if not os.path.exists(path):
        zm.export(path)
    print(f"[gen] model ready in {time.perf_counter() - t0:.0f}s: {path}", flush=True)
    feeds = zm.random_inputs(args.seed)   # max_new_tokens = the cache's room, eos_token_id = -1
    t0 = time.perf_counter()
    ref = [int(t) for t in zm.run_torch(feeds)[0]]
    print(f"[gen] PyTorch fp32 greedy loop on the CPU: {len(ref)} tokens in {time.perf_counter() - t0:.1f}s", flush=True)

    results = {}
    for precision in args.precision:
        t0 = time.perf_counter()
        # --strict where attention fuses (half precision); in fp32 it stays GEMM + softmax + GEMM, a note
        bundle = grapec.compile(path, precision=precision, strict=precision != "fp32")
        compile_s = time.perf_counter() - t0
        g = bench_grapec(bundle, feeds, args.iterations, warmup=3)
        same_as_ref = next((i for i, (a, b) in enumerate(zip(g["tokens"], ref)) if a != b), len(ref))
        print(f"[gen] {precision}: compiled in {compile_s:.0f}s; tokens equal to the PyTorch fp32 loop: "
              f"first {same_as_ref} of {len(ref)}; {g['launches']} launch(es)", flush=True)
        margin = None
        if same_as_ref < len(ref):
            margin = fp32_margin(zm, feeds, g["tokens"], same_as_ref)
            print(f"[gen] {precision}: at token {same_as_ref} grapec chose {g['tokens'][same_as_ref]}, the fp32 "
                  f"loop {ref[same_as_ref]}; their fp32 logits differ by {margin:.4g}", flush=True)
        peers = bench_torch(zm.module, feeds, args.iterations, say=lambda m: print(f"[gen] {m}", flush=True),
                            precision=precision)
        rows = [("grapec (one graph launch)", g["replay"])] + [(k, v) for k, v in peers.items() if not k.startswith("_")]
        results[precision] = {"grapec": g, "peers": peers, "compile_s": compile_s, "reference_tokens": ref,
                              "equal_prefix_vs_reference": same_as_ref, "fp32_logit_margin_at_divergence": margin}
        print(f"\n{os.path.basename(path)} ({args.size}) in {precision} on {g['device']}, batch 1, "
              f"prompt {feeds['prompt_ids'].shape[1]}, median of {args.iterations} runs")
        print("\n".join(generation_table(g, rows)))
        for k, v in peers.items():
            if k.startswith("_") and k.endswith(" error"):
                print(f"peer failed: {k[1:-len(' error')]}: {v}")
        print(flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
