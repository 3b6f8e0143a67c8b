"""Walking and copying ONNX protos, shared by the frontend's rewrites (precision, Scan) and import."""
from __future__ import annotations

import onnx


def subgraphs(n: onnx.NodeProto):
    """The subgraphs of an If/Loop/Scan node."""
    for a in n.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            yield a.g
        elif a.type == onnx.AttributeProto.GRAPHS:
            yield from a.graphs


def all_nodes(g: onnx.GraphProto):
    """Every node of g and of the subgraphs inside it."""
    for n in g.node:
        yield n
        for body in subgraphs(n):
            yield from all_nodes(body)


def copy_model(model: onnx.ModelProto) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    return m
