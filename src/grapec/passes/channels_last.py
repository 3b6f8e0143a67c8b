"""channels_last: store 4-D activations NHWC where the convolutions around them read and write NHWC.

A channels-last `conv` (ops/conv.py) reads [N, H, W, C] and writes [N, OH, OW, K]; the ONNX values
between convolutions stay NCHW in the IR, and lowering joins the two by transposes, which are index
remaps. After fusion, a kernel between two convolutions (a ReLU, a residual add, a max-pool) then
iterates in NCHW order while it reads and writes NHWC data through transposed indices: its reads or
its writes are strided by the channel count, and a value two convolutions read is copied to NHWC
once for each.

This pass flips the stored layout of such values. A kernel's output [N, C, H, W] becomes
[N, H, W, C]: the kernel iterates channels innermost, and every reader's load at (n, c, h, w) reads
(n, h, w, c) instead. The logical value is unchanged; only the order of its bytes and of the threads
that write them. A flip is made where it makes more loads run along the innermost index (coalesced)
than it makes stride, counting the kernel's own loads and its readers' (greedy, to a fixpoint). Then
a copy whose load became the identity (the NHWC copy that fed a convolution) is a View.

Values that must keep their layout are left alone: graph outputs, and values read by anything but
kernels (views, library calls, If/Loop bodies).
"""
from __future__ import annotations

import math

from ..ir import kernel as K
from ..ir.graph import Graph, Node, outer_reads

TO_NHWC = (0, 2, 3, 1)   # a flipped value's stored dim d holds logical dim TO_NHWC[d]
MAX_ROUNDS = 4


def channels_last(g: Graph) -> Graph:
    if not any(n.op == "Library" and n.attrs.get("op") == "conv" for n in g.nodes):
        return g
    for _ in range(MAX_ROUNDS):
        if not _flip_round(g):
            break
    return _identity_copies_as_views(g)


def _flip_round(g: Graph) -> bool:
    producers = {n.outputs[0]: n for n in g.nodes if K.is_kernel_node(n)}
    readers = g.consumers()
    outputs = set(g.outputs)
    flipped = False
    for name, node in producers.items():
        k = node.attrs["kernel"]
        users = readers.get(name, [])
        if not isinstance(k, K.Kernel) or len(k.shape) != 4 or k.shape[2] * k.shape[3] == 1 or name in outputs \
                or not users or any(u.op != "Kernel" or not isinstance(u.attrs["kernel"], K.Kernel)
                                    or name in outer_reads(u) for u in users):
            continue
        if _gain(k, users, name) <= 0:
            continue
        node.attrs["kernel"] = _flipped_kernel(k)
        for u in users:
            u.attrs["kernel"] = _reader_flipped(u.attrs["kernel"], u.inputs.index(name))
        v = g.values[name] if name in g.values else g.lookup(name)
        v.shape = tuple(k.shape[d] for d in TO_NHWC)
        flipped = True
    return flipped


def _gain(k: K.Kernel, users: list, name: str) -> int:
    """Loads that run along the innermost index after the flip, less those that do before it."""
    inner_before, inner_after = K.idx(3), K.idx(1)   # the flipped kernel's innermost index is the channel
    gain = sum(_along(ld, inner_after) - _along(ld, inner_before) for ld in _loads(k.body))
    for u in users:
        uk = u.attrs["kernel"]
        slot = u.inputs.index(name)
        inner = _innermost(uk)
        for ld in _loads(uk.body):
            if ld.args[0] == slot and len(ld.args[1]) == 4:
                after = ld.args[1][TO_NHWC[3]]   # the flipped value's innermost dim is the channel
                gain += _mentions(after, inner) - _mentions(ld.args[1][3], inner)
    return gain


def _loads(body) -> list:
    return [e for e in K.walk(body) if e.op == "load"]


def _along(ld, inner) -> int:
    """1 if the load's innermost index moves with the kernel's index `inner`."""
    ix = ld.args[1]
    return int(bool(ix) and _mentions(ix[-1], inner))


def _mentions(e, var) -> bool:
    return any(x is var for x in K.walk(e))


def _innermost(k: K.Kernel):
    return K.idx(len(k.shape) - 1) if k.shape else None


def _flipped_kernel(k: K.Kernel) -> K.Kernel:
    """The kernel computing the same values into [N, H, W, C]: logical dim d is the flipped
    kernel's index at the stored position of d."""
    where = {logical: stored for stored, logical in enumerate(TO_NHWC)}
    index = tuple(K.idx(where[d]) if k.shape[d] != 1 else K.const(0, "int64") for d in range(4))
    body = K.rebuild(k.body, index)
    return K.Kernel(tuple(k.shape[d] for d in TO_NHWC), k.dtype, body, k.inputs)


def _reader_flipped(k: K.Kernel, slot: int) -> K.Kernel:
    """A reader of a flipped value: its loads of `slot` permuted, the slot's shape too."""
    def permute(ld):
        s, ix, mask, other = ld.args
        if s != slot:
            return ld
        return K.load(s, tuple(ix[d] for d in TO_NHWC), ld.dtype, mask, other)
    body = K.rebuild(k.body, None, permute)
    inputs = list(k.inputs)
    shape, dtype = inputs[slot]
    inputs[slot] = (tuple(shape[d] for d in TO_NHWC), dtype)
    return K.Kernel(k.shape, k.dtype, body, tuple(inputs))


def _identity_copies_as_views(g: Graph) -> Graph:
    """A kernel that only copies its one input, element for element, becomes a View of it."""
    nodes = []
    for n in g.nodes:
        k = n.attrs.get("kernel") if K.is_kernel_node(n) else None
        if k is not None and len(n.inputs) == 1 and k.inputs[0][1] == k.dtype and \
                math.prod(k.inputs[0][0]) == k.size and _is_identity(k):
            n = Node("View", list(n.inputs), list(n.outputs), name=n.name, origin=list(n.origin))
        nodes.append(n)
    g.nodes = nodes
    return g


def _is_identity(k: K.Kernel) -> bool:
    """The copy reads element i of its input for its element i: the same dims in the same order once
    the dims of size 1 are left out (NCHW and NHWC of a 1x1 map are the same bytes)."""
    b = k.body
    if b.op != "load" or b.args[0] != 0 or b.args[2] is not None:
        return False
    src_shape = k.inputs[0][0]
    zero = K.const(0, "int64")
    if any(i is not zero for i, d in zip(b.args[1], src_shape) if d == 1):
        return False
    read = [i for i, d in zip(b.args[1], src_shape) if d != 1]
    return read == [K.idx(a) for a, d in enumerate(k.shape) if d != 1]
