"""The calibration model: one ONNX graph of independent branches, each a kernel the cost model must
price, at shapes chosen to pull its coefficients apart (tiny and huge, few rows and many, short
rows and long ones, aligned and unaligned GEMMs). `grapec calibrate` compiles it in fp16, times
every step alone on the GPU and fits the profile to the times.

The shapes are deliberately not the zoo's (no 768-wide rows, no 50257 vocabulary), so the zoo's
measured steps are a fair check of the fitted model.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
ELEMENTWISE_SIZES = (256, 1 << 16, 1 << 20, 1 << 23)
GELU_SIZES = (1 << 16, 1 << 22)
ROW_SHAPES = ((1, 1024), (16, 512), (16, 4096), (200, 1024), (2000, 512), (2000, 4096), (64, 16384))
SOFTMAX_SHAPES = ((4, 256), (96, 32), (1536, 256), (8192, 64), (40, 2048), (2, 30000))
REDUCE_SHAPES = ((1, 65536), (64, 4096), (4096, 64), (20000, 16))
GEMMS = [(m, k, n) for m in (8, 48, 256, 1024) for k, n in ((512, 512), (1024, 4096), (4096, 1024), (1536, 1536))]
GEMMS += [(16, 256, 8192), (3000, 576, 128), (196, 2304, 256), (8, 1024, 32768), (1, 2048, 2048)]
GEMMS += [(1, 2048, 8192)]   # one row against 32 MiB: a gemv kernel (passes/gemv.py), the rest few-row small GEMMs
# few-row GEMMs against weights become small_gemm kernels (passes/small_gemm.py); against an input B
# they stay cuBLASLt's, so both sides of that choice are measured; LN_GEMMS have a LayerNorm prologue
SMALL_M_LIBRARY = [(m, k, n) for m, k, n in GEMMS if 4 < m <= 16]
LN_GEMMS = ((8, 1024, 3072), (16, 512, 1536), (12, 2048, 512), (8, 256, 20000))
UNALIGNED = ((512, 1535, 400), (64, 999, 336))   # odd K: A's rows stay unaligned (aligned_rows pads N only)
BATCHED = ((16, 64, 96, 200), (48, 32, 4096, 24))
CONVS = ((48, 40, 96, 3), (160, 20, 160, 3), (24, 80, 32, 5))   # (channels in, height = width, channels out, kernel)
ATTENTION = ((8, 16), (12, 64), (16, 200), (12, 384), (4, 1024))   # (heads, sequence), head dim 64
# cuDNN's SDPA (passes/sdpa.py), compiled apart with --attention cudnn: (batch, heads, sequence), head dim 64
SDPA = ((1, 12, 128), (4, 12, 128), (8, 12, 128), (32, 12, 128), (16, 12, 256), (2, 16, 1024), (8, 8, 64))


class _Graph:
    def __init__(self, seed: int):
        self.nodes, self.inputs, self.outputs, self.inits = [], [], [], []
        self.rng = np.random.default_rng(seed)
        self.n = 0

    def name(self, tag: str) -> str:
        self.n += 1
        return f"{tag}_{self.n}"

    def input(self, shape, dtype=TensorProto.FLOAT) -> str:
        name = self.name("in")
        self.inputs.append(helper.make_tensor_value_info(name, dtype, list(shape)))
        return name

    def weight(self, array) -> str:
        name = self.name("w")
        self.inits.append(numpy_helper.from_array(np.asarray(array, np.float32), name))
        return name

    def node(self, op, inputs, **attrs) -> str:
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, list(inputs), [out], **attrs))
        return out

    def output(self, name: str):
        self.outputs.append(name)

    def model(self) -> onnx.ModelProto:
        """The graph, its outputs typed by ONNX shape inference."""
        g = helper.make_graph(self.nodes, "grapec_calibration", self.inputs, [], self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="grapec calibrate")
        inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(m).graph.value_info}
        m.graph.output.extend(inferred[name] for name in self.outputs)
        return m


def calibration_model(seed: int = 0) -> onnx.ModelProto:
    g = _Graph(seed)
    for n in ELEMENTWISE_SIZES:
        x = g.input([n])
        g.output(g.node("Add", [g.node("Mul", [x, g.weight(1.5)]), x]))
    for n in GELU_SIZES:
        g.output(_gelu_tanh(g, g.input([n])))
    for rows, cols in ROW_SHAPES:
        x = g.input([rows, cols])
        scale, bias = g.weight(g.rng.standard_normal(cols)), g.weight(g.rng.standard_normal(cols))
        g.output(g.node("LayerNormalization", [x, scale, bias], axis=-1, epsilon=1e-5))
    for rows, cols in SOFTMAX_SHAPES:
        g.output(g.node("Softmax", [g.input([rows, cols])], axis=-1))
    for rows, cols in REDUCE_SHAPES:
        g.output(g.node("ReduceSum", [g.input([rows, cols]), _axes(g, [-1])], keepdims=0))
    x = g.input([1024, 512])
    g.output(g.node("Add", [g.node("Transpose", [x], perm=[1, 0]), g.weight(1.0)]))
    table = g.weight(g.rng.standard_normal((32000, 512)) * 0.1)
    for n in (16, 1000):
        g.output(g.node("Gather", [table, g.input([1, n], TensorProto.INT64)], axis=0))
    for m, k, n in GEMMS:
        g.output(g.node("MatMul", [g.input([m, k]), g.weight(g.rng.standard_normal((k, n)) / np.sqrt(k))]))
    for m, k, n in SMALL_M_LIBRARY:
        g.output(g.node("MatMul", [g.input([m, k]), g.input([k, n])]))
    for m, k, n in LN_GEMMS:
        scale, bias = g.weight(1 + g.rng.standard_normal(k) / 4), g.weight(g.rng.standard_normal(k) / 4)
        x = g.node("LayerNormalization", [g.input([m, k]), scale, bias], axis=-1, epsilon=1e-5)
        g.output(g.node("MatMul", [x, g.weight(g.rng.standard_normal((k, n)) / np.sqrt(k))]))
    for m, k, n in UNALIGNED:
        g.output(g.node("MatMul", [g.input([m, k]), g.input([k, n])]))
    for b, m, k, n in BATCHED:
        g.output(g.node("MatMul", [g.input([b, m, k]), g.input([b, k, n])]))
    for c_in, size, c_out, k in CONVS:   # im2col gathers (cache-heavy reads) and their GEMMs
        w = g.weight(g.rng.standard_normal((c_out, c_in, k, k)) / np.sqrt(c_in * k * k))
        g.output(g.node("Relu", [g.node("Conv", [g.input([1, c_in, size, size]), w], pads=[k // 2] * 4)]))
    for heads, seq in ATTENTION:
        _attention(g, 1, heads, seq)
    return g.model()


def sdpa_calibration_model(seed: int = 0) -> onnx.ModelProto:
    """The attention problems of SDPA, to compile with attention="cudnn" (the calibration model's own
    attention is compiled as the generated kernel)."""
    g = _Graph(seed)
    for batch, heads, seq in SDPA:
        _attention(g, batch, heads, seq)
    return g.model()


def _attention(g: _Graph, batch: int, heads: int, seq: int):
    q, k, v = (g.input([batch, heads, seq, 64]) for _ in range(3))
    scores = g.node("Mul", [g.node("MatMul", [q, g.node("Transpose", [k], perm=[0, 1, 3, 2])]), g.weight(0.125)])
    g.output(g.node("MatMul", [g.node("Softmax", [scores], axis=-1), v]))


def _gelu_tanh(g: _Graph, x: str) -> str:
    cube = g.node("Mul", [g.node("Mul", [x, x]), x])
    inner = g.node("Mul", [g.node("Add", [x, g.node("Mul", [cube, g.weight(0.044715)])]), g.weight(0.7978845608)])
    return g.node("Mul", [g.node("Mul", [x, g.weight(0.5)]), g.node("Add", [g.node("Tanh", [inner]), g.weight(1.0)])])


def _axes(g: _Graph, axes: list) -> str:
    name = g.name("axes")
    g.inits.append(numpy_helper.from_array(np.asarray(axes, np.int64), name))
    return name
