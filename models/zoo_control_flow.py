"""control_flow: greedy decoding of a tiny RNN with Loop (data-dependent trip count) and If,
built with onnx.helper, with a numpy reference. numpy + onnx only."""
from __future__ import annotations


import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from zoo_core import OPSET, SEED, ZooModel, spec
from zoo_export import finish_and_save

# --------------------------------------------------------------------------------------------
# control_flow: greedy decoding with Loop (data-dependent trip count) + If, built with onnx.helper
# --------------------------------------------------------------------------------------------

def _cf_weights(cfg: dict, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    V, H = cfg["vocab"], cfg["hidden"]
    s = 1.0 / np.sqrt(H)
    w = {
        "embedding": rng.standard_normal((V, H)) * 1.0,  # [V, H]
        "w_in": rng.standard_normal((H, H)) * s,  # x @ w_in
        "w_rec": rng.standard_normal((H, H)) * s * 1.5,  # h @ w_rec
        "b_h": rng.standard_normal((H,)) * 0.1,
        "w_first": rng.standard_normal((H, H)) * s,  # first-step branch: extra projection of x
        "w_out": rng.standard_normal((H, V)) * (8.0 * s),  # logits = h @ w_out + b_out
        "b_out": rng.standard_normal((V,)) * 0.1,
    }
    w["b_out"][cfg["eos"]] += cfg["eos_bias"]
    return {k: v.astype(np.float32) for k, v in w.items()}


def _cf_reference(w: dict, cfg: dict):
    """Numpy reference of the control_flow graph: (start_token [1], h0 [H]) -> (tokens, count, h_final)."""
    M, eos = cfg["max_len"], cfg["eos"]

    def run(feeds):
        tok = np.asarray(feeds["start_token"], dtype=np.int64).reshape(1)
        h = np.asarray(feeds["h0"], dtype=np.float32)
        buf = np.full((M,), -1, dtype=np.int64)
        n = np.int64(0)
        cond = bool(tok[0] != eos)
        i = 0
        while i < M and cond:
            x = w["embedding"][tok[0]]  # [H]
            pre = x @ w["w_in"] + h @ w["w_rec"] + w["b_h"]
            if i == 0:  # then-branch: first step also projects the start token directly
                h = np.tanh(pre + np.tanh(x @ w["w_first"]))
            else:  # else-branch: leaky (residual) update
                h = np.float32(0.5) * h + np.float32(0.5) * np.tanh(pre)
            h = h.astype(np.float32)
            logits = h @ w["w_out"] + w["b_out"]
            tok = np.array([int(np.argmax(logits))], dtype=np.int64)
            buf[i] = tok[0]
            n = np.int64(n + 1)
            cond = bool(tok[0] != eos)
            i += 1
        return [buf, np.array(n, dtype=np.int64), h]

    return run


def _cf_graph(w: dict, cfg: dict) -> onnx.ModelProto:
    """Build the ONNX model.

    inputs : start_token int64 [1], h0 float32 [H]
    outputs: tokens int64 [M] (generated ids, -1 after the end), count int64 [] (tokens generated,
             including the EOS if one was emitted), h_final float32 [H]
    Loop (max trip count M, cond = token != EOS) carries: token [1], h [H], tokens [M], count [].
    Body: Gather embedding; If(iter == 0) picks between two different hidden-state updates
    (each branch reads outer-scope values); MatMul+Add -> logits; ArgMax; the token is written into
    the buffer with a one-hot Where mask at the iteration index.
    """
    V, H, M, eos = cfg["vocab"], cfg["hidden"], cfg["max_len"], cfg["eos"]
    mk = helper.make_node
    f32, i64, b = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL

    def const(name, arr):
        return numpy_helper.from_array(np.asarray(arr), name)

    # ---- If branches (no inputs; they capture body / outer-scope values) ----
    then_graph = helper.make_graph(
        [
            mk("MatMul", ["x", "w_first"], ["t_proj"]),
            mk("Tanh", ["t_proj"], ["t_tanh"]),
            mk("Add", ["pre", "t_tanh"], ["t_sum"]),
            mk("Tanh", ["t_sum"], ["h_then"]),
        ],
        "first_step", [], [helper.make_tensor_value_info("h_then", f32, [H])],
    )
    else_graph = helper.make_graph(
        [
            mk("Tanh", ["pre"], ["e_tanh"]),
            mk("Mul", ["h_in", "half"], ["e_keep"]),
            mk("Mul", ["e_tanh", "half"], ["e_new"]),
            mk("Add", ["e_keep", "e_new"], ["h_else"]),
        ],
        "later_step", [], [helper.make_tensor_value_info("h_else", f32, [H])],
    )

    # ---- Loop body ----
    body_nodes = [
        mk("Gather", ["embedding", "tok_in"], ["x2d"], axis=0),  # [1, H]
        mk("Squeeze", ["x2d", "axes0"], ["x"]),  # [H]
        mk("MatMul", ["x", "w_in"], ["xw"]),
        mk("MatMul", ["h_in", "w_rec"], ["hw"]),
        mk("Add", ["xw", "hw"], ["xh"]),
        mk("Add", ["xh", "b_h"], ["pre"]),
        mk("Equal", ["iter", "zero_i64"], ["is_first"]),
        mk("If", ["is_first"], ["h_out"], then_branch=then_graph, else_branch=else_graph),
        mk("MatMul", ["h_out", "w_out"], ["logits_nb"]),
        mk("Add", ["logits_nb", "b_out"], ["logits"]),  # [V]
        mk("ArgMax", ["logits"], ["tok_out"], axis=0, keepdims=1),  # [1] int64
        # write the token at position `iter` of the buffer: one-hot mask + Where
        mk("Equal", ["positions", "iter"], ["at_iter"]),  # [M] bool
        mk("Expand", ["tok_out", "m_shape"], ["tok_bcast"]),  # [M]
        mk("Where", ["at_iter", "tok_bcast", "buf_in"], ["buf_out"]),
        mk("Add", ["count_in", "one_i64"], ["count_out"]),
        mk("Equal", ["tok_out", "eos"], ["is_eos1"]),
        mk("Not", ["is_eos1"], ["go1"]),
        mk("Squeeze", ["go1", "axes0"], ["cond_out"]),  # scalar bool
    ]
    body = helper.make_graph(
        body_nodes,
        "decode_step",
        [
            helper.make_tensor_value_info("iter", i64, []),
            helper.make_tensor_value_info("cond_in", b, []),
            helper.make_tensor_value_info("tok_in", i64, [1]),
            helper.make_tensor_value_info("h_in", f32, [H]),
            helper.make_tensor_value_info("buf_in", i64, [M]),
            helper.make_tensor_value_info("count_in", i64, []),
        ],
        [
            helper.make_tensor_value_info("cond_out", b, []),
            helper.make_tensor_value_info("tok_out", i64, [1]),
            helper.make_tensor_value_info("h_out", f32, [H]),
            helper.make_tensor_value_info("buf_out", i64, [M]),
            helper.make_tensor_value_info("count_out", i64, []),
        ],
    )

    # ---- main graph ----
    nodes = [
        mk("Equal", ["start_token", "eos"], ["start_is_eos"]),
        mk("Not", ["start_is_eos"], ["start_go"]),
        mk("Squeeze", ["start_go", "axes0"], ["cond0"]),
        mk("Loop", ["max_len", "cond0", "start_token", "h0", "buf_init", "count_init"],
           ["tok_final", "h_final", "tokens", "count"], body=body),
    ]
    inits = [const(k, v) for k, v in sorted(w.items())] + [
        const("max_len", np.array(M, dtype=np.int64)),
        const("eos", np.array([eos], dtype=np.int64)),
        const("axes0", np.array([0], dtype=np.int64)),
        const("zero_i64", np.array(0, dtype=np.int64)),
        const("one_i64", np.array(1, dtype=np.int64)),
        const("half", np.array(0.5, dtype=np.float32)),
        const("positions", np.arange(M, dtype=np.int64)),
        const("m_shape", np.array([M], dtype=np.int64)),
        const("buf_init", np.full((M,), -1, dtype=np.int64)),
        const("count_init", np.array(0, dtype=np.int64)),
    ]
    graph = helper.make_graph(
        nodes, "greedy_decode",
        [helper.make_tensor_value_info("start_token", i64, [1]), helper.make_tensor_value_info("h0", f32, [H])],
        [
            helper.make_tensor_value_info("tokens", i64, [M]),
            helper.make_tensor_value_info("count", i64, []),
            helper.make_tensor_value_info("h_final", f32, [H]),
        ],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="grapec-zoo", ir_version=8)
    return model


def control_flow(size: str = "tiny", seed: int = SEED) -> ZooModel:
    """Greedy decoding of a tiny RNN decoder: Loop with a data-dependent trip count, If inside."""
    sp = spec("control_flow", size)
    w = _cf_weights(sp.config, seed)

    def exporter(zm, path):
        finish_and_save(_cf_graph(w, sp.config), zm, path)

    return ZooModel(name="control_flow", size=size, module=None, inputs=sp.random_inputs(seed), dynamic_dims={},
                    spec=sp, exporter=exporter, reference=_cf_reference(w, sp.config), weights=w, seed=seed)
