"""upcast_operands: a float32 matmul of two half values widened to float32 runs on the halves.

HF's GPT-J (and others that keep attention scores in float32) export q·kᵀ as Cast(q, float) and
Cast(k_cache, float) into a float32 MatMul. After fusion each Cast is a kernel of its own (the keys' a
copy of the whole cache at twice its bytes) and the product a float32 GEMM reading twice the bytes.
A product of halves widened to float32 is exact in float32 (11-bit significands), and cuBLASLt
multiplies half A and B into float32 D with float32 accumulation (attrs out_dtype, as fold_output_casts
uses it), so the matmul reads the halves instead:

  * an operand kernel that only widens a value (cast(load) at its own index) becomes a View of it;
  * one that computes a half value and widens it at the end (the rotated q) stores the half value.

Both operands must be such widenings, of one half type, read by the matmul alone. fuse_attention then
sees a half product (its float32 scores are what its accumulators hold).
"""
from __future__ import annotations

from ..ir import kernel as K
from ..ir.graph import Graph, Node, view_chain
from ..ir.tensor import index_vars

HALF_TYPES = ("float16", "bfloat16")


def upcast_operands(g: Graph) -> Graph:
    producers = g.producers()
    readers = {name: len(users) for name, users in g.consumers().items()}
    outputs = set(g.outputs)
    for mm in list(g.nodes):
        if mm.op != "Library" or mm.attrs.get("op") != "matmul" or any(i for i in mm.inputs[2:]) \
                or mm.attrs.get("out_dtype") or g.lookup(mm.outputs[0]).dtype != "float32":
            continue
        found = [_widening(name, producers, readers, outputs) for name in mm.inputs[:2]]
        if None in found or len({k.body.args[0].dtype for _, k, _ in found}) != 1:
            continue
        for node, k, chain in found:
            half = k.body.args[0].dtype
            if k.body.args[0] == K.load(0, index_vars(k.shape), half) and k.inputs[0] == (k.shape, half):
                g.nodes[g.nodes.index(node)] = Node("View", [node.inputs[0]], list(node.outputs), name=node.name,
                                                    origin=list(node.origin))
            else:
                node.attrs["kernel"] = K.Kernel(k.shape, half, k.body.args[0], k.inputs)
            for v in chain:
                g.lookup(v).dtype = half
            mm.origin = list(dict.fromkeys(mm.origin + node.origin))
        mm.attrs["out_dtype"] = "float32"
    return g


def _widening(name: str, producers: dict, readers: dict, outputs: set):
    """-> (the kernel node, its kernel, the values from its output to `name`) when `name` is, through
    Views each read once, a kernel's output that is cast(half -> float32) of a half expression and
    that nothing else reads; else None."""
    chain = [name] + [view.inputs[0] for view in view_chain(name, producers)]
    node = producers.get(chain[-1])
    if node is None or not K.is_kernel_node(node) or any(readers.get(v) != 1 or v in outputs for v in chain):
        return None
    k = node.attrs["kernel"]
    if not isinstance(k, K.Kernel) or k.dtype != "float32" or k.body.op != "cast" \
            or k.body.args[0].dtype not in HALF_TYPES:
        return None
    return node, k, chain
