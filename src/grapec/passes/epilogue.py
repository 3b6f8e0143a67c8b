"""epilogue: fold the elementwise kernel after a matmul or convolution into the library call itself.

cuBLASLt computes act(alpha * A @ B + beta * C + bias) in one call. A kernel that only
    * adds a tensor of the matmul's own shape (a residual)  -> C with beta = 1, or
    * adds a vector over the last axis                       -> the BIAS epilogue, or
    * applies ReLU or tanh-GELU                              -> the activation epilogue
to the output of a matmul nobody else reads is removed: the matmul writes the kernel's value (a View
replaces the kernel). fold_output_casts, later, removes a kernel that only widens a half-precision matmul's output to float32
(the cast mixed_precision.py puts before a float32 graph output, such as GPT-2's logits): cuBLASLt
writes float32 D from half A and B (attrs out_dtype), and the output is written once, not written
in half, read back and written again. Only where the float32 rows are 16-byte aligned (see
_fold_output_cast: GPT-2's 50257 logits are not, and keep their cast). A channels-last `conv` (cuDNN) takes the bias (over its last axis, the
channels) and ReLU the same way, and a residual of its output's shape (NHWC) as cuDNN's second add,
also where fusion made the add and the ReLU after it one kernel (a ResNet block's shortcut); after fusion
the ReLU between two convolutions is the next one's input copy, which then goes. Activations are recognised by value, not by the shape of the expression (the
ONNX exporters spell GELU a dozen ways): the kernel is evaluated on sample points and compared with
the reference function.
"""
from __future__ import annotations

import numpy as np

from ..ir import kernel as K
from ..ir.graph import Graph, Node
from ..ir.tensor import index_vars
from ..ir.interpret import run_kernel

SAMPLES = np.linspace(-8.0, 8.0, 1601)


def _reference(act: str, x: np.ndarray) -> np.ndarray:
    if act == "relu":
        return np.maximum(x, 0)
    inner = np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)
    return 0.5 * x * (1 + np.tanh(inner))


def _graph_index(g: Graph) -> tuple:
    """(producer of each value, how many node inputs read each value, the graph's outputs)."""
    readers: dict = {}
    for n in g.nodes:
        for i in n.inputs:
            readers[i] = readers.get(i, 0) + 1
    return {n.outputs[0]: n for n in g.nodes}, readers, set(g.outputs)


def fold_epilogues(g: Graph) -> Graph:
    producers, readers, outputs = _graph_index(g)
    new_nodes: list = []
    for node in g.nodes:
        new_nodes.append(node)
        if not K.is_kernel_node(node):
            continue
        k = node.attrs["kernel"]
        for slot, name in enumerate(node.inputs):
            mm_name, mm = _library_behind(name, producers)
            if mm is None or readers.get(name) != 1 or (name != mm_name and readers.get(mm_name) != 1) \
                    or mm_name in outputs or not _is_identity_load_of(k, slot):
                continue
            change = _match(k, slot, mm, node)
            if change is None:
                continue
            attrs, extra = change
            c_at = C_AT[mm.attrs["op"]]
            if c_at in extra:   # C (a residual) must be a buffer of the call's own output shape
                extra[c_at] = _view_as(g, extra[c_at], g.lookup(mm.outputs[0]).shape, node, new_nodes)
            mm.attrs.update(attrs)
            ins = list(mm.inputs) + [""] * (SLOTS[mm.attrs["op"]] - len(mm.inputs))
            for pos, value in extra.items():
                ins[pos] = value
            mm.inputs = ins
            mm.origin = list(dict.fromkeys(mm.origin + node.origin))
            new_nodes[-1] = Node("View", [name], list(node.outputs), name=node.name, origin=list(mm.origin))
            # the kernel after this one may fold too: a bias Add, then the residual Add reading it
            producers[node.outputs[0]] = new_nodes[-1]
            break
    g.nodes = new_nodes
    return g


# per library op: its input count, the input positions of C (a residual) and bias, its activations
SLOTS = {"matmul": 4, "conv": 4}
C_AT = {"matmul": 2, "conv": 3}
BIAS_AT = {"matmul": 3, "conv": 2}
ACTIVATIONS = {"matmul": ("relu", "gelu_tanh"), "conv": ("relu",)}


def fold_output_casts(g: Graph) -> Graph:
    """The widening casts of GEMM outputs into the GEMMs. Run after fuse_attention and small_gemms, so
    that a GEMM they take (attention's second, a few-row GEMM: kernels that write half) stays theirs."""
    producers, readers, outputs = _graph_index(g)
    for pos, node in enumerate(g.nodes):
        if K.is_kernel_node(node) and _fold_output_cast(g, node, node.attrs["kernel"], producers, readers, outputs):
            g.nodes[pos] = Node("View", [node.inputs[0]], list(node.outputs), name=node.name, origin=list(node.origin))
    return g


def _fold_output_cast(g: Graph, node: Node, k: K.Kernel, producers, readers, outputs) -> bool:
    """A kernel that is cast(load(0)) from float16/bfloat16 to float32, of a matmul's output (through
    Views) that only it reads: the matmul writes float32 itself. True when folded (the kernel's output
    then is a View of the matmul's, every value between them retyped)."""
    if len(node.inputs) != 1 or k.dtype != "float32" or k.inputs[0] != (k.shape, k.inputs[0][1]) \
            or k.inputs[0][1] not in ("float16", "bfloat16") or k.body.op != "cast" \
            or k.body.args[0] != K.load(0, index_vars(k.shape), k.inputs[0][1]):
        return False
    chain, name = [], node.inputs[0]
    n = producers.get(name)
    while n is not None and n.op == "View":
        chain.append(name)
        if readers.get(name) != 1:
            return False
        name = n.inputs[0]
        n = producers.get(name)
    if n is None or n.op != "Library" or n.attrs.get("op") != "matmul" or readers.get(name) != 1 or name in outputs \
            or any(i for i in n.inputs[2:]) or n.attrs.get("out_dtype") or n.attrs.get("views"):
        return False   # a C or bias operand would have to be float32 too: cuBLASLt types C like D
    if not k.shape or k.shape[-1] % 4:
        # float32 rows off 16 bytes put cuBLASLt on a slow path: GPT-2's 50257 logits at batch 16 x seq 128
        # took 1483 us written float32 by the GEMM against 503 + 485 us for a half GEMM into padded rows
        # and the cast (H100, 2026-11-25). Kept in padded (aligned) float32 rows it was still slower: GPT-2
        # b16 1.771 ms end to end against 1.296 with half logits, the float32 GEMM ~475 us more than the
        # half one (benchmarks/results/2026-11-25-h100-padded-output/)
        return False
    n.attrs["out_dtype"] = "float32"
    for v in chain + [name]:
        g.lookup(v).dtype = "float32"
    n.origin = list(dict.fromkeys(n.origin + node.origin))
    return True


def _library_behind(name, producers):
    """The matmul or conv Library node whose output `name` is (directly or through Views)."""
    n = producers.get(name)
    while n is not None and n.op == "View":
        name = n.inputs[0]
        n = producers.get(name)
    if n is not None and n.op == "Library" and n.attrs.get("op") in SLOTS:
        return name, n
    return None, None


def _is_identity_load_of(k: K.Kernel, slot: int) -> bool:
    """Every load of `slot` reads element i of the kernel at output element i (same flat order)."""
    if k.inputs[slot][0] != k.shape or k.dtype != k.inputs[slot][1]:
        return False
    ident = index_vars(k.shape)
    loads = [e for e in K.walk(k.body) if e.op == "load" and e.args[0] == slot]
    return bool(loads) and all(e.args[1] == ident and e.args[2] is None for e in loads)


def _match(k: K.Kernel, slot: int, mm: Node, node: Node):
    """-> ({attrs}, {matmul input position: value name}) or None."""
    body = k.body
    op = mm.attrs["op"]
    c_at, bias_at = C_AT[op], BIAS_AT[op]
    has_c = len(mm.inputs) > c_at and bool(mm.inputs[c_at])
    has_bias = len(mm.inputs) > bias_at and bool(mm.inputs[bias_at])
    act = mm.attrs.get("act", "")
    if body.op == "add" and not act:
        a, b = body.args
        mine = K.load(slot, index_vars(k.shape), k.dtype)
        other = b if a is mine else a if b is mine else None
        if other is None or other.op != "load" or other.args[2] is not None:
            return None
        o_slot, o_index = other.args[0], other.args[1]
        o_name = node.inputs[o_slot]
        o_shape = k.inputs[o_slot][0]
        n_cols = k.shape[-1] if k.shape else 1
        if not has_c and o_shape == k.shape and o_index == index_vars(k.shape) and o_name not in mm.inputs \
                and (op == "matmul" or k.inputs[o_slot][1] == k.dtype):
            return ({"beta": 1.0} if op == "matmul" else {}), {c_at: o_name}
        if not has_bias and k.shape and o_index == (K.idx(len(k.shape) - 1),) and o_shape == (n_cols,) and n_cols > 1:
            return {}, {bias_at: o_name}
        return None
    if act or (has_c and op == "matmul"):
        return None
    if op == "conv" and not has_c:
        residual = _residual_under_activation(k, slot, node, mm)
        if residual is not None:
            return residual
    loads = [e for e in K.walk(body) if e.op == "load"]
    if any(e.args[0] != slot for e in loads):
        return None
    name = _activation(k, body, op)
    return ({"act": name}, {}) if name else None


def _activation(k: K.Kernel, body, op: str) -> str | None:
    """The library op's activation that body computes of its one loaded value, found by evaluating it."""
    if k.dtype not in ("float32", "float16", "bfloat16"):
        return None
    probe = K.Kernel((len(SAMPLES),), k.dtype, K.rebuild(body, (K.idx(0),) * len(k.shape),
                                                         lambda ld: K.load(0, (K.idx(0),), ld.dtype)),
                     (((len(SAMPLES),), k.dtype),))
    got = run_kernel(probe, [SAMPLES.astype(k.dtype)]).astype(np.float64)
    tol = {"float16": 3e-3, "bfloat16": 2e-2}.get(k.dtype, 1e-5)   # half kernels round their constants
    for name in ACTIVATIONS[op]:
        want = _reference(name, SAMPLES)
        if np.max(np.abs(got - want)) <= tol * max(1.0, np.max(np.abs(want))):
            return name
    return None


def _residual_under_activation(k: K.Kernel, slot: int, node: Node, mm: Node):
    """act(conv + r) as one kernel (a ResNet block's shortcut add and ReLU, fused) -> ({"act"},
    {C_AT: r}) or None. r is read at the kernel's own index, and the convolution's output and r are
    each read once, by the same add: then the kernel is a function of that sum alone, and setting r
    to zero leaves the activation to find by evaluation."""
    ident = index_vars(k.shape)
    mine = K.load(slot, ident, k.dtype)
    others = [e for e in K.walk(k.body) if e.op == "load" and e is not mine]
    if len(others) != 1 or others[0].args[1] != ident or others[0].args[2] is not None:
        return None
    other = others[0]
    o_slot = other.args[0]
    o_name = node.inputs[o_slot]
    if k.inputs[o_slot] != (k.shape, k.dtype) or o_name in mm.inputs:
        return None
    parents: dict = {}
    for e in K.walk(k.body):
        for c in K.children(e):
            parents.setdefault(c, []).append(e)
    pm, po = parents.get(mine, []), parents.get(other, [])
    if len(pm) != 1 or len(po) != 1 or pm[0] is not po[0] or pm[0].op != "add":
        return None
    rest = K.rebuild(k.body, None, lambda ld: K.const(0, ld.dtype) if ld.args[0] == o_slot else ld)
    name = _activation(k, rest, "conv")
    return ({"act": name}, {C_AT["conv"]: o_name}) if name else None


def _view_as(g: Graph, name: str, shape, node: Node, new_nodes: list) -> str:
    """A value holding `name`'s bytes in `shape` (a View node, placed before `node`)."""
    v = g.lookup(name)
    if tuple(v.shape) == tuple(shape):
        return name
    out = g.add_value(f"{name}_as_c", v.dtype, shape)
    new_nodes.insert(len(new_nodes) - 1, Node("View", [name], [out.name], name=node.name, origin=list(node.origin)))
    return out.name
