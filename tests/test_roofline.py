"""cost/roofline.py: the floor benchmarks/zoo.py sets grapec's time against."""
import os

import numpy as np
import onnx
from onnx import numpy_helper

import grapec
from grapec.cost.roofline import plan_roofline

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_floor_counts_the_weights_and_every_gemm():
    path = os.path.join(ROOT, "models", "tiny", "gpt2.onnx")
    b = grapec.compile(path, dims={"batch": 2, "seq": 8}, targets=[])
    r = plan_roofline(b, 0, bandwidth_gbs=1000.0, peak_tflops=100.0)
    assert r.weight_bytes == b.manifest["weights_bytes"] > 0
    m = onnx.load(path)
    inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    tokens = 2 * 8
    gemm_flops = sum(2 * tokens * np.prod(inits[n.input[1]].shape) for n in m.graph.node
                     if n.op_type in ("MatMul", "Gemm") and n.input[1] in inits and inits[n.input[1]].ndim == 2)
    assert gemm_flops > 0
    assert gemm_flops <= r.gflop * 1e9 <= 10 * gemm_flops, (r.gflop * 1e9, gemm_flops)
    assert np.isclose(r.memory_ms, r.weight_bytes / 1e12 * 1e3)
    assert np.isclose(r.compute_ms, r.gflop / 1e5 * 1e3)
    assert r.floor_ms == max(r.memory_ms, r.compute_ms) and r.bound in ("memory", "compute")
    assert plan_roofline(b).floor_ms == 0.0   # nothing measured: no floor claimed
