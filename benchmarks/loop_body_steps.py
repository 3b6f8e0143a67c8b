"""Each step of a generation loop's body timed alone on the GPU: GPT-2 (full) gpt2_generate in fp16, or a
decoder with past key/values wrapped by `--generate` (an onnxruntime-genai builder export).

    python benchmarks/loop_body_steps.py        (GPU; writes body.json under $OUT, else /tmp)
    python benchmarks/loop_body_steps.py --model /tmp/llm/llama1b_fp16/model.onnx --prompt 128 --new 256

`grapec bench --per-step` times the top-level steps, where a whole generation is one Loop step. This
compiles the zoo's gpt2_generate (one fp16 calibration draw, to be quick), runs it once, then builds
each step of the Loop's body alone into a CUDA graph as a chain of 16 copies (runtime/cuda/profile.py's
method: node gap included) and prints the time per copy, then the sums by kind (small GEMMs, attention,
the KV cache's Where updates, other kernels). Their sum is what one decode step's kernels take alone;
the replay's time per token minus it is what the body's node gaps and the WHILE node add.
"""
import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "src"), os.path.join(ROOT, "models")]


def compiled(a):
    """(the generation bundle, one run's feeds): the zoo's gpt2_generate, or --model wrapped for --new tokens."""
    import numpy as np
    import grapec
    import zoo
    import grapec.compiler.mixed_precision as mp
    if a.model:
        b = grapec.compile(a.model, generate=a.new, dims={"batch": 1, "prompt": a.prompt})
        ids = np.random.default_rng(0).integers(0, 1000, (1, a.prompt)).astype(np.int64)
        return b, {"prompt_ids": ids, "prompt_lengths": np.array([a.prompt]), "max_new_tokens": np.array(a.new),
                   "eos_token_id": np.array(-1)}
    mp.CALIBRATION_DRAWS = 1
    zm = zoo.get("gpt2_generate", "full")
    path = os.path.join(ROOT, "models", "full", "gpt2_generate.onnx")
    if not os.path.exists(path):
        zm.export(path)
    return grapec.compile(path, precision="fp16", strict=True), zm.random_inputs(0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a decoder with past key/values (default: the zoo's gpt2_generate)")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=256)
    a = ap.parse_args()
    import grapec
    from grapec.plan import LoopStep, chain_deps
    from grapec.runtime.cuda.driver import call, graph_ms
    from grapec.runtime.cuda.graph import GraphBuilder
    from grapec.runtime.cuda.profile import ITERATIONS, REPEAT, step_kind
    b, feeds = compiled(a)
    sess = grapec.load(b, backend="cuda")
    sess.run(feeds)
    r = sess._runner
    loop = [s for s in r.plan(0).steps if isinstance(s, LoopStep)][0]
    rows = []
    for i, st in enumerate(loop.body.steps):
        graph = call("cuGraphCreate", 0)
        GraphBuilder(r, 0).add_steps(graph, [st] * REPEAT, [], order=chain_deps(REPEAT))
        us = graph_ms(graph, r.stream, ITERATIONS) * 1e3 / REPEAT
        rows.append((i, step_kind(b, st), us, st.origin[:4]))
    out = os.environ.get("OUT", "/tmp")
    json.dump([list(x) for x in rows], open(os.path.join(out, "body.json"), "w"), indent=1)
    for x in rows:
        print(f"{x[0]:3d} {x[1]:12s} {x[2]:6.2f}  {x[3]}")
    print(f"sum {sum(x[2] for x in rows):.1f} us over {len(rows)} steps")
    by = {}
    for x in rows:
        k = x[1] if x[1] != "kernel" else ("where" if any("Where" in o for o in x[3][:1]) else "kernel")
        by[k] = by.get(k, 0) + x[2]
    print({k: round(v, 1) for k, v in by.items()})


if __name__ == "__main__":
    main()
