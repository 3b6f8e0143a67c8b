"""aligned_rows: GEMM rows padded to 16 bytes, through the kernels that write and read them.

cuBLASLt's tensor-core kernels want every operand's rows to start on 16 bytes; with other leading
dimensions it takes slow paths. Odd widths are common: GPT-2's 50257 logits, and every convolution
on a 14x14 or 7x7 image (196 and 49 columns of [C, H*W]), where ResNet-50 spent 219 of its 430 us of
kernel time on an H100 in unaligned GEMMs.

For a matmul whose output rows are not a multiple of 16 bytes, the pass gathers its *row group*:
the values that must share the padded row so that no copy is needed.
  * The output, and the B operand when B is not transposed (its rows are the output's columns).
  * Views of those that keep the rows: they may reshape the dims before the row or split the row
    into trailing dims, as a convolution's [C, H*W] output is the next layer's [1, C, H, W].
  * The kernel that writes a value of the group then writes padded rows (the tail masked to zero);
    an im2col kernel or the ReLU before a 1x1 convolution.
  * A kernel that reads one reads the padded buffer (its loads re-indexed). A matmul that reads one
    as B computes the padded width too, so its output (and its C) joins the group.
  * A constant gets zero columns (a transposed constant B, zero rows).
Every value of the group is then stored as [lead dims.., padded row]. Where the group reaches
anything else (a graph output, an attention kernel, a region, a matmul reading it as A), it is
tried again without the starting matmul's B: the GEMM then writes its odd width through an output
view into padded rows, when the readers alone allow it. A GEMM whose output is a graph output (with
COPY_OUTPUT_FROM_ROWS rows or more) writes padded rows, and the output is those rows' leading
columns (a View with a pitch: the runtimes compact them on the way out, as the copy to the host
or to a caller's buffer is made, and hand device arrays out strided, as torch.compile does); where
the GEMM cannot compute the padded width itself, one copy kernel compacts them inside the graph.
Otherwise nothing changes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .. import dtypes
from ..ir import kernel as K
from ..ir.derived import derived
from ..ir.graph import Graph, Node
from ..ir.tensor import substitute_loads, unravel
from .choices import made_of, pinned, record


def aligned_rows(g: Graph, chosen: dict | None = None) -> Graph:
    """chosen: matmul node name -> whether its row group was padded, filled in as the pass goes. A
    name recorded as padded is padded again where its rows happen to be aligned (to their own width),
    so that the sizes of a range whose widths follow a length (Wav2Vec2's frames) keep one structure
    instead of one per remainder (compiler/structures.py repeats the largest size's choices, for the same ONNX
    nodes: passes/choices.py)."""
    for node in list(g.nodes):
        if not _is_matmul(node) or "out" in (node.attrs.get("views") or {}):
            continue
        out = g.lookup(node.outputs[0])
        per_vector = 16 // dtypes.itemsize(out.dtype)
        width = out.shape[-1] if len(out.shape) >= 2 else 0
        if not width:
            continue
        if width % per_vector == 0:
            group = _group_of(g, node, width) if pinned(chosen, node.name, made_of(node.origin)) else None
            if group is not None:
                _pad(g, group, width, width, node)
            continue
        cols = -(-width // per_vector) * per_vector
        group = _group_of(g, node, width)
        copy = None
        reached = _graph_output_of(g, node.outputs[0]) if group is None else None
        if reached and math.prod(out.shape[:-1]) >= COPY_OUTPUT_FROM_ROWS:
            if _output_in_padded_rows(g, node, width, cols):
                continue
            copy = _output_through_copy(g, reached)
            group = _group_of(g, node, width)
        record(chosen, node.name, group is not None, made_of(node.origin))
        if group is not None:
            _pad(g, group, width, cols, node)
        elif copy is not None:
            _undo_copy(g, copy)
    return g


# A graph output of odd width that no reader could take padded: the GEMM writes padded rows and one
# copy kernel writes the output. At GPT-2's LM head with half outputs (2048 x 50257 x 768, H100)
# cuBLASLt took 746 us for the odd width, 14% of peak. Under this many rows the GEMM reads its
# weight more than it computes, and the extra node is not known to pay: unmeasured, left as is.
COPY_OUTPUT_FROM_ROWS = 64


def _group_of(g: Graph, node: Node, width: int):
    group = _row_group(g, node, width, through_b=True)
    if group is None and not (len(node.inputs) > 2 and node.inputs[2]):   # cuBLASLt: no C with an output view
        group = _row_group(g, node, width, through_b=False)
    return group


def _graph_output_of(g: Graph, name: str) -> str | None:
    """The graph output that `name` is, or that a view of it is; None."""
    readers, todo = g.consumers(), [name]
    while todo:
        n = todo.pop()
        if n in g.outputs:
            return n
        todo += [u.outputs[0] for u in readers.get(n, []) if u.op == "View"]
    return None


def _output_in_padded_rows(g: Graph, mm: Node, width: int, cols: int) -> bool:
    """When mm's output reaches a graph output through Views alone, and nothing else reads them: mm
    computes cols columns into a value of its own, and the output is a View of it with pitch cols
    (no copy in the graph: GPT-2 b16's logits copy took 178 us on an H100). -> whether it did."""
    ins = list(mm.inputs) + [""] * (4 - len(mm.inputs))
    b = g.lookup(ins[1])
    if ins[2] or not _computes_padded(g, mm) or (not mm.attrs.get("trans_b") and b.const is None):
        return False
    readers, chain = g.consumers(), [mm.outputs[0]]
    while chain[-1] not in g.outputs:
        users = readers.get(chain[-1], [])
        if len(users) != 1 or users[0].op != "View":
            return False
        chain.append(users[0].outputs[0])
    output = g.lookup(chain[-1])
    if readers.get(chain[-1]) or g.outputs.count(chain[-1]) != 1 or output.shape[-1] != width:
        return False
    x = g.lookup(mm.outputs[0])
    if not mm.attrs.get("trans_b"):   # a constant [.., K, N] weight gets zero columns
        ins[1] = g.add_value(f"{ins[1]}_cols", b.dtype, (*b.shape[:-1], cols),
                             _padded(b.const, b.shape, [(0, 0)] * (len(b.shape) - 1) + [(0, cols - width)])).name
        mm.inputs = ins[:len(mm.inputs)]
    _pad_transposed_weight_and_bias(g, mm, cols)
    rows = g.add_value(f"{chain[-1]}_rows", x.dtype, (*x.shape[:-1], cols)).name
    g.nodes = [n for n in g.nodes if not (n.op == "View" and n.outputs[0] in chain)]
    mm.outputs = [rows]
    g.nodes.insert(g.nodes.index(mm) + 1, Node("View", [rows], [chain[-1]], name=f"{chain[-1]}/padded_rows",
                                               attrs={"pitch": cols}, origin=list(mm.origin)))
    return True


def _output_through_copy(g: Graph, output: str) -> list:
    """The producer of graph output `output` writes a value of its own, and a copy kernel writes the
    output from it, as [rows, width] between two views: a 2-D copy divides each index once (a 3-D
    one, GPT-2's [16, 128, 50257] logits, took 253 us against 178 for [2048, 50257] on an H100).
    -> the nodes added."""
    from .build_plan import copy_kernel
    producer = g.producers()[output]
    out = g.lookup(output)
    flat = (math.prod(out.shape[:-1]), out.shape[-1])
    inner = g.add_value(f"{output}_padded", out.dtype, out.shape).name
    added, src, dst = [], inner, output
    if len(out.shape) != 2:
        src = g.add_value(f"{output}_padded_2d", out.dtype, flat).name
        dst = g.add_value(f"{output}_2d", out.dtype, flat).name
        added.append(Node("View", [inner], [src], name=f"{output}/aligned_copy_in", origin=list(producer.origin)))
    added.append(Node("Kernel", [src], [dst], name=f"{output}/aligned_copy", origin=list(producer.origin),
                      attrs={"kernel": copy_kernel(flat, out.dtype)}))
    if dst != output:
        added.append(Node("View", [dst], [output], name=f"{output}/aligned_copy_out", origin=list(producer.origin)))
    at = g.nodes.index(producer) + 1
    g.nodes[at:at] = added
    producer.outputs = [inner if o == output else o for o in producer.outputs]
    return added


def _undo_copy(g: Graph, added: list):
    inner, output = added[0].inputs[0], added[-1].outputs[0]
    producer = g.producers()[inner]
    for n in added:
        g.nodes.remove(n)
    producer.outputs = [output if o == inner else o for o in producer.outputs]


def _is_matmul(node: Node) -> bool:
    return node.op == "Library" and node.attrs.get("op") == "matmul"


def _lead(shape: tuple, width: int) -> tuple | None:
    """The dims before the row: shape = lead + tail with prod(tail) == width (the shortest tail)."""
    for n in range(1, len(shape) + 1):
        if math.prod(shape[-n:]) == width:
            return tuple(shape[:-n])
        if math.prod(shape[-n:]) > width:
            return None
    return None


@dataclass
class RowGroup:
    """Values stored with one padded row, and the GEMMs that compute it."""
    lead: dict = field(default_factory=dict)     # value name -> its dims before the row
    gemms: list = field(default_factory=list)    # matmuls that compute the padded width
    view_gemm: Node | None = None                # the matmul writing its odd width through an output view


def _row_group(g: Graph, start: Node, width: int, through_b: bool) -> RowGroup | None:
    producers, readers = g.producers(), g.consumers()
    group = RowGroup()
    todo = [start.outputs[0]]
    if through_b:
        if not _computes_padded(g, start):
            return None
        group.gemms.append(start)
        todo += _row_operands(start)
    else:
        group.view_gemm = start
    while todo:
        name = todo.pop()
        if name in group.lead:
            continue
        v = g.lookup(name)
        lead = _lead(v.shape, width) if v.shape else None
        if lead is None or name in g.outputs or name in g.inputs:
            return None
        group.lead[name] = lead
        p = producers.get(name)
        if p is None:
            if v.const is None:
                return None
        elif p.op == "View":
            todo.append(p.inputs[0])
        elif _is_matmul(p) and p.outputs[0] == name:
            if p is not start and p not in group.gemms:
                return None     # a GEMM writing a row of the group must be one computing the padded width
        elif not (p.op == "Kernel" and isinstance(p.attrs["kernel"], K.Kernel)):
            return None
        for u in readers.get(name, []):
            if u.op == "View":
                todo.append(u.outputs[0])
            elif u.op == "Kernel" and isinstance(u.attrs["kernel"], K.Kernel):
                if any(s != tuple(g.lookup(i).shape) for s, i in zip((s for s, _ in u.attrs["kernel"].inputs), u.inputs)
                       if i == name):
                    return None
            elif _is_matmul(u) and u is not start and _computes_padded(g, u) and name in _row_operands(u):
                if u not in group.gemms:
                    group.gemms.append(u)
                    todo += [u.outputs[0]] + _row_operands(u)
            elif not (u is start and through_b and name in _row_operands(start)):
                return None
    gemm_rows = [i for mm in group.gemms for i in [mm.outputs[0]] + _row_operands(mm)]
    if any(g.lookup(i).shape[-1] != width for i in gemm_rows) \
            or any(mm.inputs[0] in group.lead for mm in group.gemms + [start]):
        return None     # a GEMM must see the row as its last dim, and never read it as A
    return group


def _row_operands(mm: Node) -> list:
    """The operands of mm whose rows are its output's: B untransposed, and C."""
    ins = list(mm.inputs) + [""] * (3 - len(mm.inputs))
    return [i for i in ([] if mm.attrs.get("trans_b") else [ins[1]]) + [ins[2]] if i]


def _computes_padded(g: Graph, mm: Node) -> bool:
    """mm can compute the padded width: no views, a constant bias, B not transposed or constant."""
    views = mm.attrs.get("views") or {}
    if "1" in views or "out" in views:
        return False
    ins = list(mm.inputs) + [""] * (4 - len(mm.inputs))
    if ins[3] and g.lookup(ins[3]).const is None:
        return False
    b = g.lookup(ins[1])
    return not mm.attrs.get("trans_b") or (b.const is not None and len(b.shape) == 2)


def _padded(const, shape: tuple, widths: list) -> np.ndarray:
    """const as `shape`, zero-padded by `widths`: made once per compile (ir/derived.py). Each size of a range pads
    GPT-2's 77 MiB token table again otherwise, and the bundle's weight store then compares every copy's bytes
    with the first's (1067 sizes in its 2-D range)."""
    return derived(f"pad{tuple(shape)}{widths}", (const,), lambda: np.pad(np.asarray(const).reshape(shape), widths))


def _pad(g: Graph, group: RowGroup, width: int, cols: int, start: Node):
    new = {}
    for name, lead in group.lead.items():
        v = g.lookup(name)
        const = None
        if v.const is not None:
            const = _padded(v.const, (*lead, width), [(0, 0)] * len(lead) + [(0, cols - width)])
        new[name] = g.add_value(f"{name}_rows", v.dtype, (*lead, cols), const).name
    for mm in group.gemms:
        _pad_transposed_weight_and_bias(g, mm, cols)
    if group.view_gemm is not None:
        out = g.lookup(start.outputs[0])
        start.attrs = dict(start.attrs, views={**(start.attrs.get("views") or {}),
                                               "out": [0, out.shape[-2] * cols, cols, list(out.shape)]})
    for node in g.nodes:
        touched = [s for s, i in enumerate(node.inputs) if i in new]
        writes = bool(node.outputs) and node.outputs[0] in new
        if not touched and not writes:
            continue
        if K.is_kernel_node(node):
            k = node.attrs["kernel"]
            slots = {s: len(group.lead[node.inputs[s]]) for s in touched}
            out_lead = len(group.lead[node.outputs[0]]) if writes else None
            node.attrs = dict(node.attrs, kernel=_padded_kernel(k, slots, out_lead, width, cols))
        node.inputs = [new.get(i, i) for i in node.inputs]
        node.outputs = [new.get(o, o) for o in node.outputs]


def _pad_transposed_weight_and_bias(g: Graph, mm: Node, cols: int):
    """The GEMM's other operands of the padded width: a transposed constant B ([N, K] stored) gets
    zero rows and a bias zero entries (B untransposed and C are values of the group)."""
    ins = list(mm.inputs) + [""] * (4 - len(mm.inputs))
    if mm.attrs.get("trans_b"):
        b = g.lookup(ins[1])
        padded = g.add_value(f"{ins[1]}_rows", b.dtype, (cols, b.shape[1]),
                             _padded(b.const, b.shape, [(0, cols - b.shape[0]), (0, 0)])).name
        _share_padded_weight(g, ins[1], padded, mm)
        ins[1] = padded
    if ins[3]:
        bias = g.lookup(ins[3])
        size = math.prod(bias.shape)
        ins[3] = g.add_value(f"{ins[3]}_rows", bias.dtype, (cols,), _padded(bias.const, (size,), [(0, cols - size)])).name
    mm.inputs = ins[:len(mm.inputs)]


def _share_padded_weight(g: Graph, weight: str, padded: str, mm: Node):
    """The padded [N+pad, K] weight begins with the [N, K] original's bytes, so kernels reading the
    original (a tied embedding's Gather: GPT-2's lm_head is its token table) read the padded one
    with the same addresses, and the original need not be stored too (77 MiB in GPT-2 fp16). Only
    when every other reader is such a kernel; otherwise both stay."""
    readers = [u for u in g.consumers().get(weight, []) if u is not mm]
    if not readers or weight in g.outputs \
            or not all(u.op == "Kernel" and isinstance(u.attrs["kernel"], K.Kernel) for u in readers):
        return
    shape = g.lookup(padded).shape
    for u in readers:
        k = u.attrs["kernel"]
        inputs = tuple((shape, dt) if name == weight else (s, dt) for name, (s, dt) in zip(u.inputs, k.inputs))
        u.attrs = dict(u.attrs, kernel=K.Kernel(k.shape, k.dtype, k.body, inputs, k.mapping))
        u.inputs = [padded if i == weight else i for i in u.inputs]


def _padded_kernel(k: K.Kernel, slots: dict, out_lead: int | None, width: int, cols: int) -> K.Kernel:
    """k reading the given input slots as [lead.., cols] rows (slot -> len(lead)) and, when out_lead
    is given, writing its output as [lead.., cols], the tail zero."""
    inputs = list(k.inputs)
    body = k.body
    if slots:
        def reindex(ld: K.Expr) -> K.Expr:
            slot, ix, mask, other = ld.args
            if slot not in slots:
                return ld
            n = slots[slot]
            row = _flat(ix[n:], k.inputs[slot][0][n:])
            return K.load(slot, (*ix[:n], row), ld.dtype, mask, other)
        body = K.rebuild(body, None, reindex)
        for s, n in slots.items():
            inputs[s] = ((*k.inputs[s][0][:n], cols), k.inputs[s][1])
    shape = k.shape
    if out_lead is not None:
        j = K.idx(out_lead)
        index = tuple(K.idx(a) if d != 1 else K.const(0, "int64") for a, d in enumerate(k.shape[:out_lead]))
        body = K.rebuild(body, index + unravel(j, k.shape[out_lead:]))
        inside = K.binary("lt", j, K.const(width, "int64"))
        body = K.where(inside, _guard_row_loads(body, j, inside), K.const(0, k.dtype))
        shape = (*k.shape[:out_lead], cols)
    return K.Kernel(tuple(shape), k.dtype, body, tuple(inputs), k.mapping)


def _guard_row_loads(body: K.Expr, j: K.Expr, inside: K.Expr) -> K.Expr:
    """Mask the loads whose address moves with the padded coordinate j; the others (a row
    statistic reduced over another axis, say) stay unmasked, so they stay hoistable."""
    def f(ld: K.Expr) -> K.Expr:
        if j not in K.free_vars(ld):
            return ld
        slot, index, mask, other = ld.args
        return K.load(slot, index, ld.dtype, inside if mask is None else K.binary("and", mask, inside), other)
    return substitute_loads(body, f)


def _flat(ix: tuple, dims: tuple) -> K.Expr:
    flat = K.const(0, "int64")
    for i, d in zip(ix, dims):
        flat = flat * d + i
    return flat
