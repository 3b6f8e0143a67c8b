"""onnxruntime's attention ops (domain com.microsoft), rewritten into standard ONNX ops as exporters
write attention (MatMul, scale, mask, Softmax, MatMul, heads split and merged by Reshape/Transpose),
so the fused attention pass (passes/attention.py) can take them: Attention and MultiHeadAttention
(the transformer optimizer's), GroupQueryAttention (onnxruntime-genai's decoders). contrib.py
registers them with the other contrib rewrites.
"""
from __future__ import annotations

from onnx import TensorProto, helper

from .proto import Unsupported, write_as


def _additive(b, keep: str, filter_value: float) -> str:
    """A 0/1 keep mask (any type) as an additive float mask: 0 where kept, filter_value elsewhere."""
    k = b.node("Cast", [keep], to=TensorProto.FLOAT)
    return b.node("Mul", [b.node("Sub", [b.fconst(1.0), k]), b.fconst(filter_value)])


def _key_mask(b, mask: str, rank: int | None, total: str, filter_value: float) -> str:
    """onnxruntime's mask_index / key_padding_mask forms -> an additive mask broadcastable to
    [B, N, S, T]: 1-D [B] (keys past each row's length masked), 2-D [B, T] (1 keep, 0 mask) and
    3-D [B, S, T]."""
    if rank == 1:
        keys = b.node("Range", [b.const(0), total, b.const(1)])                         # [T]
        lens = b.unsqueeze(b.node("Cast", [mask], to=TensorProto.INT64), 1)              # [B, 1]
        keep = b.node("Less", [b.unsqueeze(keys, 0), lens])                              # [B, T]
        return b.unsqueeze(b.unsqueeze(_additive(b, keep, filter_value), 1), 1)
    if rank == 2:
        return b.unsqueeze(b.unsqueeze(_additive(b, mask, filter_value), 1), 1)
    if rank == 3:
        return b.unsqueeze(_additive(b, mask, filter_value), 1)
    raise Unsupported(f"a mask of rank {rank} is not supported (1-D lengths, 2-D [B, T] and 3-D [B, S, T] are)")


def _causal(b, q_len: str, total: str, filter_value: float) -> str:
    """[S, T]: query i (at absolute position T - S + i) sees keys 0..T-S+i."""
    qi = b.unsqueeze(b.node("Add", [b.node("Range", [b.const(0), q_len, b.const(1)]),
                                    b.node("Sub", [total, q_len])]), 1)
    kj = b.unsqueeze(b.node("Range", [b.const(0), total, b.const(1)]), 0)
    return _additive(b, b.node("LessOrEqual", [kj, qi]), filter_value)


def _split_heads(b, x: str, heads: int) -> str:
    """[B, S, heads*H] -> [B, heads, S, H]."""
    return b.node("Transpose", [b.node("Reshape", [x, b.const([0, 0, heads, -1])])], perm=[0, 2, 1, 3])


def _merge_heads(b, x: str) -> str:
    """[B, N, S, H] -> [B, S, N*H]."""
    return b.node("Reshape", [b.node("Transpose", [x], perm=[0, 2, 1, 3]), b.const([0, 0, -1])])


def _heads_attention(b, n, q, k, v, heads, mask, mask_rank, bias, past_k, past_v, causal):
    """softmax(Q K^T * scale + masks) V over `heads` heads of 3-D Q, K, V ([B, S, N*H]); past_k and
    past_v [B, N, P, H] are prepended. -> (output [B, S, N*H'], present key, present value).

    Written as exporters write attention (MatMul, scale, mask add, Softmax, MatMul, heads split and
    merged by Reshape/Transpose), so the fused attention pass (passes/attention.py) takes it."""
    filter_value = float(n.attr("mask_filter_value", -10000.0))
    qh, kh, vh = (_split_heads(b, x, heads) for x in (q, k, v))
    if past_k:
        kh = b.node("Concat", [past_k, kh], axis=2)
        vh = b.node("Concat", [past_v, vh], axis=2)
    total = b.dim(kh, 2)
    scale = n.attr("scale")
    if not scale:
        scale = b.node("Div", [b.fconst(1.0), b.node("Sqrt", [b.node("Cast", [b.dim(qh, 3)], to=TensorProto.FLOAT)])])
    else:
        scale = b.fconst(float(scale))
    scores = b.node("Mul", [b.node("MatMul", [qh, b.node("Transpose", [kh], perm=[0, 1, 3, 2])]), scale])
    if mask:
        scores = b.node("Add", [scores, _key_mask(b, mask, mask_rank, total, filter_value)])
    if causal:
        scores = b.node("Add", [scores, _causal(b, b.dim(q, 1), total, filter_value)])
    if bias:
        scores = b.node("Add", [scores, bias])
    out = b.node("MatMul", [b.node("Softmax", [scores], axis=-1), vh])
    return _merge_heads(b, out), kh, vh


def attention(b, n):
    """BERT/GPT-2 self-attention from one input: [Q K V] = input @ weights + bias (split by
    qkv_hidden_sizes, else in three equal parts), then multi-head attention with the mask_index
    (1-D lengths, 2-D or 3-D 0/1 masks; masked scores get mask_filter_value, -10000), a causal mask
    where `unidirectional`, an additive attention_bias, and `past` [2, B, N, P, H] prepended to K
    and V (`present` = both, stacked)."""
    x, w, bias, mask, past, attn_bias = (n.input(i) for i in range(6))
    if n.input(6) or n.attr("do_rotary", 0) or n.input(7):
        raise Unsupported("past_sequence_length, rotary embeddings and cache indirection are not supported")
    heads = int(n.attr("num_heads"))
    qkv = b.node("MatMul", [x, w])
    if bias:
        qkv = b.node("Add", [qkv, bias])
    sizes = list(n.attr("qkv_hidden_sizes", []) or [])
    if sizes:
        q, k, v = (b.span(qkv, sum(sizes[:i]), sum(sizes[:i + 1]), axis=2) for i in range(3))
    else:
        third = b.node("Div", [b.dim(w, 1), b.const(3)])
        bounds = [b.const([0]), b.unsqueeze(third, 0), b.unsqueeze(b.node("Mul", [third, b.const(2)]), 0),
                  b.unsqueeze(b.dim(w, 1), 0)]
        q, k, v = (b.node("Slice", [qkv, bounds[i], bounds[i + 1], b.const([2])]) for i in range(3))
    past_k = b.pick(past, 0) if past else ""
    past_v = b.pick(past, 1) if past else ""
    out, pk, pv = _heads_attention(b, n, q, k, v, heads, mask, n.mask_rank(mask), attn_bias, past_k, past_v,
                                   bool(n.attr("unidirectional", 0)))
    write_as(b, out, n.output(0))
    if n.output(1):
        b.node("Concat", [b.unsqueeze(pk, 0), b.unsqueeze(pv, 0)], out=n.output(1), axis=0)


def multi_head_attention(b, n):
    """Cross- or self-attention of 3-D query, key, value ([B, S, D], [B, T, D], [B, T, Dv]) with an
    optional bias [D + D + Dv] added to each, key_padding_mask (1-D lengths or 2-D 0/1), an additive
    attention_bias, and past_key / past_value [B, N, P, H] prepended (present_key, present_value)."""
    q, k, v, bias, key_mask, attn_bias, past_k, past_v = (n.input(i) for i in range(8))
    if not k or not v or n.input(8) or n.input(9):
        raise Unsupported("packed QKV / KV inputs, past_sequence_length and cache_indirection are not supported")
    heads = int(n.attr("num_heads"))
    if bias:
        d = b.dim(q, 2)
        dk = b.dim(k, 2)
        ends = [b.unsqueeze(d, 0), b.unsqueeze(b.node("Add", [d, dk]), 0)]
        q = b.node("Add", [q, b.node("Slice", [bias, b.const([0]), ends[0], b.const([0])])])
        k = b.node("Add", [k, b.node("Slice", [bias, ends[0], ends[1], b.const([0])])])
        v = b.node("Add", [v, b.node("Slice", [bias, ends[1], b.const([2 ** 62]), b.const([0])])])
    out, pk, pv = _heads_attention(b, n, q, k, v, heads, key_mask, n.mask_rank(key_mask), attn_bias, past_k, past_v,
                                   bool(n.attr("unidirectional", 0)))
    write_as(b, out, n.output(0))
    write_as(b, pk, n.output(1))
    write_as(b, pv, n.output(2))


def group_query_attention(b, n):
    """onnxruntime-genai's decoder attention. Query [B, S, N*H] and key/value [B, S, Nkv*H] (or one
    packed [B, S, (N + 2 Nkv) * H] query), each key/value head serving N / Nkv query heads. Row b holds
    seqlens_k[b] + 1 tokens in all, so its new tokens sit at positions p = seqlens_k[b] + 1 - S + i
    (at p = i in the first prompt, total_sequence_length == S, whose rows are right-padded):
    rotated there (do_rotary: cos/sin caches [positions, rotary_dim / 2]), written into the present
    cache [B, Nkv, max(P, total_sequence_length), H] after the row's past (past_key [B, Nkv, P, H];
    what follows is zeros), and each attends the present's keys 0..p (local_window_size w: p - w < key
    too). The present's length depends on total_sequence_length's value, which onnxruntime-genai's
    builder derives from the attention mask's shape (so it is known at compile time)."""
    q, k, v, past_k, past_v, seqlens, total, cos, sin = (n.input(i) for i in range(9))
    if any(n.input(i) for i in range(9, 14)):
        raise Unsupported("position_ids, attention_bias and head_sink inputs are not supported")
    if float(n.attr("softcap", 0.0) or 0.0) or int(n.attr("smooth_softmax", 0) or 0):
        raise Unsupported("softcap and smooth_softmax are not supported")
    if bool(past_k) != bool(past_v):
        raise Unsupported("past_key and past_value come together")
    heads, kv_heads = int(n.attr("num_heads")), int(n.attr("kv_num_heads"))
    elem = n.elem(q, 0)   # the query's float type, where shape inference knows it
    if heads % kv_heads:
        raise Unsupported(f"num_heads {heads} is not a multiple of kv_num_heads {kv_heads}")
    rotary = int(n.attr("do_rotary", 0) or 0)
    inter = int(n.attr("rotary_interleaved", 0) or 0)
    packed = not k
    if packed:   # [Q K V] along the last axis
        width = b.node("Div", [b.dim(q, 2), b.const(heads + 2 * kv_heads)])
        cut = [b.unsqueeze(b.node("Mul", [width, b.const(c)]), 0) for c in (0, heads, heads + kv_heads, heads + 2 * kv_heads)]
        qk = b.node("Slice", [q, cut[0], cut[2], b.const([2])])
        v = b.node("Slice", [q, cut[2], cut[3], b.const([2])])
    seq = b.dim(q, 1)
    last = b.node("Cast", [seqlens], to=TensorProto.INT64)                                       # [B]
    # the first prompt (total_sequence_length == S) starts every row at 0, right-padded; a later
    # call continues each row after its past
    prompt = b.node("Equal", [b.node("Cast", [total], to=TensorProto.INT64), seq])
    first = b.node("Where", [prompt, b.const(0), b.node("Sub", [b.node("Add", [last, b.const(1)]), seq])])
    positions = b.node("Add", [b.unsqueeze(first, 1), b.unsqueeze(b.node("Range", [b.const(0), seq, b.const(1)]), 0)])
    if packed:   # the query's and the key's heads rotate alike: one rotation of both, then cut
        if rotary:
            qk = b.node("RotaryEmbedding", [qk, cos, sin, positions], num_heads=heads + kv_heads, interleaved=inter)
        q, k = (b.node("Slice", [qk, cut[i], cut[i + 1], b.const([2])]) for i in range(2))
    elif rotary:
        q = b.node("RotaryEmbedding", [q, cos, sin, positions], num_heads=heads, interleaved=inter)
        k = b.node("RotaryEmbedding", [k, cos, sin, positions], num_heads=kv_heads, interleaved=inter)
    qh, kh, vh = _split_heads(b, q, heads), _split_heads(b, k, kv_heads), _split_heads(b, v, kv_heads)
    if past_k:
        kh, vh = (_gqa_present(b, past, new, first, total, _float_const(b, elem, new))
                  for past, new in ((past_k, kh), (past_v, vh)))
    write_as(b, kh, n.output(1))
    write_as(b, vh, n.output(2))
    group = heads // kv_heads
    like = _float_const(b, elem, qh)
    scale = n.attr("scale")
    scale = like(float(scale)) if scale else b.node("CastLike", [b.node(
        "Div", [b.fconst(1.0), b.node("Sqrt", [b.node("Cast", [b.dim(qh, 3)], to=TensorProto.FLOAT)])]), qh])
    # the `group` query heads of one key/value head side by side, [B, Nkv, group*S, H]: both products are
    # then plain batched GEMMs over the Nkv heads, with no copy of the keys and values per query head
    head_dim = b.unsqueeze(b.dim(qh, 3), 0)
    grouped = b.node("Reshape", [qh, b.node("Concat", [b.const([0, kv_heads, -1]), head_dim], axis=0)])
    scores = b.node("Mul", [b.node("MatMul", [grouped, b.node("Transpose", [kh], perm=[0, 1, 3, 2])]), scale])
    total_keys = b.dim(kh, 2)
    # the mask over the same grouped rows (row r is query position r mod S), so the scores go from
    # the product through the mask into the softmax with no reshape between: the fused attention
    # pass then takes the three as one kernel
    rows = b.node("Mod", [b.node("Range", [b.const(0), b.node("Mul", [seq, b.const(group)]), b.const(1)]), seq])
    keys = b.unsqueeze(b.unsqueeze(b.node("Range", [b.const(0), total_keys, b.const(1)]), 0), 0)   # [1, 1, T]
    at = b.unsqueeze(b.node("Gather", [positions, rows], axis=1), 2)                                # [B, g*S, 1]
    keep = b.node("And", [b.node("LessOrEqual", [keys, at]),                        # causal, and no key past
                          b.node("LessOrEqual", [keys, b.unsqueeze(b.unsqueeze(last, 1), 2)])])   # the row's last
    window = int(n.attr("local_window_size", -1))
    if window > 0:
        keep = b.node("And", [keep, b.node("Greater", [keys, b.node("Sub", [at, b.const(window)])])])
    lowest = like(-65504.0)   # finite: a row with no key left stays a number
    keep = b.unsqueeze(keep, 1)                                                                      # [B, 1, g*S, T]
    probs = b.node("Softmax", [b.node("Where", [keep, scores, lowest])], axis=-1)
    out = b.node("MatMul", [probs, vh])                                                              # [B, Nkv, g*S, H]
    out = b.node("Reshape", [out, b.node("Concat", [b.const([0, heads]), b.unsqueeze(seq, 0), head_dim], axis=0)])
    write_as(b, _merge_heads(b, out), n.output(0))


def _float_const(b, elem: int, ref: str):
    """value -> a scalar constant of the float type `elem` (the node's, where shape inference gave
    it: folded at compile time), else cast like `ref` at run time."""
    if elem in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE):
        dtype = helper.tensor_dtype_to_np_dtype(elem)
        return lambda value: b.const(value, dtype)
    return lambda value: b.node("CastLike", [b.fconst(value), ref])


def _gqa_present(b, past: str, new: str, first: str, total: str, like) -> str:
    """[B, Nkv, max(P, total), H], as onnxruntime sizes the present: row b's past up to first[b], its S
    new tokens from there, zeros after. A past buffer longer than the total (onnxruntime-genai's
    shared past/present buffer, max_length long) keeps its length; otherwise it grows by S."""
    seq = b.dim(new, 2)
    length = b.node("Max", [b.dim(past, 2), b.node("Cast", [total], to=TensorProto.INT64)])
    t = b.node("Range", [b.const(0), length, b.const(1)])                                              # [T]
    rel = b.node("Sub", [b.unsqueeze(t, 0), b.unsqueeze(first, 1)])                                   # [B, T]
    in_past = b.node("Less", [rel, b.const(0)])
    in_new = b.node("And", [b.node("Not", [in_past]), b.node("Less", [rel, seq])])
    index = b.node("Clip", [rel, b.const(0), b.node("Sub", [seq, b.const(1)])])
    shape = b.node("Concat", [b.span(b.node("Shape", [new]), 0, 2), b.unsqueeze(length, 0),
                              b.span(b.node("Shape", [new]), 3, 4)], axis=0)
    index = b.node("Expand", [b.unsqueeze(b.unsqueeze(index, 1), 3), shape])                           # [B, Nkv, T, H]
    taken = b.node("GatherElements", [new, index], axis=2)
    zero = like(0.0)
    # the past then S rows of zeros (a Concat, not a Pad: the first prompt's past may be empty), cut to T
    padded = b.node("Concat", [past, b.node("Expand", [zero, b.node("Shape", [new])])], axis=2)
    padded = b.node("Slice", [padded, b.const([0]), b.unsqueeze(length, 0), b.const([2])])
    mask = lambda m: b.unsqueeze(b.unsqueeze(m, 1), 3)  # noqa: E731   [B, T] -> [B, 1, T, 1]
    return b.node("Where", [mask(in_past), padded, b.node("Where", [mask(in_new), taken, zero])])


ATTENTION_REWRITES = {"Attention": attention, "MultiHeadAttention": multi_head_attention,
                      "GroupQueryAttention": group_query_attention}
