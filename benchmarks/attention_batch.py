"""grapec's fused attention kernel at service batches, against PyTorch's scaled_dot_product_attention,
in one process on one GPU; with variants of the kernel's launch shape (codegen/attention.py).

    python benchmarks/attention_batch.py [--shapes 1x12x128x64,8x12x128x64,32x12x128x64] [--variants default,cudnn]

A variant named wWsS forces the tiling: W warps per query tile, S key slices (codegen/attention.py
attention_tiling), whatever the heuristic would pick.

The model is attention as exporters write it (BERT's form): MatMul(q, kᵀ) · scale + an additive mask
over the keys, Softmax, MatMul(·, v), q/k/v [B, H, S, D], fp16. grapec's time is one replay of its
CUDA graph (the attention kernel plus the input casts); PyTorch's is one SDPA call captured in a
CUDA graph. The table gives microseconds and the ratio (above 1: grapec faster). The cudnn variant is
the attention as cuDNN's SDPA (`--attention cudnn`, passes/sdpa.py): its mask kernel is timed apart.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))

VARIANTS = {   # name -> codegen/attention.py constants (cudnn: the `sdpa` step, --attention cudnn)
    "default": {},
    "cudnn": {},
    "warps2": {"MAX_WARPS": 2},
    "warps8": {"MAX_WARPS": 8},
    "tile32": {"MAX_KEY_TILE": 32},
    "tile128": {"MAX_KEY_TILE": 128},
    "min4": {"MIN_BLOCKS": 4},
    "tile32_min4": {"MAX_KEY_TILE": 32, "MIN_BLOCKS": 4},
}


def attention_model(b, h, s, d):
    import onnx
    from onnx import TensorProto, helper
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["qk"]),
             helper.make_node("Mul", ["qk", "scale"], ["scaled"]),
             helper.make_node("Add", ["scaled", "mask"], ["scores"]),
             helper.make_node("Softmax", ["scores"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    ins = [helper.make_tensor_value_info(n, f, [b, h, s, d]) for n in ("q", "k", "v")]
    ins.append(helper.make_tensor_value_info("mask", f, [b, 1, 1, s]))
    scale = onnx.numpy_helper.from_array(np.array(1 / np.sqrt(d), np.float32), "scale")
    g = helper.make_graph(nodes, "attention", ins, [helper.make_tensor_value_info("y", f, None)], [scale])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _force_tiling(name: str):
    """Variant wWsS: every attention kernel's tiling (W warps, S key slices) recorded as such by
    passes/mappings.py, which reads codegen/attention.py attention_tiling."""
    import re
    from grapec.codegen import attention as att
    from grapec.passes import mappings
    m = re.fullmatch(r"w(\d+)s(\d+)", name)
    if m is None:
        mappings.attention_tiling = att.attention_tiling
        return
    warps, slices = int(m.group(1)), int(m.group(2))
    mappings.attention_tiling = lambda k: (warps, slices, att._key_tile(k, 32 * warps * slices, slices))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="1x12x128x64,8x12x128x64,32x12x128x64")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    a = ap.parse_args()
    import torch
    import grapec
    from grapec.tools.bench import bench_grapec, torch_graph_us
    from grapec.codegen import attention as att
    base = {k: getattr(att, k) for k in ("MAX_WARPS", "MAX_KEY_TILE", "MIN_BLOCKS")}
    rows = []
    for shp in a.shapes.split(","):
        b, h, s, d = (int(x) for x in shp.split("x"))
        rng = np.random.default_rng(0)
        feeds = {n: rng.standard_normal((b, h, s, d)).astype(np.float32) for n in ("q", "k", "v")}
        mask = np.zeros((b, 1, 1, s), np.float32)
        mask[:, :, :, s - s // 4:] = -10000.0   # the last quarter of the keys padded
        feeds["mask"] = mask
        m = attention_model(b, h, s, d)
        row = {"shape": shp}
        for name in a.variants.split(","):
            for k, v in {**base, **VARIANTS.get(name, {})}.items():
                setattr(att, k, v)
            _force_tiling(name)
            engine = "cudnn" if name == "cudnn" else "kernel"
            bundle = grapec.compile(m, precision="fp16", precision_tolerance=2e-2, attention=engine)
            kinds = [k.get("kind") for k in bundle.kernels]
            res = bench_grapec(bundle, feeds, 200, per_step=True)
            att_us = [st["us"] for st in res.get("steps", []) if st.get("kind") in ("attention", "sdpa")]
            row[name] = att_us[0] if att_us else None
            row[name + "_replay_us"] = res["replay"]["median_ms"] * 1000
            row["fused"] = "attention" in kinds
        for k, v in base.items():
            setattr(att, k, v)
        _force_tiling("default")
        t = {n: torch.tensor(feeds[n], device="cuda", dtype=torch.float16) for n in feeds}
        f = torch.nn.functional.scaled_dot_product_attention
        row["torch_sdpa"] = torch_graph_us(lambda: f(t["q"], t["k"], t["v"], attn_mask=t["mask"]))
        rows.append(row)
        print(row, flush=True)
    names = a.variants.split(",")
    print(f"\n{torch.cuda.get_device_name()}: attention kernel alone (us; ratio = torch SDPA / grapec)")
    print("| B x H x S x D | " + " | ".join(names) + " | torch SDPA |")
    print("|---" * (len(names) + 2) + "|")
    for r in rows:
        cells = [f"{r[n]:.1f} ({r['torch_sdpa'] / r[n]:.2f}x)" if r.get(n) else "-" for n in names]
        print(f"| {r['shape']} | " + " | ".join(cells) + f" | {r['torch_sdpa']:.1f} |")


if __name__ == "__main__":
    main()
