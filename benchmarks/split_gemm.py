"""GEMMs of 17-128 rows against a weight, fp16, one process, one GPU: grapec's split small GEMM
(codegen/small_gemm.py, a cluster of blocks dividing K) against its cuBLASLt call and torch's F.linear.

    python benchmarks/split_gemm.py [--shapes 128x768x3072,...] [--iterations 200] [--compile-only]

Each shape is M x N x K, as y = x @ W + b + r in float16 (a transformer's projection with its bias and residual,
or a late convolution's pixels against its filters). Variants, each a bundle of that one GEMM, its
replay and its step alone timed:
  split     the split small GEMM, taken whatever the cost model says (a device profile whose
            small_gemm coefficients are scaled down prices it under cuBLASLt);
  cuBLASLt  --fusion rules: no small GEMM, the matmul a cuBLASLt call with its epilogue.
torch: F.linear(x, W, b) + r in a CUDA graph of 20 calls. The split bundle's output is checked against
numpy (float32 from the same half values). --compile-only compiles the split bundles (NVRTC, no GPU).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np
from onnx import TensorProto, helper, numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))

SHAPES = "128x768x3072,128x768x768,128x2304x768,128x3072x768,49x512x4608,49x2048x512,32x768x3072,64x1024x1024"


def gemm_model(m: int, n: int, k: int, rng) -> tuple:
    """The model in float16 throughout (inputs, weights, output), so that the bundle is the GEMM alone."""
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float16)
    b = (rng.standard_normal(n) / 4).astype(np.float16)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "b"], ["q"]),
             helper.make_node("Add", ["q", "r"], ["y"])]
    half = TensorProto.FLOAT16
    g = helper.make_graph(nodes, "gemm", [helper.make_tensor_value_info("x", half, [m, k]),
                                          helper.make_tensor_value_info("r", half, [m, n])],
                          [helper.make_tensor_value_info("y", half, [m, n])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    feeds = {"x": rng.standard_normal((m, k)).astype(np.float16), "r": rng.standard_normal((m, n)).astype(np.float16)}
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), feeds, w, b


def forcing_profile() -> str:
    """The shipped H100 profile with its small_gemm coefficients scaled by 1/100: every small GEMM
    candidate, the split form included (which the pass takes only priced), costs less than cuBLASLt."""
    from grapec.cost.device import load_profile
    d = load_profile("h100").to_json()
    d["coefficients"]["small_gemm"] = {f: c / 100 for f, c in d["coefficients"]["small_gemm"].items()}
    path = os.path.join(tempfile.mkdtemp(), "force_small_gemm.json")
    with open(path, "w") as f:
        json.dump(d, f)
    return path


def compile_variant(model, shape, variant: str, profile: str):
    import grapec
    kw = {"device_profile": profile} if variant == "split" else {"fusion": "rules"}
    return grapec.compile(model, shapes={"x": shape[::2], "r": shape[:2]}, precision="fp16", targets=["sm_90"], **kw)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--compile-only", action="store_true")
    a = ap.parse_args()
    from grapec.ir.kinds import kernel_from_json
    from grapec.ir.small_gemm import SmallGemmKernel
    profile = forcing_profile()
    rows = []
    for spec in a.shapes.split(","):
        m, n, k = (int(v) for v in spec.split("x"))
        rng = np.random.default_rng(m * 7 + n + k)
        model, feeds, w, b = gemm_model(m, n, k, rng)
        split = compile_variant(model, (m, n, k), "split", profile)
        kinds = [type(kernel_from_json(x)).__name__ for x in split.kernels]
        assert any(isinstance(kernel_from_json(x), SmallGemmKernel) for x in split.kernels), (spec, kinds)
        if a.compile_only:
            print(f"{spec}: compiled, kernels {kinds}", flush=True)
            continue
        import torch
        import grapec
        from grapec.tools.bench import bench_grapec, torch_graph_us
        f = lambda v: v.astype(np.float32)  # noqa: E731
        ref = f(feeds["x"]) @ f(w) + f(b) + f(feeds["r"])
        got = grapec.load(split, backend="cuda").run(feeds)["y"].astype(np.float32)
        err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
        res = {}
        for name, bundle in (("split", split), ("cuBLASLt", compile_variant(model, (m, n, k), "cuBLASLt", profile))):
            r = bench_grapec(bundle, feeds, a.iterations, per_step=True)
            res[name] = (r["replay"]["median_ms"] * 1e3, sum(s["us"] for s in r["steps"]), [s["kind"] for s in r["steps"]])
        xt, wt, bt, rt = (torch.from_numpy(v).cuda() for v in (feeds["x"], w.T.copy(), b, feeds["r"]))
        t_us = torch_graph_us(lambda: torch.nn.functional.linear(xt, wt, bt) + rt)
        rows.append((spec, res["split"], res["cuBLASLt"], t_us, err))
        print(f"{spec}: split {res['split'][0]:.1f} us (steps {res['split'][2]} {res['split'][1]:.1f}), cuBLASLt "
              f"{res['cuBLASLt'][0]:.1f} (steps {res['cuBLASLt'][2]} {res['cuBLASLt'][1]:.1f}), torch {t_us:.1f}, "
              f"rel err {err:.1e}", flush=True)
    if rows:
        print("\n| M x N x K | split: replay us (steps alone) | cuBLASLt: replay us (steps alone) | torch F.linear + r us | "
              "cuBLASLt / split | torch / split | split rel err |\n|---|---|---|---|---|---|---|")
        for spec, s, c, t, err in rows:
            print(f"| {spec} | {s[0]:.1f} ({s[1]:.1f}) | {c[0]:.1f} ({c[1]:.1f}) | {t:.1f} | {c[0] / s[0]:.2f}x | "
                  f"{t / s[0]:.2f}x | {err:.1e} |")


if __name__ == "__main__":
    main()
