"""--precision fp16: rewrite an ONNX model to compute in float16, keeping its interface.

The model's float32 inputs and outputs stay float32 (a Cast at each end), so a caller feeds the
same arrays as before. Inside, weights and constants become float16 (clamped to +-65504, so an
exporter's -3.4e38 attention mask stays finite), Casts to float become Casts to float16, and every
activation is float16. What must not lose precision does not: kernels compute float16 values in
float32 registers and round only when storing (so a fused softmax or LayerNorm keeps its statistics
in float32), and cuBLASLt accumulates float16 GEMMs in float32.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .proto import all_nodes, copy_model, subgraphs

FP16_MAX = 65504.0
# (op, input index) that ONNX requires to stay float32 whatever T is.
KEEP_FLOAT32_INPUTS = {("Resize", 1), ("Resize", 2), ("Upsample", 1)}
DTYPE_ATTR_OPS = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "EyeLike", "Multinomial"}


def to_fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    m = copy_model(model)
    g = m.graph
    keep = {n.input[i] for n in all_nodes(g) for (op, i) in KEEP_FLOAT32_INPUTS
            if n.op_type == op and i < len(n.input)}
    _convert_graph(g, keep)

    # interface: float32 in, float32 out
    init_names = {t.name for t in g.initializer}
    casts_in, casts_out = [], []
    for vi in g.input:
        if vi.name in init_names or vi.type.tensor_type.elem_type != TensorProto.FLOAT:
            continue
        inner = vi.name + "__fp16"
        _rename_uses(g, vi.name, inner)
        casts_in.append(helper.make_node("Cast", [vi.name], [inner], to=TensorProto.FLOAT16,
                                         name=f"grapec_fp16_in_{vi.name}"))
    produced = {o for n in g.node for o in n.output}
    for vo in g.output:
        if vo.type.tensor_type.elem_type != TensorProto.FLOAT or vo.name not in produced:
            continue
        inner = vo.name + "__fp16"
        for n in g.node:
            n.output[:] = [inner if o == vo.name else o for o in n.output]
        _rename_uses(g, vo.name, inner)
        casts_out.append(helper.make_node("Cast", [inner], [vo.name], to=TensorProto.FLOAT,
                                          name=f"grapec_fp16_out_{vo.name}"))
    nodes = casts_in + list(g.node) + casts_out
    del g.node[:]
    g.node.extend(nodes)
    del g.value_info[:]   # recomputed by `specialize`; stale float32 annotations would mislead
    return m


def _convert_graph(g: onnx.GraphProto, keep: set):
    for i, t in enumerate(g.initializer):
        if t.data_type == TensorProto.FLOAT and t.name not in keep:
            g.initializer[i].CopyFrom(_half(t))
    for n in g.node:
        if n.op_type == "Cast":
            for a in n.attribute:
                if a.name == "to" and a.i == TensorProto.FLOAT:
                    a.i = TensorProto.FLOAT16
        elif n.op_type in ("Constant", "ConstantOfShape"):
            for a in n.attribute:
                if a.name == "value" and a.t.data_type == TensorProto.FLOAT and not (set(n.output) & keep):
                    a.t.CopyFrom(_half(a.t))
                elif a.name == "value_float" and not (set(n.output) & keep):
                    a.CopyFrom(helper.make_attribute("value", _half(numpy_helper.from_array(np.array(a.f, np.float32)))))
                elif a.name == "value_floats" and not (set(n.output) & keep):
                    a.CopyFrom(helper.make_attribute("value", _half(numpy_helper.from_array(np.array(a.floats, np.float32)))))
        elif n.op_type in DTYPE_ATTR_OPS:
            for a in n.attribute:
                if a.name == "dtype" and a.i == TensorProto.FLOAT:
                    a.i = TensorProto.FLOAT16
        for body in subgraphs(n):
            _convert_body(body, keep)


def _convert_body(g: onnx.GraphProto, keep: set):
    """An If/Loop/Scan body: its float32 inputs/outputs become float16 like everything else."""
    _convert_graph(g, keep)
    for vi in list(g.input) + list(g.output):
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            vi.type.tensor_type.elem_type = TensorProto.FLOAT16
    del g.value_info[:]


def _half(t: onnx.TensorProto) -> onnx.TensorProto:
    a = numpy_helper.to_array(t).astype(np.float32)
    a = np.where(np.isfinite(a), np.clip(a, -FP16_MAX, FP16_MAX), a)   # explicit inf/nan stay
    return numpy_helper.from_array(a.astype(np.float16), t.name)


def _rename_uses(g: onnx.GraphProto, old: str, new: str):
    for n in all_nodes(g):   # bodies read outer values by name too
        n.input[:] = [new if i == old else i for i in n.input]
