"""simplify: constant folding, BatchNorm folded into Conv, identical nodes merged, dead code removed.

Runs on a specialized graph (every value has a shape; foldable values carry `const`).
"""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Node, outer_reads


def simplify(graph: Graph) -> Graph:
    g = Graph(list(graph.nodes), list(graph.inputs), list(graph.outputs), dict(graph.values),
              graph.name, graph.parent, graph.opset)
    fold_constants(g)
    fold_batchnorm_into_conv(g)
    fold_transpose_into_matmul(g)
    merge_identical_nodes(g)
    remove_dead_code(g)
    return g


def fold_constants(g: Graph):
    """Nodes whose outputs are all known become initializers (the values already hold them)."""
    g.nodes = [n for n in g.nodes if n.subgraphs or not all(
        g.values[o].const is not None for o in n.outputs if o) or not any(n.outputs)]


def fold_batchnorm_into_conv(g: Graph):
    """Conv(x, W, b) -> BatchNormalization(scale, B, mean, var)  ==>  Conv(x, W', b')
    with s = scale / sqrt(var + eps), W' = W * s (per output channel), b' = (b - mean) * s + B."""
    users = g.consumers()
    producer = g.producers()
    out_nodes = []
    removed = set()
    for n in g.nodes:
        if n.op != "BatchNormalization" or len([o for o in n.outputs if o]) != 1 or n.attrs.get("training_mode", 0):
            continue
        conv = producer.get(n.inputs[0])
        if conv is None or conv.op != "Conv" or len(users.get(conv.outputs[0], [])) != 1 \
                or conv.outputs[0] in g.outputs:
            continue
        params = [g.lookup(i) for i in n.inputs[1:5]]
        w = g.lookup(conv.inputs[1])
        b = g.lookup(conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2] else None
        if any(p is None or p.const is None for p in params) or w.const is None or (b is not None and b.const is None):
            continue
        if w.dtype not in ("float32", "float64", "float16", "bfloat16"):
            continue
        scale, bias, mean, var = (p.const.astype(np.float64) for p in params)
        s = scale / np.sqrt(var + n.attrs.get("epsilon", 1e-5))
        w_new = (w.const.astype(np.float64) * s.reshape((-1,) + (1,) * (w.const.ndim - 1))).astype(w.const.dtype)
        b_old = b.const.astype(np.float64) if b is not None else 0.0
        b_new = ((b_old - mean) * s + bias).astype(w.const.dtype)
        wv = g.add_value(conv.inputs[1] + "_bnfold", w.dtype, w_new.shape, w_new)
        bv = g.add_value(n.outputs[0] + "_bnfold_bias", w.dtype, b_new.shape, b_new)
        folded = Node("Conv", [conv.inputs[0], wv.name, bv.name], [n.outputs[0]], conv.name,
                      dict(conv.attrs), {}, conv.domain, [conv.name, n.name])
        removed.add(id(conv))
        out_nodes.append((n, folded))
    if not out_nodes:
        return
    swap = {id(bn): folded for bn, folded in out_nodes}
    g.nodes = [swap.get(id(n), n) for n in g.nodes if id(n) not in removed]


def fold_transpose_into_matmul(g: Graph):
    """MatMul(x, Transpose(w, perm=swap of the last two dims))  ==>  MatMul(x, w) with the operand
    marked transposed (grapec_trans_b), which the library reads in place: no copy of w, and the
    Transpose is dead code if nothing else reads it."""
    producer = g.producers()
    for n in g.nodes:
        if n.op != "MatMul":
            continue
        for i, flag in ((0, "grapec_trans_a"), (1, "grapec_trans_b")):
            p = producer.get(n.inputs[i])
            if p is None or p.op != "Transpose":
                continue
            src = g.lookup(p.inputs[0])
            rank = len(src.shape) if src is not None and src.shape is not None else 0
            perm = list(p.attrs.get("perm", range(rank)[::-1]))
            if rank >= 2 and perm == list(range(rank - 2)) + [rank - 1, rank - 2]:
                n.inputs = list(n.inputs)
                n.inputs[i] = p.inputs[0]
                n.attrs = {**n.attrs, flag: 1 - int(n.attrs.get(flag, 0))}


RANDOM_OPS = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli",
              "Dropout"}
SMALL_CONSTANT_BYTES = 1 << 16   # constants this small are compared by value (a Range folded per layer); larger by name


def merge_identical_nodes(g: Graph):
    """A node with the op, inputs and attributes of an earlier one computes the same values: its
    readers read the earlier node's outputs instead, and it goes. Exporters repeat a computation per
    layer (onnxruntime-genai's builder derives each layer's key positions and cache masks from the
    same attention mask), and each copy would be a kernel of its own. Nodes with bodies, random ops
    and nodes whose outputs leave the graph or are read by a body stay."""
    pinned = set(g.outputs)
    for n in g.nodes:
        pinned.update(outer_reads(n))
    first: dict = {}
    alias: dict = {}
    keep = []
    for n in g.nodes:
        n.inputs = [alias.get(i, i) for i in n.inputs]
        if n.subgraphs or n.op in RANDOM_OPS or pinned.intersection(n.outputs):
            keep.append(n)
            continue
        key = (n.op, n.domain, tuple(_input_key(g, i) for i in n.inputs), _frozen(n.attrs),
               tuple(bool(o) for o in n.outputs))   # the same optional outputs present
        same = first.setdefault(key, n)
        if same is n:
            keep.append(n)
            continue
        for mine, theirs in zip(n.outputs, same.outputs):
            if mine:
                alias[mine] = theirs
    g.nodes = keep


def _input_key(g: Graph, name: str):
    v = g.lookup(name) if name else None
    if v is not None and v.const is not None and np.asarray(v.const).nbytes <= SMALL_CONSTANT_BYTES:
        c = np.asarray(v.const)
        return ("const", str(c.dtype), c.shape, c.tobytes())
    return name


def _frozen(x):
    if isinstance(x, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in x.items()))
    if isinstance(x, (list, tuple)):
        return tuple(_frozen(v) for v in x)
    if isinstance(x, np.ndarray):
        return ("array", str(x.dtype), x.shape, x.tobytes())
    return repr(x)


def remove_dead_code(g: Graph):
    live = set(g.outputs)
    keep = []
    for n in reversed(g.nodes):
        if any(o in live for o in n.outputs if o):
            keep.append(n)
            live.update(i for i in n.inputs if i)
            live.update(outer_reads(n))
    g.nodes = keep[::-1]
