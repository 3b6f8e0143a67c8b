"""--precision fp16 / bf16: rewrite an ONNX model to compute in a 16-bit float, keeping its interface.

The model's float32 inputs and outputs stay float32 (a Cast at each end), so a caller feeds the
same arrays as before. Inside, weights and constants become 16-bit (float16 clamped to +-65504, so
an exporter's -3.4e38 attention mask stays finite), Casts to float become Casts to the half type,
and every activation is half. What must not lose precision does not: kernels compute half values
in float32 registers and round only when storing (so a fused softmax or LayerNorm keeps its
statistics in float32), and cuBLASLt accumulates half GEMMs in float32.

Some nodes stay float32 (`keep_fp32`): op types that are known to overflow or lose too much in
half (FP32_OPS, as onnxruntime's float16 converter blocks them), and the nodes that the calibration
run (mixed_precision.py) finds diverging. Such a node reads float32 weights and constants, reads float32
graph inputs directly, reads the float32 output of another kept node directly, and gets a Cast
from half for anything else; its float outputs are cast back to half for the rest of the graph.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .external_data import tensor_array
from .proto import all_nodes, copy_model, subgraphs

FP16_MAX = 65504.0
HALF_TYPES = {"fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}
# (op, input index) that ONNX requires to stay float32 whatever T is.
KEEP_FLOAT32_INPUTS = {("Resize", 1), ("Resize", 2), ("Upsample", 1),
                       # quantization scales: rounding them to half moves every requantized value
                       ("QuantizeLinear", 1), ("DequantizeLinear", 1),
                       ("QLinearConv", 1), ("QLinearConv", 4), ("QLinearConv", 6),
                       ("QLinearMatMul", 1), ("QLinearMatMul", 4), ("QLinearMatMul", 6)}
DTYPE_ATTR_OPS = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "EyeLike", "Multinomial"}
# Op types computed in float32 whatever the calibration says, and why (onnxruntime's float16
# converter blocks the same ones for the same reasons).
FP32_OPS = {
    "Range": "counts past 2048 are not exact in float16",
    "CumSum": "a running sum overflows or drifts in half",
    "TopK": "ties and order change when values round",
    "NonMaxSuppression": "box coordinates and scores need float32",
    "RoiAlign": "box coordinates need float32",
    "ReduceSumSquare": "a sum of squares overflows float16",
    "ReduceProd": "a product overflows or underflows in half",
    "QuantizeLinear": "float32 scales; a half input moves values across quantization steps",
    "DequantizeLinear": "float32 scales (opsets before 19 take float32 only)",
    "DynamicQuantizeLinear": "takes float32 and gives a float32 scale by definition",
    "DynamicQuantizeLSTM": "quantizes its float32 input on the fly; its scales are float32",
}


def to_fp16(model: onnx.ModelProto, keep_fp32=(), value_types: dict | None = None) -> onnx.ModelProto:
    return to_half(model, "fp16", keep_fp32, value_types)


def to_half(model: onnx.ModelProto, precision: str = "fp16", keep_fp32=(), value_types: dict | None = None) -> onnx.ModelProto:
    """keep_fp32: indices of top-level nodes that compute in float32. value_types: name -> ONNX
    elem type of the top-level values (needed to know which inputs of a kept node are float)."""
    half = HALF_TYPES[precision]
    m = copy_model(model)
    g = m.graph
    keep = {n.input[i] for n in all_nodes(g) for (op, i) in KEEP_FLOAT32_INPUTS
            if n.op_type == op and i < len(n.input)}
    kept = set(keep_fp32)
    fp32_consts = {**{t.name: tensor_array(t) for t in g.initializer if t.data_type == TensorProto.FLOAT},
                   **_float_constants(g)}
    _convert_graph(g, keep, half, skip=kept)
    kept_at = _keep_nodes_fp32(g, kept, value_types or {}, fp32_consts, half) if kept else set()
    _half_interface(g, half, kept_at)
    del g.value_info[:]   # recomputed by `specialize`; stale float32 annotations would mislead
    return m


KEPT_PREFIX = "grapec_fp32_"


def _half_interface(g: onnx.GraphProto, half: int, kept_at: set):
    """float32 in, float32 out: a Cast after each float32 input and before each float32 output.
    The nodes at positions `kept_at` compute in float32 and read the float32 inputs as they are."""
    init_names = {t.name for t in g.initializer}
    casts_in, casts_out = [], []
    for vi in g.input:
        if vi.name in init_names or vi.type.tensor_type.elem_type != TensorProto.FLOAT:
            continue
        inner = vi.name + "__half"
        if _rename_uses(g, vi.name, inner, skip=kept_at):
            casts_in.append(helper.make_node("Cast", [vi.name], [inner], to=half, name=f"grapec_half_in_{vi.name}"))
    producer = {o: n for n in g.node for o in n.output}
    for vo in g.output:
        if vo.type.tensor_type.elem_type != TensorProto.FLOAT or vo.name not in producer:
            continue
        inner = vo.name + "__half"
        p = producer[vo.name]
        # the output of a float32 node is given as computed, not rounded through half
        src = p.input[0] if p.name.startswith(KEPT_PREFIX) else inner
        for n in g.node:
            n.output[:] = [inner if o == vo.name else o for o in n.output]
        _rename_uses(g, vo.name, inner)
        casts_out.append(helper.make_node("Cast", [src], [vo.name], to=TensorProto.FLOAT,
                                          name=f"grapec_half_out_{vo.name}"))
    nodes = casts_in + list(g.node) + casts_out
    del g.node[:]
    g.node.extend(nodes)


def half_outputs(model: onnx.ModelProto, precision: str = "fp16") -> onnx.ModelProto:
    """The model of to_half with its float32 outputs given in the half type: the Cast before each goes
    (onnxruntime's float16 converter with keep_io_types off; TensorRT's half output formats). A GPT-2
    at batch 16 x seq 128 spent 485 us of 2.1 ms on an H100 widening its logits. An output that a
    float32 node computes is cast to half instead."""
    half = HALF_TYPES[precision]
    m = copy_model(model)
    g = m.graph
    casts = {n.output[0]: n for n in g.node if n.name.startswith("grapec_half_out_")}
    drop = set()
    for vo in g.output:
        cast = casts.get(vo.name)
        if cast is None:
            continue
        vo.type.tensor_type.elem_type = half
        src = cast.input[0]
        if src != vo.name + "__half":   # a float32 node's result: round it to half here
            del cast.attribute[:]
            cast.attribute.extend([helper.make_attribute("to", half)])
            continue
        drop.add(id(cast))
        for n in g.node:
            n.output[:] = [vo.name if o == src else o for o in n.output]
        _rename_uses(g, src, vo.name)
    nodes = [n for n in g.node if id(n) not in drop]
    del g.node[:]
    g.node.extend(nodes)
    return m


def _keep_nodes_fp32(g: onnx.GraphProto, kept: set, types: dict, fp32_consts: dict, half: int) -> set:
    """Rewrite the nodes at positions `kept` to compute in float32; -> their new positions."""
    kept_outputs = {o for i in kept for o in g.node[i].output if o and types.get(o) == TensorProto.FLOAT}
    # IR < 4 lists weights as graph inputs too: those are initializers, half by now
    graph_inputs = {vi.name for vi in g.input} - {t.name for t in g.initializer}
    new_inits, cast_done = {}, set()
    nodes, kept_at = [], set()
    for idx, n in enumerate(g.node):
        if idx not in kept:
            nodes.append(n)
            continue
        for k, x in enumerate(n.input):
            if not x or types.get(x) != TensorProto.FLOAT or x in graph_inputs:
                continue   # graph inputs are float32 already; the interface leaves these reads alone
            if x in fp32_consts and x not in kept_outputs:
                new_inits.setdefault(x, numpy_helper.from_array(np.asarray(fp32_consts[x], np.float32), x + "__fp32"))
            elif x not in kept_outputs and x not in cast_done:
                cast_done.add(x)
                nodes.append(helper.make_node("Cast", [x], [x + "__fp32"], to=TensorProto.FLOAT,
                                              name=f"grapec_to_fp32_{x}"))
            n.input[k] = x + "__fp32"
        outs = [y for y in n.output if y in kept_outputs]
        n.output[:] = [y + "__fp32" if y in kept_outputs else y for y in n.output]
        kept_at.add(len(nodes))
        nodes.append(n)
        for y in outs:
            nodes.append(helper.make_node("Cast", [y + "__fp32"], [y], to=half, name=KEPT_PREFIX + y))
    del g.node[:]
    g.node.extend(nodes)
    g.initializer.extend(new_inits.values())
    return kept_at


def _float_constants(g: onnx.GraphProto) -> dict:
    """Output name -> float32 value of the top-level Constant nodes (before any conversion)."""
    out = {}
    for n in g.node:
        if n.op_type != "Constant" or not n.attribute:
            continue
        a = n.attribute[0]
        if a.name == "value" and a.t.data_type == TensorProto.FLOAT:
            out[n.output[0]] = tensor_array(a.t)
        elif a.name == "value_float":
            out[n.output[0]] = np.array(a.f, np.float32)
        elif a.name == "value_floats":
            out[n.output[0]] = np.array(a.floats, np.float32)
    return out


def _convert_graph(g: onnx.GraphProto, keep: set, half: int, skip=()):
    for i, t in enumerate(g.initializer):
        if t.data_type == TensorProto.FLOAT and t.name not in keep:
            g.initializer[i].CopyFrom(_half(t, half))
    for idx, n in enumerate(g.node):
        if idx in skip:
            continue
        if n.op_type == "Cast":
            for a in n.attribute:
                if a.name == "to" and a.i == TensorProto.FLOAT:
                    a.i = half
        elif n.op_type in ("Constant", "ConstantOfShape"):
            for a in n.attribute:
                if a.name == "value" and a.t.data_type == TensorProto.FLOAT and not (set(n.output) & keep):
                    a.t.CopyFrom(_half(a.t, half))
                elif a.name == "value_float" and not (set(n.output) & keep):
                    a.CopyFrom(helper.make_attribute("value", _half(numpy_helper.from_array(np.array(a.f, np.float32)), half)))
                elif a.name == "value_floats" and not (set(n.output) & keep):
                    a.CopyFrom(helper.make_attribute("value", _half(numpy_helper.from_array(np.array(a.floats, np.float32)), half)))
        elif n.op_type in DTYPE_ATTR_OPS:
            for a in n.attribute:
                if a.name == "dtype" and a.i == TensorProto.FLOAT:
                    a.i = half
        for body in subgraphs(n):
            _convert_body(body, keep, half)


def _convert_body(g: onnx.GraphProto, keep: set, half: int):
    """An If/Loop/Scan body: its float32 inputs/outputs become half like everything else."""
    _convert_graph(g, keep, half)
    for vi in list(g.input) + list(g.output):
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            vi.type.tensor_type.elem_type = half
    del g.value_info[:]


def _half(t: onnx.TensorProto, half: int) -> onnx.TensorProto:
    a = tensor_array(t).astype(np.float32)
    if half == TensorProto.FLOAT16:
        a = np.where(np.isfinite(a), np.clip(a, -FP16_MAX, FP16_MAX), a)   # explicit inf/nan stay
        return numpy_helper.from_array(a.astype(np.float16), t.name)
    return numpy_helper.from_array(a.astype(ml_dtypes.bfloat16), t.name)


def _rename_uses(g: onnx.GraphProto, old: str, new: str, skip=()) -> bool:
    """Reads of `old` become reads of `new`, except in the top-level nodes at positions `skip`;
    -> whether anything read it."""
    found = False
    for idx, top in enumerate(g.node):
        if idx in skip:
            continue
        for n in _with_bodies(top):   # bodies read outer values by name too
            if old in n.input:
                found = True
                n.input[:] = [new if i == old else i for i in n.input]
    return found


def _with_bodies(n: onnx.NodeProto):
    yield n
    for body in subgraphs(n):
        yield from all_nodes(body)
