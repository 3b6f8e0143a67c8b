"""attention_operands: a fused attention kernel reads q, k and v where the copies before it read
them, and writes its output where the copy after it would.

At batch 1 the head split and merge around attention are strides (passes/strided_operands.py). At
batch > 1 a head of the fused QKV projection [B, S, 3, H, D] is two batch strides away (batch and
head), which a cuBLASLt operand cannot express, so lowering left a transposing copy before each
product and after the second: four copies a layer, each a full pass over an activation (BERT at
batch 32: 15 us each, as much as the attention itself). The attention kernel takes any stride per
batch dim (ir/attention.py Operand), so once the products are fused the copies can go:

  * an operand read from a copy that only moves elements (its body one load at an index computed
    from the output coordinates) and that nothing else reads: the attention reads the copy's source
    at the composed strides;
  * an output read only by such a copy of the same size that moves every element once (directly or
    through reshapes): the attention writes the copy's output at the composed strides, and the copy
    goes.

Strides compose where the map is affine: checked at the corners, the unit steps and random points of
the operand's index space (integer arithmetic, exact).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..ir import kernel as K
from ..ir.attention import AttentionKernel, Operand
from ..ir.graph import Graph
from ..ir.interpret import eval_at_points, run_kernel
from .fuse import drop_unused, is_gather

PROBES = 16   # random points each composed map is checked at, besides the corners and unit steps


def attention_operands(g: Graph) -> Graph:
    changed, readers = False, None
    for node in list(g.nodes):
        if node.op == "Kernel" and isinstance(node.attrs.get("kernel"), AttentionKernel):
            # the readers are worked out again only after a change (every size of a range runs this pass)
            readers = g.consumers() if readers is None else readers
            took_inputs = _inputs_through_copies(g, node, readers)   # the node's inputs: not what the output's readers are
            took_output = _output_through_copy(g, node, readers)
            if took_inputs or took_output:
                changed, readers = True, None
    return drop_unused(g) if changed else g


def _copy_of(g: Graph, name: str):
    """The pure-gather Kernel node writing `name`, or None."""
    node = g.producers().get(name)
    if node is None or node.op != "Kernel" or not isinstance(node.attrs.get("kernel"), K.Kernel):
        return None
    k = node.attrs["kernel"]
    return node if is_gather(k) and k.dtype == k.inputs[k.body.args[0]][1] else None


def _inputs_through_copies(g: Graph, node, readers: dict) -> bool:
    ak: AttentionKernel = node.attrs["kernel"]
    b = ak.batch
    extents = {0: (*b, ak.seq_q, ak.head_dim), 1: (*b, ak.seq_k, ak.head_dim), 2: (*b, ak.seq_k, ak.value_dim)}
    ops = [ak.q, ak.k, ak.v]
    inputs, names, changed = list(ak.inputs), list(node.inputs), False
    for slot in (0, 1, 2):
        name = names[slot]
        copy = _copy_of(g, name)
        if copy is None or name in g.outputs or len(readers.get(name, [])) != 1 or names.count(name) != 1:
            continue
        k = copy.attrs["kernel"]
        src_slot = k.body.args[0]
        src_shape = k.inputs[src_slot][0]

        reads = _reads_at(k)

        def at(x, op=ops[slot], size=k.size):
            return reads(_flat_unravelled(op, x, k.shape, size))
        found = _affine(at, extents[slot])
        if found is None:
            continue
        ops[slot] = Operand(*found)
        names[slot] = copy.inputs[src_slot]
        inputs[slot] = (tuple(src_shape), inputs[slot][1])
        changed = True
    if changed:
        node.inputs = names
        node.attrs["kernel"] = replace(ak, inputs=tuple(inputs), q=ops[0], k=ops[1], v=ops[2])
    return changed


def _output_through_copy(g: Graph, node, readers: dict) -> bool:
    ak: AttentionKernel = node.attrs["kernel"]
    out = node.outputs[0]
    while True:   # through reshapes (Views: the same bytes, row-major) to the one copy that reads them
        users = readers.get(out, [])
        if len(users) != 1 or out in g.outputs:
            return False
        if users[0].op != "View":
            break
        out = users[0].outputs[0]
    copy = users[0]
    if copy is not _copy_of(g, copy.outputs[0]) or copy.inputs != [out]:
        return False
    k = copy.attrs["kernel"]
    if k.size != ak.size or copy.outputs[0] in g.outputs:
        return False
    where = _inverse_permutation(_reads_at(k), k.shape) or _inverse_table(k, ak.size)
    if where is None:
        return False   # not a permutation: some element is read twice, another never
    op = ak.out

    def at(x):
        return where(op.offset + x @ np.array(op.strides, np.int64))
    found = _affine(at, (*ak.batch, ak.seq_q, ak.value_dim))
    if found is None:
        return False
    node.outputs = list(copy.outputs)
    node.origin = list(dict.fromkeys(node.origin + copy.origin))
    node.attrs["kernel"] = replace(ak, shape=tuple(k.shape), out=Operand(*found))
    g.nodes = [n for n in g.nodes if n is not copy]
    return True


def _reads_at(k: K.Kernel):
    """j -> the flat indices (in its source) that elements j ([P, rank] index rows) of a pure-gather kernel read;
    None where one lies outside or its index reads memory."""
    slot, index = k.body.args[0], k.body.args[1]
    src_shape = k.inputs[slot][0]

    def at(j):
        if j is None:
            return None
        got = eval_at_points(index, j)
        if got is None:
            return None
        try:
            return np.ravel_multi_index(got, src_shape)
        except ValueError:
            return None
    return at


def _flat_unravelled(op: Operand, x: np.ndarray, shape, size: int):
    """The index rows of the elements an operand's points x ([P, rank]) address in a buffer of this shape."""
    flat = op.offset + x @ np.array(op.strides, np.int64)
    if ((flat < 0) | (flat >= size)).any():
        return None
    return np.stack(np.unravel_index(flat, shape), axis=1)


def _inverse_permutation(reads_at, shape):
    """f -> the row-major positions of the elements that read flat indices f, where reads_at is affine (at the
    probes, as every map here) and its strides a mixed radix of the extents (every element read once: a
    transpose, a reshape); else None. Point by point: a copy after attention holds batch x seq x hidden
    elements, and a table of them cost GPT-2 most of a 64 x 512 size's compile."""
    found = _affine(reads_at, tuple(shape))
    if found is None:
        return None
    offset, strides = found
    dims = sorted((s, e, d) for d, (s, e) in enumerate(zip(strides, shape)) if e > 1)
    size = 1
    for s, e, _ in dims:
        if s != size:
            return None
        size *= e
    if offset != 0:
        return None
    row = _strides(shape)

    def where(f):
        if ((f < 0) | (f >= size)).any():
            return None
        return sum(((f // s) % e) * row[d] for s, e, d in dims) + np.zeros_like(f)
    return where


def _inverse_table(k: K.Kernel, size: int):
    """The same as _inverse_permutation for any permutation, from the whole table; None where the kernel
    reads some element twice (and another never)."""
    table = _gather_table(k, k.inputs[0][0])    # output element j of the copy reads element table[j]
    where = np.full(size, -1, np.int64)
    where[table] = np.arange(k.size)
    if (where < 0).any():
        return None
    return lambda f: None if ((f < 0) | (f >= size)).any() else where[f]


def _gather_table(k: K.Kernel, src_shape) -> np.ndarray:
    """For every element of a pure-gather kernel's output (row-major), the flat index it reads."""
    index = k.body.args[1]
    flat = K.const(0, "int64")
    for i, stride in zip(index, _strides(src_shape)):
        flat = flat + i * K.const(stride, "int64")
    return run_kernel(K.Kernel(k.shape, "int64", flat, ()), []).reshape(-1)


def _affine(at, extents):
    """(offset, strides) when at(x) = offset + Σ strides·x over the index space `extents`, else None.
    at: points [P, n] -> their values [P], or None where some point has none."""
    n = len(extents)
    units = [tuple(1 if e == d and extents[d] > 1 else 0 for e in range(n)) for d in range(n)]   # a 1: its stride is 0
    rng = np.random.default_rng(0)
    probes = [tuple(e - 1 for e in extents)] + [tuple(int(rng.integers(0, e)) for e in extents) for _ in range(PROBES)]
    probes += [tuple(extents[e] - 1 if e == d else 0 for e in range(n)) for d in range(n)]
    points = np.array([(0,) * n] + units + probes, np.int64).reshape(-1, n)
    values = at(points)
    if values is None:
        return None
    values = np.asarray(values, np.int64)
    c0 = int(values[0])
    strides = np.array([0 if extents[d] == 1 else int(values[1 + d]) - c0 for d in range(n)], np.int64)
    if (values != c0 + points @ strides).any():
        return None
    return c0, tuple(int(s) for s in strides)


def _strides(shape) -> list:
    out, acc = [0] * len(shape), 1
    for i in range(len(shape) - 1, -1, -1):
        out[i] = acc
        acc *= shape[i]
    return out


__all__ = ["attention_operands"]
