"""Walking and copying ONNX protos, shared by the frontend's rewrites (precision, Scan) and import."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper


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


class Unsupported(Exception):
    """A form of an op a rewrite does not take (frontend/contrib*.py); import names the node with it."""


def write_as(b: "NodeBuilder", src: str, out: str):
    """A rewrite's value `src` under the node's output name `out` (where the node has it)."""
    if out:
        b.node("Identity", [src], out=out)


class NodeBuilder:
    """Emits ONNX nodes with unique names, in the forms the model's opset expects (the frontend's
    rewrites: recurrent ops as Loops, onnxruntime's contrib ops as standard ops)."""

    def __init__(self, prefix: str, opset: int, float_dtype=np.float32):
        self.prefix, self.opset, self.float_dtype, self.out, self._n = prefix, opset, float_dtype, [], 0

    def name(self, hint: str) -> str:
        self._n += 1
        return f"{self.prefix}_{hint}{self._n}"

    def node(self, op: str, inputs: list, hint: str = "", out: str | None = None, **attrs) -> str:
        out = out or self.name(hint or op.lower())
        # named after its output, which carries the rewritten node's name: what reports show of it
        self.out.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def multi(self, op: str, inputs: list, outs: list, **attrs) -> list:
        """A node with several outputs; an empty name in `outs` gets a fresh one."""
        outs = [o or self.name(f"{op.lower()}_out") for o in outs]
        self.out.append(helper.make_node(op, inputs, outs, name=outs[0], **attrs))
        return outs

    def const(self, value, dtype=np.int64) -> str:
        arr = np.asarray(value, dtype)
        return self.node("Constant", [], "c", value=numpy_helper.from_array(arr, self.name("v")))

    def fconst(self, v) -> str:
        return self.const(v, self.float_dtype)

    def unsqueeze(self, x: str, axis: int) -> str:
        if self.opset >= 13:
            return self.node("Unsqueeze", [x, self.const([axis])])
        return self.node("Unsqueeze", [x], axes=[axis])

    def reduce_sum(self, x: str, axes: list, keepdims: int = 0) -> str:
        return self.reduce("ReduceSum", x, axes, keepdims)

    def reduce(self, op: str, x: str, axes: list, keepdims: int = 0) -> str:
        """A Reduce* node: axes as an input from opset 13 (ReduceSum) or 18 (the others), else an attribute."""
        if self.opset >= (13 if op == "ReduceSum" else 18):
            return self.node(op, [x, self.const(axes)], keepdims=keepdims)
        return self.node(op, [x], axes=axes, keepdims=keepdims)

    def span(self, x: str, start: int, end: int, axis: int = 0) -> str:
        """x[start:end] along axis (Slice with inputs: the rewrite needs opset 10 or later)."""
        return self.node("Slice", [x, self.const([start]), self.const([end]), self.const([axis])])

    def pick(self, x: str, i: int) -> str:
        """x[i] (the leading dim dropped)."""
        return self.node("Gather", [x, self.const(i)], axis=0)

    def dim(self, x: str, axis: int) -> str:
        """x's size along axis, as an int64 scalar (folded at compile time)."""
        return self.node("Gather", [self.node("Shape", [x]), self.const(axis)], axis=0)


def inline_if(model: onnx.ModelProto, index: int, take_then: bool) -> onnx.ModelProto | None:
    """A copy of the model with top-level node `index`, an If, replaced by the nodes of the branch
    it takes (an Identity per output), the branch's initializers moved to the graph; None where a
    branch value's name is taken in the graph already."""
    m = copy_model(model)
    g = m.graph
    node = g.node[index]
    branch = next(a.g for a in node.attribute if a.name == ("then_branch" if take_then else "else_branch"))
    # the If's own outputs are not taken: a branch may define them by name (optimum's merged decoder)
    taken = {t.name for t in g.initializer} | {i.name for i in g.input} | \
        {o for i, n in enumerate(g.node) if i != index for o in n.output}
    if {t.name for t in branch.initializer} & taken or {o for n in branch.node for o in n.output} & taken:
        return None
    g.initializer.extend(branch.initializer)
    body = list(branch.node) + [helper.make_node("Identity", [src.name], [dst], name=f"{node.name or 'If'}/out{k}")
                                for k, (src, dst) in enumerate(zip(branch.output, node.output)) if dst and dst != src.name]
    nodes = list(g.node[:index]) + body + list(g.node[index + 1:])
    del g.node[:]
    g.node.extend(nodes)
    return m
