"""Few-row fp16 matmuls against a weight, one process, one GPU: grapec's gemv kernel (passes/gemv.py, a
warp per output) against its SmallGemmKernel (passes/small_gemm.py, k-sliced tensor-core tiles).

    python benchmarks/gemv_vs_small_gemm.py [--shapes 1x2304x768,...] [--iterations 50]

Each shape is M x N x K: y = a @ W, a [M, K] float16, W [K, N] a float16 weight. Each variant is the one
MatMul compiled with the other route switched off (passes/gemv.py's GEMV_DTYPES / its bytes bound), its
step timed alone as a graph node (runtime/cuda/profile.py: node gap included), and its output checked
against numpy (float32 from the same half values). passes/gemv.py's GEMV_OVER_SMALL_GEMM_BYTES comes
from this table.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))

SHAPES = ("1x2304x768,1x768x768,1x3072x768,1x768x3072,1x50257x768,1x3072x2048,1x2048x2048,1x16384x2048,"
          "1x2048x8192,1x128256x2048,2x16384x2048,2x2048x8192,4x3072x2048,4x2304x768")


def matmul_model(m: int, n: int, k: int, rng):
    w = (rng.standard_normal((k, n), dtype=np.float32) * 0.02).astype(np.float16)
    g = helper.make_graph([helper.make_node("MatMul", ["a", "w"], ["y"])], "matmul",
                          [helper.make_tensor_value_info("a", TensorProto.FLOAT16, [m, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [m, n])],
                          [numpy_helper.from_array(w, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), w


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--iterations", type=int, default=50)
    args = ap.parse_args()
    import grapec
    import grapec.passes.gemv as gemv
    from grapec.tools.bench import bench_grapec

    rng = np.random.default_rng(0)
    rows = []
    for shape in args.shapes.split(","):
        m, n, k = map(int, shape.split("x"))
        model, w = matmul_model(m, n, k, rng)
        feeds = {"a": rng.standard_normal((m, k)).astype(np.float16)}
        ref = feeds["a"].astype(np.float32) @ w.astype(np.float32)
        got = {}
        for variant in ("gemv", "small_gemm"):
            gemv.GEMV_DTYPES = ("float16", "bfloat16", "float32") if variant == "gemv" else ("float32",)
            gemv.GEMV_OVER_SMALL_GEMM_BYTES = 0   # the gemv wherever it is allowed
            bundle = grapec.compile(model)
            kinds = [bundle.kernels[s.kernel].get("kind", "kernel") for s in bundle.plans[0].steps]
            timed = bench_grapec(bundle, feeds, args.iterations, per_step=True)
            y = grapec.load(bundle, backend="cuda").run(None, feeds)[0].astype(np.float32)
            err = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
            got[variant] = (sum(s["us"] for s in timed["steps"]), "+".join(kinds), err)
        rows.append((m, n, k, got))
        print(f"[gemv] {shape}: {got}", flush=True)
    print("\n| M | N | K | weight MiB | gemv us | small_gemm us | gemv / small_gemm | rel err gemv, small_gemm |")
    print("|---|---|---|---|---|---|---|---|")
    for m, n, k, got in rows:
        g, s = got["gemv"], got["small_gemm"]
        print(f"| {m} | {n} | {k} | {n * k * 2 / 2**20:.1f} | {g[0]:.2f} ({g[1]}) | {s[0]:.2f} ({s[1]}) | "
              f"{g[0] / s[0]:.2f} | {g[2]:.1e}, {s[2]:.1e} |")


if __name__ == "__main__":
    main()
