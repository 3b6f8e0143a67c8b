"""onnxruntime's contrib ops (domain com.microsoft), each rewritten before import into the standard
ONNX ops grapec lowers: the semantics of one op in one small function, next to its name.

These are what onnxruntime's own tools write: the transformer optimizer (`onnxruntime.transformers.
optimizer`: Attention, SkipLayerNormalization, EmbedLayerNormalization, BiasGelu, FastGelu ...) and
the quantizer (`quantize_dynamic` / `quantize_static`: DynamicQuantizeMatMul, QGemm, QLinear* ...).
Rewritten, they go through the same lowering and fusion as any model: attention meets the fused
attention pass, a LayerNorm after an add becomes one kernel. DynamicQuantizeLSTM is rewritten with
the other recurrent ops (recurrent.py), the attention ops in contrib_attention.py. Where onnxruntime quantizes an activation on the fly, so
does the rewrite (DynamicQuantizeLinear), so the integer arithmetic is the same.

Each rewrite gets a NodeBuilder and the node; it returns nothing and writes the node's outputs by
name. A form it does not take raises Unsupported with the reason, and import reports it by node.
An op whose standard form would lose what makes it worth having is lowered directly instead
(`@op("com.microsoft:Name")` in ops/): MatMulNBits and GatherBlockQuantized, whose packed codes a rewrite to
DequantizeLinear + MatMul would have constant folding unpack into float weights.
"""
from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from .contrib_attention import ATTENTION_REWRITES
from .proto import NodeBuilder, Unsupported, copy_model, subgraphs, write_as

DOMAIN = "com.microsoft"
REWRITES: dict = {}
# onnxruntime registers a few of its own ops in the standard domain
ORT_IN_ONNX_DOMAIN = {"SimplifiedLayerNormalization"}


def rewrite(*names: str):
    def register(fn):
        for n in names:
            REWRITES[n] = fn
        return fn
    return register


def is_contrib(n: onnx.NodeProto) -> bool:
    return (n.domain == DOMAIN and n.op_type in REWRITES) or (n.domain in ("", "ai.onnx") and n.op_type in ORT_IN_ONNX_DOMAIN)


def contrib_as_onnx(model: onnx.ModelProto, in_place: bool = False) -> tuple:
    """-> (the model with every contrib op rewritten, or the model itself when it has none; a list
    of problems: nodes of a contrib op or form that has no rewrite). in_place: rewrite the model
    given (a compile's own copy, loaded from a file: a copy of a 2.5 GB decoder would hold its
    weights twice); else the caller's model stays as given."""
    from .onnx_import import opset_of
    from .proto import all_nodes
    if not any(is_contrib(n) or n.domain == DOMAIN for n in all_nodes(model.graph)):
        return model, []
    if not in_place:
        model = copy_model(model)
    problems: list = []
    _rewrite_graph(model.graph, max(opset_of(model), 13), _value_info(model), problems)
    if not any(o.domain in ("", "ai.onnx") for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("", 17))
    return model, problems


def _value_info(model: onnx.ModelProto) -> dict:
    """value name -> (ONNX element type or 0, rank or None), where the model (or onnx's shape
    inference) says. Contrib ops' outputs are not inferred: EmbedLayerNormalization's mask_index is
    1-D by definition."""
    from .onnx_import import without_weight_data
    info = {t.name: (t.data_type, len(t.dims)) for t in model.graph.initializer}
    try:
        # inference serializes the model and returns a copy: without the weights' values (no shape
        # depends on them), a 2.5 GB decoder is not held three times over
        inferred = onnx.shape_inference.infer_shapes(without_weight_data(model)).graph
    except Exception:  # noqa: BLE001 - inference is a hint here; the declared types stay
        inferred = model.graph
    for v in list(inferred.input) + list(inferred.value_info) + list(inferred.output):
        t = v.type.tensor_type
        if t.elem_type:
            info.setdefault(v.name, (t.elem_type, len(t.shape.dim) if t.HasField("shape") else None))
    for n in inferred.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    info[n.output[0]] = (a.t.data_type, len(a.t.dims))
        if n.op_type == "EmbedLayerNormalization" and len(n.output) > 1 and n.output[1]:
            info.setdefault(n.output[1], (TensorProto.INT32, 1))
    return info


def _rewrite_graph(graph: onnx.GraphProto, opset: int, info: dict, problems: list):
    nodes = []
    for i, n in enumerate(graph.node):
        for body in subgraphs(n):
            _rewrite_graph(body, opset, info, problems)
        if not is_contrib(n):
            nodes.append(n)
            continue
        name = n.name or f"{n.op_type}_{i}"
        b = NodeBuilder(f"{name}__ms", opset)
        try:
            REWRITES[n.op_type](b, _Node(n, info))
        except Unsupported as e:
            problems.append(f"node '{name}' ({n.op_type}, domain {n.domain or 'ai.onnx'}): {e}")
            nodes.append(n)
            continue
        nodes += b.out
    del graph.node[:]
    graph.node.extend(nodes)


class _Node:
    """A contrib node's inputs (absent ones ''), outputs and attributes."""

    def __init__(self, n: onnx.NodeProto, info: dict):
        self.proto, self.info = n, info
        self.ins = list(n.input)
        self.outs = list(n.output)
        self.attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}

    def input(self, i: int) -> str:
        return self.ins[i] if i < len(self.ins) else ""

    def output(self, i: int) -> str:
        return self.outs[i] if i < len(self.outs) else ""

    def attr(self, name: str, default=None):
        v = self.attrs.get(name, default)
        return v.decode() if isinstance(v, bytes) else v

    def elem(self, name: str, default: int = TensorProto.UINT8) -> int:
        return self.info.get(name, (0, None))[0] or default

    def mask_rank(self, name: str) -> int | None:
        """The rank of a mask input; Unsupported where nothing says it."""
        if not name:
            return None
        rank = self.info.get(name, (0, None))[1]
        if rank is None:
            raise Unsupported(f"the rank of mask '{name}' is not known (declare its shape in the model)")
        return rank


# --- activations and adds of the transformer optimizer -------------------------------------------

@rewrite("Gelu")
def gelu(b, n):
    """0.5 x (1 + erf(x / sqrt 2))."""
    write_as(b, b.node("Gelu", [n.input(0)]), n.output(0))


@rewrite("BiasGelu")
def bias_gelu(b, n):
    """Gelu(A + B), B a bias over the last axis."""
    write_as(b, b.node("Gelu", [b.node("Add", [n.input(0), n.input(1)])]), n.output(0))


@rewrite("FastGelu")
def fast_gelu(b, n):
    """Gelu's tanh approximation of (X + bias): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    x = b.node("Add", [n.input(0), n.input(1)]) if n.input(1) else n.input(0)
    write_as(b, b.node("Gelu", [x], approximate="tanh"), n.output(0))


@rewrite("QuickGelu")
def quick_gelu(b, n):
    """x * sigmoid(alpha x), alpha 1.702 unless given."""
    x = n.input(0)
    alpha = b.fconst(float(n.attr("alpha", 1.702)))
    write_as(b, b.node("Mul", [x, b.node("Sigmoid", [b.node("Mul", [x, alpha])])]), n.output(0))


@rewrite("BiasAdd")
def bias_add(b, n):
    """X + bias + skip (X and skip [N, S, C], bias [C])."""
    write_as(b, b.node("Add", [b.node("Add", [n.input(0), n.input(1)]), n.input(2)]), n.output(0))


@rewrite("BiasSoftmax")
def bias_softmax(b, n):
    """softmax(data + bias) over `axis` (onnxruntime broadcasts bias as numpy does for the shapes its
    fusion writes)."""
    axis = int(n.attr("axis", 1))
    x = b.node("Add", [n.input(0), n.input(1)])
    write_as(b, b.node("Softmax", [x], axis=axis), n.output(0))


# --- normalizations ---------------------------------------------------------------------------------

def _skip_sum(b, n, bias_at: int) -> str:
    """input + skip (+ bias, the optional input at `bias_at`)."""
    s = b.node("Add", [n.input(0), n.input(1)])
    return b.node("Add", [s, n.input(bias_at)]) if n.input(bias_at) else s


@rewrite("SkipLayerNormalization")
def skip_layer_norm(b, n):
    """LayerNorm(input + skip + bias) * gamma + beta over the last axis; outputs: the result, mean,
    inverse std (both optional) and the sum it normalized (optional)."""
    s = _skip_sum(b, n, 4)
    ins = [s, n.input(2)] + ([n.input(3)] if n.input(3) else [])
    b.multi("LayerNormalization", ins, [n.output(0), n.output(1), n.output(2)], axis=-1,
            epsilon=float(n.attr("epsilon", 1e-12)))
    write_as(b, s, n.output(3))


@rewrite("SkipSimplifiedLayerNormalization")
def skip_rms_norm(b, n):
    """RMSNorm(input + skip + bias) * gamma over the last axis (T5, Llama); outputs: the result,
    mean and inverse std (not taken) and the sum it normalized (optional)."""
    if n.output(1) or n.output(2):
        raise Unsupported("the mean and inv_std_var outputs are not supported")
    s = _skip_sum(b, n, 3)
    b.node("RMSNormalization", [s, n.input(2)], out=n.output(0), axis=-1, epsilon=float(n.attr("epsilon", 1e-12)))
    write_as(b, s, n.output(3))


@rewrite("SimplifiedLayerNormalization")
def rms_norm(b, n):
    """x / sqrt(mean(x^2 over [axis, rank)) + epsilon) * scale."""
    if n.output(1):
        raise Unsupported("the inv_std_var output is not supported")
    b.node("RMSNormalization", [n.input(0), n.input(1)], out=n.output(0), axis=int(n.attr("axis", -1)),
           epsilon=float(n.attr("epsilon", 1e-5)))


@rewrite("EmbedLayerNormalization")
def embed_layer_norm(b, n):
    """BERT's embeddings: LayerNorm(word[ids] + position[position_ids, or 0..S-1] + segment[segment_ids]).
    Outputs: the result, mask_index (int32 [B]: the number of ones in each mask row) and the sum it
    normalized (optional)."""
    ids, seg_ids, word, pos, seg, gamma, beta, mask, pos_ids = (n.input(i) for i in range(9))
    e = b.node("Gather", [word, ids], axis=0)
    if pos_ids:
        p = b.node("Gather", [pos, pos_ids], axis=0)
    else:
        positions = b.node("Range", [b.const(0), b.dim(ids, 1), b.const(1)])
        p = b.unsqueeze(b.node("Gather", [pos, positions], axis=0), 0)
    e = b.node("Add", [e, p])
    if seg_ids and seg:
        e = b.node("Add", [e, b.node("Gather", [seg, seg_ids], axis=0)])
    b.node("LayerNormalization", [e, gamma, beta], out=n.output(0), axis=-1, epsilon=float(n.attr("epsilon", 1e-12)))
    if n.output(1):
        if mask:
            count = b.reduce_sum(b.node("Cast", [mask], to=TensorProto.INT32), [1], keepdims=0)
        else:
            count = _zeros_per_batch(b, ids)
        write_as(b, count, n.output(1))
    write_as(b, e, n.output(2))


def _zeros_per_batch(b, ids: str) -> str:
    shape = b.node("Gather", [b.node("Shape", [ids]), b.const([0])], axis=0)
    return b.node("ConstantOfShape", [shape], value=helper.make_tensor("z", TensorProto.INT32, [1], [0]))


@rewrite("RotaryEmbedding")
def rotary_embedding(b, n):
    """onnxruntime's rotary embedding: ONNX's RotaryEmbedding (opset 23; ops/nn.py) with the inputs in
    another order, (input, position_ids, cos_cache, sin_cache). A position_ids of one element is an
    offset: every row's positions are offset + 0..S-1."""
    x, pos, cos, sin = (n.input(i) for i in range(4))
    if n.attr("is_packed_batching", 0):
        raise Unsupported("packed batching (is_packed_batching=1) is not supported")
    x_rank, pos_rank = n.info.get(x, (0, None))[1], n.info.get(pos, (0, None))[1]
    if pos_rank is None or (pos_rank == 1 and x_rank is None):
        raise Unsupported(f"the ranks of '{x}' and '{pos}' are not known (declare their shapes in the model)")
    if pos_rank == 1:
        seq = b.dim(x, 2 if x_rank == 4 else 1)
        offset = b.node("Squeeze", [b.node("Cast", [pos], to=TensorProto.INT64), b.const([0])])
        rows = b.node("Add", [b.node("Range", [b.const(0), seq, b.const(1)]), offset])
        shape = b.node("Concat", [b.unsqueeze(b.dim(x, 0), 0), b.unsqueeze(seq, 0)], axis=0)
        pos = b.node("Expand", [b.unsqueeze(rows, 0), shape])
    attrs = {k: int(n.attr(k)) for k in ("interleaved", "num_heads", "rotary_embedding_dim") if n.attr(k) is not None}
    b.node("RotaryEmbedding", [x, cos, sin, pos], out=n.output(0), **attrs)


# --- the quantizer's ops --------------------------------------------------------------------------

def _zero_point(b, n, zp: str, like: str) -> str:
    """A zero point as given, or 0 of `like`'s integer type."""
    if zp:
        return zp
    dt = helper.tensor_dtype_to_np_dtype(n.elem(like))
    return b.const(0, dt)


def _dequant(b, n, x: str, scale: str, zp: str, axis: int | None = None) -> str:
    attrs = {} if axis is None else {"axis": axis}
    return b.node("DequantizeLinear", [x, scale, _zero_point(b, n, zp, x)], **attrs)


def _quant(b, n, x: str, scale: str, zp: str, like: str, out: str = "") -> str:
    """x quantized with scale and zp (zp absent: 0 of `like`'s type, the input's)."""
    return b.node("QuantizeLinear", [x, scale, _zero_point(b, n, zp, like)], out=out or None)


def _int_matmul_to_float(b, a, b_mat, a_zp, b_zp, scale, bias) -> str:
    """(A - a_zp)(B - b_zp) in int32, then * scale (+ bias), as onnxruntime computes it."""
    acc = b.node("MatMulInteger", [a, b_mat] + ([a_zp, b_zp] if b_zp else [a_zp] if a_zp else []))
    y = b.node("Mul", [b.node("Cast", [acc], to=TensorProto.FLOAT), scale])
    return b.node("Add", [y, bias]) if bias else y


@rewrite("DynamicQuantizeMatMul")
def dynamic_quantize_matmul(b, n):
    """A quantized to uint8 on the fly (DynamicQuantizeLinear), then (A_q - a_zp)(B - b_zp) in int32,
    scaled by a_scale * b_scale, plus bias."""
    a, bm, b_scale, b_zp, bias = (n.input(i) for i in range(5))
    aq, a_scale, a_zp = b.multi("DynamicQuantizeLinear", [a], ["", "", ""])
    write_as(b, _int_matmul_to_float(b, aq, bm, a_zp, b_zp, b.node("Mul", [a_scale, b_scale]), bias), n.output(0))


@rewrite("MatMulIntegerToFloat")
def matmul_integer_to_float(b, n):
    """(A - a_zp)(B - b_zp) in int32, scaled by a_scale * b_scale, plus bias."""
    a, bm, a_scale, b_scale, a_zp, b_zp, bias = (n.input(i) for i in range(7))
    if b_zp and not a_zp:
        a_zp = _zero_point(b, n, "", a)
    write_as(b, _int_matmul_to_float(b, a, bm, a_zp, b_zp, b.node("Mul", [a_scale, b_scale]), bias), n.output(0))


@rewrite("QGemm")
def qgemm(b, n):
    """alpha * A' B' + C over dequantized A and B (C int32 at scale a_scale * b_scale), quantized
    with y_scale / y_zero_point where given, else float."""
    a, a_scale, a_zp, bm, b_scale, b_zp, c, y_scale, y_zp = (n.input(i) for i in range(9))
    trans_b = int(n.attr("transB", 0))
    af = _dequant(b, n, a, a_scale, a_zp)
    bf = _dequant(b, n, bm, b_scale, b_zp, axis=0 if trans_b else 1)   # a per-column scale runs along N
    ins = [af, bf]
    if c:
        ins.append(b.node("Mul", [b.node("Cast", [c], to=TensorProto.FLOAT), b.node("Mul", [a_scale, b_scale])]))
    y = b.node("Gemm", ins, alpha=float(n.attr("alpha", 1.0)), transA=int(n.attr("transA", 0)), transB=trans_b)
    if y_scale:
        _quant(b, n, y, y_scale, y_zp, a, out=n.output(0))
    else:
        write_as(b, y, n.output(0))


def _qlinear_binary(op: str):
    def fn(b, n):
        a, a_scale, a_zp, bm, b_scale, b_zp, c_scale, c_zp = (n.input(i) for i in range(8))
        y = b.node(op, [_dequant(b, n, a, a_scale, a_zp), _dequant(b, n, bm, b_scale, b_zp)])
        _quant(b, n, y, c_scale, c_zp, a, out=n.output(0))
    fn.__doc__ = f"Dequantize A and B, {op}, quantize with C's scale and zero point."
    return fn


rewrite("QLinearAdd")(_qlinear_binary("Add"))
rewrite("QLinearMul")(_qlinear_binary("Mul"))


def _qlinear_unary(make):
    def fn(b, n):
        x, x_scale, x_zp, y_scale, y_zp = (n.input(i) for i in range(5))
        y = make(b, n, _dequant(b, n, x, x_scale, x_zp))
        _quant(b, n, y, y_scale, y_zp, x, out=n.output(0))
    return fn


rewrite("QLinearSigmoid")(_qlinear_unary(lambda b, n, x: b.node("Sigmoid", [x])))
rewrite("QLinearLeakyRelu")(_qlinear_unary(lambda b, n, x: b.node("LeakyRelu", [x], alpha=float(n.attr("alpha", 0.01)))))


@rewrite("QLinearConcat")
def qlinear_concat(b, n):
    """Y_scale, Y_zp, then (X, scale, zp) per input: dequantize each, Concat, quantize."""
    y_scale, y_zp = n.input(0), n.input(1)
    parts = [_dequant(b, n, n.input(i), n.input(i + 1), n.input(i + 2)) for i in range(2, len(n.ins), 3)]
    y = b.node("Concat", parts, axis=int(n.attr("axis")))
    _quant(b, n, y, y_scale, y_zp, n.input(2), out=n.output(0))


def _nchw(b, x: str, channels_last: bool) -> str:
    return b.node("Transpose", [x], perm=[0, 3, 1, 2]) if channels_last else x


def _back(b, y: str, channels_last: bool) -> str:
    return b.node("Transpose", [y], perm=[0, 2, 3, 1]) if channels_last else y


@rewrite("QLinearGlobalAveragePool")
def qlinear_global_average_pool(b, n):
    """Dequantize, GlobalAveragePool (NHWC where channels_last), quantize."""
    last = bool(n.attr("channels_last", 0))
    x, x_scale, x_zp, y_scale, y_zp = (n.input(i) for i in range(5))
    y = _back(b, b.node("GlobalAveragePool", [_nchw(b, _dequant(b, n, x, x_scale, x_zp), last)]), last)
    _quant(b, n, y, y_scale, y_zp, x, out=n.output(0))


@rewrite("QLinearAveragePool")
def qlinear_average_pool(b, n):
    """Dequantize, AveragePool with the node's pooling attributes (NHWC where channels_last), quantize."""
    last = bool(n.attr("channels_last", 0))
    x, x_scale, x_zp, y_scale, y_zp = (n.input(i) for i in range(5))
    attrs = {k: v for k, v in n.attrs.items() if k != "channels_last"}
    attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in attrs.items()}
    y = _back(b, b.node("AveragePool", [_nchw(b, _dequant(b, n, x, x_scale, x_zp), last)], **attrs), last)
    _quant(b, n, y, y_scale, y_zp, x, out=n.output(0))


REWRITES.update(ATTENTION_REWRITES)   # contrib_attention.py: Attention, MultiHeadAttention, GroupQueryAttention
