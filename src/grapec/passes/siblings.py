"""merge_sibling_matmuls: matmuls of one input against constant weights become one wider GEMM.

BERT and Wav2Vec2 (as torch.onnx, tf2onnx and optimum export them) project the hidden state three
times, for Q, K and V: three GEMMs of N = hidden, each a graph node, each too small at batch 1 to
fill the GPU. GPT-2's exporter already writes one [hidden, 3 * hidden] projection and a Split. This
pass rewrites the former into the latter, on the ONNX-level graph:

    MatMul(x, Wq) [+ bq], MatMul(x, Wk) [+ bk], ...
        ==>  Split(MatMul(x, concat(Wq, Wk, ..)) [+ concat(bq, bk, ..)], axis=-1)

so the rest of the pipeline sees what it sees for GPT-2: the bias folds into the GEMM's epilogue,
the heads are read in place through strided views, and attention fuses. A bias is an Add of a
constant vector over the last axis that is the matmul's only reader; a member without one gets
zeros. Members must agree on the weight's K, dtype and transposition (grapec_trans_b).
"""
from __future__ import annotations

import numpy as np

from ..ir.derived import derived
from ..ir.graph import Graph, Node


def merge_sibling_matmuls(g: Graph) -> Graph:
    readers = g.consumers()
    groups: dict = {}
    for n in g.nodes:
        key = _sibling_key(g, n)
        if key is not None:
            groups.setdefault(key, []).append(n)
    for members in groups.values():
        if len(members) > 1:
            _merge(g, members, readers)
    return g


def _sibling_key(g: Graph, n: Node):
    if n.op != "MatMul" or n.attrs.get("grapec_trans_a") or len(n.outputs) != 1:
        return None
    x, w = g.lookup(n.inputs[0]), g.lookup(n.inputs[1])
    if w is None or w.const is None or w.shape is None or len(w.shape) != 2 or x is None or x.const is not None \
            or x.shape is None or len(x.shape) < 2:
        return None
    trans = int(n.attrs.get("grapec_trans_b", 0))
    return n.inputs[0], w.shape[1 - trans], w.dtype, trans


def _bias_of(g: Graph, mm: Node, readers: dict):
    """The Add that adds a constant vector over the last axis to mm's output, its only reader."""
    y = mm.outputs[0]
    users = readers.get(y, [])
    if len(users) != 1 or y in g.outputs or users[0].op != "Add" or users[0].subgraphs:
        return None
    add = users[0]
    other = [i for i in add.inputs if i != y]
    if len(other) != 1 or len(add.inputs) != 2:
        return None
    b = g.lookup(other[0])
    n = g.lookup(y).shape[-1]
    out = g.lookup(add.outputs[0])
    if b is None or b.const is None or b.dtype != g.lookup(y).dtype or out.shape != g.lookup(y).shape \
            or np.asarray(b.const).size != n or (len(b.shape) and b.shape[-1] != n):
        return None
    return add, np.asarray(b.const).reshape(-1)


def _merge(g: Graph, members: list, readers: dict):
    first = members[0]
    x = g.lookup(first.inputs[0])
    trans = int(first.attrs.get("grapec_trans_b", 0))
    consts = tuple(g.lookup(m.inputs[1]).const for m in members)
    weights = [np.asarray(c) for c in consts]
    widths = [w.shape[0] if trans else w.shape[1] for w in weights]
    biases = [_bias_of(g, m, readers) for m in members]
    dtype = g.lookup(first.outputs[0]).dtype
    out_shape = (*g.lookup(first.outputs[0]).shape[:-1], sum(widths))
    axis = 0 if trans else 1
    cat = derived(f"concatenate{tuple(w.shape for w in weights)}axis{axis}", consts,
                  lambda: np.concatenate(weights, axis=axis))
    w_cat = g.add_value("merged_weight", g.lookup(first.inputs[1]).dtype, cat.shape, cat)
    y = g.add_value("merged_matmul", dtype, out_shape)
    nodes = [Node("MatMul", [x.name, w_cat.name], [y.name], name=f"{first.name}_merged", attrs=dict(first.attrs),
                  origin=[o for m in members for o in (m.origin or [m.name])])]
    if any(biases):
        b_dtype = next(b for b in biases if b)[1].dtype
        vec = np.concatenate([b[1] if b else np.zeros(n, b_dtype) for b, n in zip(biases, widths)])
        b_cat = g.add_value("merged_bias", dtype, vec.shape, vec)
        z = g.add_value("merged_bias_add", dtype, out_shape)
        nodes.append(Node("Add", [y.name, b_cat.name], [z.name], name=f"{first.name}_merged_bias",
                          origin=[o for b in biases if b for o in (b[0].origin or [b[0].name])]))
        y = z
    sizes = g.add_value("merged_split", "int64", (len(members),), np.asarray(widths, np.int64))
    outs = [b[0].outputs[0] if b else m.outputs[0] for m, b in zip(members, biases)]
    nodes.append(Node("Split", [y.name, sizes.name], outs, name=f"{first.name}_merged_split",
                      attrs={"axis": len(out_shape) - 1}, origin=list(nodes[0].origin)))
    gone = {id(m) for m in members} | {id(b[0]) for b in biases if b}
    at = g.nodes.index(first)
    g.nodes = [n for n in g.nodes[:at] if id(n) not in gone] + nodes + [n for n in g.nodes[at:] if id(n) not in gone]
