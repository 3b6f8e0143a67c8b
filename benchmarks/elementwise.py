"""Element-mode kernels at 1, 4 and 8 elements a thread (codegen/launch.py ELEMENTS_PER_THREAD): one
process, one GPU.

    python benchmarks/elementwise.py

The kernel is GPT-2's logits cast at batch 16 x seq 128: fp16 rows padded to 50264 read, float32
rows of 50257 written (206 MB in, 411 MB out). One element a thread ran it at 1.3 TB/s on an H100
(2026-11-25), 32-bit and 64-bit index divisions alike. Prints each variant's time alone (its graph
node), its bandwidth and whether its output is exact.
"""
from __future__ import annotations

import os
import sys

import numpy as np
from onnx import TensorProto, helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))

ROWS, WIDTH, PADDED = 2048, 50257, 50264


def cast_model():
    nodes = [helper.make_node("Slice", ["x", "st", "en", "ax"], ["s"]),
             helper.make_node("Cast", ["s"], ["y"], to=TensorProto.FLOAT)]
    consts = [helper.make_tensor("st", TensorProto.INT64, [1], [0]), helper.make_tensor("en", TensorProto.INT64, [1], [WIDTH]),
              helper.make_tensor("ax", TensorProto.INT64, [1], [1])]
    g = helper.make_graph(nodes, "cast", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [ROWS, PADDED])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [ROWS, WIDTH])], consts)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def main():
    import grapec
    from grapec.tools.bench import bench_grapec
    from grapec.codegen import launch
    m = cast_model()
    x = np.random.default_rng(0).standard_normal((ROWS, PADDED)).astype(np.float16)
    want = x[:, :WIDTH].astype(np.float32)
    print("| elements a thread | us | GB/s | exact |\n|---|---|---|---|")
    for per in (1, 4, 8):
        launch.ELEMENTS_PER_THREAD = per
        b = grapec.compile(m, targets=["sm_90"])
        y = grapec.load(b, backend="cuda").run({"x": x})["y"]
        us = bench_grapec(b, {"x": x}, 50, per_step=True)["steps"][0]["us"]
        print(f"| {per} | {us:.1f} | {(want.nbytes // 2 + want.nbytes) / (us * 1e3):.0f} | {np.array_equal(y, want)} |", flush=True)


if __name__ == "__main__":
    main()
