"""The graph IR every pass transforms.

Before lowering, nodes are ONNX ops (op = "Add", "Conv", "If", ...). Lowering replaces them by
three kinds of node, which is all a plan holds:

    Kernel   attrs["kernel"]: a kernel-IR Kernel; inputs are its slots in order, one output
    Library  attrs["op"]: "matmul" | "conv" | "sdpa" | "topk_values" | "topk_indices"; compute-bound work done by a
             library (cuBLASLt, cuDNN)
    View     output aliases input 0 (same bytes, another shape): Reshape, Squeeze, Identity...;
             attrs["pitch"] = P: the output is the leading columns of input 0's rows of P elements
             (a graph output whose GEMM wrote padded rows: passes/aligned_rows.py)
    If/Loop  regions whose bodies (node.subgraphs) are lowered graphs of the same kinds

Values are named as in ONNX. A Value's shape is a tuple of ints once specialized (before, dims may
be strings, ONNX dim_params). `const` holds the numpy value of weights and folded constants.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from .. import dtypes


@dataclass
class Value:
    name: str
    dtype: str | None = None
    shape: tuple | None = None
    const: np.ndarray | None = None
    # Axes whose size is data-dependent: {axis: name of the int64 scalar value holding how many of the
    # axis's positions are valid at run time}; the shape holds the bound there (ops/counted.py).
    counts: dict | None = None
    # A small run-time integer tensor (a shape computed from a count) known to lie between two constant
    # arrays of its shape, elementwise: (low, high). Ops that need a constant shape take `high` as the
    # bound and read the elements where low != high at run time (LowerCtx.shape_param).
    bounds: tuple | None = None

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * dtypes.itemsize(self.dtype)

    @property
    def is_static(self) -> bool:
        return self.shape is not None and all(isinstance(d, int) for d in self.shape)


@dataclass
class Node:
    op: str
    inputs: list
    outputs: list
    name: str = ""
    attrs: dict = field(default_factory=dict)
    subgraphs: dict = field(default_factory=dict)
    domain: str = ""
    origin: list = field(default_factory=list)  # ONNX node names this node came from

    def __repr__(self):
        return f"{self.op}({', '.join(self.inputs)}) -> {', '.join(self.outputs)}"


@dataclass
class Graph:
    nodes: list
    inputs: list            # names of graph inputs (not weights)
    outputs: list           # names of graph outputs
    values: dict            # name -> Value, for every value defined in this graph
    name: str = "main"
    parent: "Graph | None" = None
    opset: int = 0

    _counter = itertools.count()

    def lookup(self, name: str) -> Value | None:
        g = self
        while g is not None:
            v = g.values.get(name)
            if v is not None:
                return v
            g = g.parent
        return None

    @staticmethod
    def restart_names():
        """Number new values from 0 again: the compile of each bucket then names its values alike, so
        plans of sizes that compile alike are alike to the letter (bundle/templates.py stores them
        once)."""
        Graph._counter = itertools.count()

    def add_value(self, hint: str, dtype: str, shape, const=None) -> Value:
        name = f"{hint}__{next(Graph._counter)}"
        while self.lookup(name) is not None:   # a model's own name that looks like ours
            name = f"{hint}__{next(Graph._counter)}"
        v = Value(name, dtype, tuple(shape), const)
        self.values[name] = v
        return v

    def producers(self) -> dict:
        return {o: n for n in self.nodes for o in n.outputs if o}

    def consumers(self) -> dict:
        users: dict = {}
        for n in self.nodes:
            for i in set(n.inputs) | outer_reads(n):
                if i:
                    users.setdefault(i, []).append(n)
        return users


def view_source(g: Graph):
    """name -> the value it is a View of, through any chain of Views in g (itself if none)."""
    view_of = {n.outputs[0]: n.inputs[0] for n in g.nodes if n.op == "View"}

    def source(name: str) -> str:
        while name in view_of:
            name = view_of[name]
        return name
    return source


def view_chain(name: str, producers: dict) -> list:
    """The View nodes between a value and the source it views: the one that makes `name` first, the
    one that reads the source last (producers: Graph.producers())."""
    chain = []
    node = producers.get(name)
    while node is not None and node.op == "View":
        chain.append(node)
        node = producers.get(node.inputs[0])
    return chain


def outer_reads(node: Node) -> set:
    """Names a region node's bodies read from enclosing scopes (they are inputs of the node too)."""
    names = set()
    for body in node.subgraphs.values():
        defined = set(body.inputs) | {v for v in body.values}
        for n in body.nodes:
            for i in list(n.inputs) + sorted(outer_reads(n)):
                if i and i not in defined:
                    names.add(i)
        for o in body.outputs:
            if o not in defined:
                names.add(o)
    return names


def upstream(g: Graph, names, stop=lambda name: False) -> set:
    """The given values and every value they are computed from through g's nodes (a region node's
    outer reads included). The walk neither takes nor passes a name for which stop(name) holds."""
    producers = g.producers()
    seen, todo = set(), list(names)
    while todo:
        n = todo.pop()
        if n in seen or stop(n):
            continue
        seen.add(n)
        node = producers.get(n)
        if node is not None:
            todo.extend(i for i in list(node.inputs) + sorted(outer_reads(node)) if i)
    return seen
