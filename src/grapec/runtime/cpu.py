"""The CPU backend: a numpy interpreter of lowered nodes and of whole plans.

`run_node` executes one lowered node given functions to read and write values; the compiler uses
it on dicts of constants (constant folding) and the plan executor on views into one arena, so the
memory plan is exercised exactly as the GPU will use it.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .cpu_kernels import run_kernel
from .library import run_library


def run_node(node, read: Callable, write: Callable, out_shape: Callable):
    """Execute one lowered node. read(name) -> array, write(name, array), out_shape(name) -> shape."""
    if node.op == "Kernel":
        k = node.attrs["kernel"]
        write(node.outputs[0], run_kernel(k, [read(n) for n in node.inputs]))
    elif node.op == "Library":
        write(node.outputs[0], run_library(node.attrs, [read(n) if n else None for n in node.inputs]))
    elif node.op == "View":
        write(node.outputs[0], read(node.inputs[0]).reshape(out_shape(node.outputs[0])))
    else:  # If/Loop regions are never folded; plans run them (runtime/control.py)
        raise ValueError(f"cannot execute node kind {node.op}")


def eval_nodes(nodes: list, graph, consts: dict) -> dict:
    """Run lowered nodes over a dict of arrays (constant folding); returns the dict, extended."""
    env = dict(consts)

    def read(name):
        if name in env:
            return env[name]
        v = graph.lookup(name)
        if v is None or v.const is None:
            raise KeyError(name)
        return v.const

    def write(name, arr):
        env[name] = arr

    def shape(name):
        return graph.lookup(name).shape

    for n in nodes:
        run_node(n, read, write, shape)
    return env
