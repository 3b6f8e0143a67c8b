"""An LM head whose output rows are an odd width (GPT-2: 50257 logits), fp16, one process, one GPU:
grapec's ways of writing it against torch's F.linear (cuBLAS) on the same shape.

    python benchmarks/lm_head.py [--rows 2048] [--candidates 8,32]

Variants, each its GEMM (and copy) steps timed alone and the whole replay:
  padded + copy  the GEMM writes rows padded to 16 bytes, one copy kernel compacts them
                 (passes/aligned_rows.py, from COPY_OUTPUT_FROM_ROWS rows);
  odd rows       the GEMM writes the 50257-wide rows itself, cuBLASLt's heuristic ranking up to N
                 candidates that load-time tuning times (runtime/cuda/blas.py TUNE_CANDIDATES).
torch: F.linear(x, W) with W [50257, 768] in a CUDA graph of 20 calls.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))

VOCAB, HIDDEN = 50257, 768


def lm_head_model(rows: int, w: np.ndarray):
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["logits"])], "lm_head",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, HIDDEN])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [rows, VOCAB])],
                          [numpy_helper.from_array(w, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def time_variant(model, rows, x, candidates: int, copy: bool) -> tuple:
    import grapec
    import grapec.passes.aligned_rows as aligned_rows
    import grapec.runtime.cuda.blas as blas
    from grapec.tools.bench import bench_grapec
    aligned_rows.COPY_OUTPUT_FROM_ROWS, blas.TUNE_CANDIDATES = (64 if copy else 1 << 40), candidates
    b = grapec.compile(model, shapes={"x": (rows, HIDDEN)}, precision="fp16", half_outputs=True)
    r = bench_grapec(b, {"x": x}, 100, per_step=True)
    got = grapec.load(b, backend="cuda").run({"x": x})["logits"]
    return r["replay"]["median_ms"] * 1e3, [(s["kind"], round(s["us"], 1)) for s in r["steps"]], got


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--candidates", default="8,32")
    a = ap.parse_args()
    import torch
    from grapec.tools.bench import torch_graph_us
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((HIDDEN, VOCAB)) * 0.02).astype(np.float32)
    x = rng.standard_normal((a.rows, HIDDEN)).astype(np.float32)
    model = lm_head_model(a.rows, w)
    ref = x.astype(np.float16).astype(np.float32) @ w.astype(np.float16).astype(np.float32)
    wt = torch.from_numpy(w.T.copy()).cuda().half()
    xt = torch.from_numpy(x).cuda().half()
    torch_us = torch_graph_us(lambda: torch.nn.functional.linear(xt, wt))
    flops = 2.0 * a.rows * VOCAB * HIDDEN
    print(f"rows {a.rows} x {VOCAB} x {HIDDEN} fp16, half output; torch F.linear {torch_us:.1f} us "
          f"({flops / torch_us / 1e6:.0f} TFLOP/s)\n")
    print("| variant | replay us | steps (kind, us) | vs torch | rel err |\n|---|---|---|---|---|")
    for copy in (True, False):
        for n in ([8] if copy else [int(c) for c in a.candidates.split(",")]):
            us, steps, got = time_variant(model, a.rows, x, n, copy)
            err = np.linalg.norm(got.astype(np.float32) - ref) / np.linalg.norm(ref)
            name = "padded + copy" if copy else f"odd rows, {n} candidates"
            print(f"| {name} | {us:.1f} | {steps} | {torch_us / us:.2f}x | {err:.1e} |", flush=True)


if __name__ == "__main__":
    main()
