"""fuse: inline producer kernels into the kernels that consume them.

Lowering already folds index remaps (Transpose, Slice, broadcasting) into loads; this pass goes on
from there, kernel by kernel in schedule order. A load of a value that another kernel computes (also
through View/reshape nodes) is replaced by that kernel's expression at the load's index:

  * an elementwise producer is inlined when that reads no element more often than the buffer would
    be read anyway, or when it is cheap enough to recompute (a bias add feeding an im2col); a pure
    gather (a copy: slice, head split) is inlined wherever it is read, however often;
  * a producer with a reduction whose one reader reads each of its elements once takes that reader
    as its epilogue (a gemv's bias add, activation or residual add: passes/gemv.py);
  * a producer with a reduction (a LayerNorm mean, a softmax max or sum) is inlined when the
    consumer then runs in row mode (codegen/launch.py) and computes the reduction once per row with
    the whole block -- FusionStitching's "stitching" of reductions into their consumers, which makes
    LayerNorm and softmax one kernel each.

A producer whose every consumer inlined it is dropped. Library inputs (GEMM operands), graph outputs
and values read by If/Loop bodies stay materialized. Identical subexpressions are shared (the IR is
hash-consed), so a mean read by both the variance and the normalisation is computed once.
"""
from __future__ import annotations

import math
from collections import Counter

import numpy as np

from .. import dtypes
from ..codegen.launch import plan_launch
from ..codegen.vectors import PACKED_CODES, vector_loads
from ..ir import kernel as K
from ..ir.graph import Graph, outer_reads
from ..ir.interpret import eval_at_points
from ..ir.tensor import T, guard_loads, reshape
from .choices import pinned as pinned_choice, record

MAX_BODY_NODES = 3000     # keeps generated functions (and compile times) reasonable
CHEAP_OPS = 24            # an elementwise producer this small may be inlined into several consumers
RECOMPUTE_OPS = 4         # ... and one this small even where consumers read its elements repeatedly
MAX_RECOMPUTE = 64
MAX_MASK_POINTS = 1 << 16   # the most output coordinates a load's mask is evaluated at to count its reads
# A producer read by several kernels is recomputed in each only while that moves at most this many
# more bytes than writing it once and reading it back: about what one launch gap costs (2 us at
# 3 TB/s moves 6 MB). Past it, a residual add read by the next block's two branches would be
# recomputed in both, and inlined again into the block after: a ResNet stage at batch 32 read six
# earlier outputs per element where one would do.
RECOMPUTE_BYTES = 1 << 20
# A reduction stitched into its consumer runs once per row, a block per row (or a warp): with fewer
# rows than this, the consumer's work must be about the reduction's size for a block to carry it.
MIN_STITCH_ROWS = 8
# A softmax's max is read by its sum and its quotient, a LayerNorm's centred input by its variance
# and its quotient: past this many reading kernels a reduction is a shared value, not a stitch.
MAX_STITCH_READERS = 2


def fuse(g: Graph, chosen: dict | None = None) -> Graph:
    """chosen: (kernel node name, producer value) -> whether it was inlined, filled in as fusion goes;
    a pair already in it, for the same ONNX nodes, is decided as it says (a size of a range repeating its launch
    structure's fusion: compiler/structures.py, passes/choices.py)."""
    pinned_choices = dict(chosen or {})   # the choices given; `chosen` then records this graph's own
    producers = {n.outputs[0]: n for n in g.nodes if K.is_kernel_node(n)}
    view_source = {n.outputs[0]: n.inputs[0] for n in g.nodes if n.op == "View"}
    pinned = set(g.outputs)
    for n in g.nodes:
        if n.op not in ("Kernel", "View"):
            pinned.update(n.inputs)
            pinned.update(outer_reads(n))

    def root(name):
        while name in view_source:
            name = view_source[name]
        return name

    # nodes reading each value, directly or through Views; kept up to date as kernels merge (the
    # four kernels of an exported GELU read its input four times until they are one kernel)
    def reads(n):
        return {root(i) for i in set(n.inputs) | outer_reads(n) if i}
    readers = Counter(v for n in g.nodes if n.op != "View" for v in reads(n))

    for node in g.nodes:
        if not K.is_kernel_node(node):
            continue
        progress = True
        while progress:
            progress = False
            for slot, name in enumerate(node.inputs):
                src = root(name)
                p = producers.get(src)
                if p is None or p is node or _is_pinned(src, name, view_source, pinned):
                    continue
                if readers[src] > 1 and node.outputs[0] in pinned and is_gather(node.attrs["kernel"]):
                    # a copy into a library call's operand (a convolution's channels-last input): with
                    # the producer inlined, each reader would write its own copy of it, where one stored
                    # value can be read by all of them in place (passes/channels_last.py)
                    continue
                # the two ops by their own ONNX nodes (a kernel's first origin): what they inlined so far grows
                # as fusion goes, the same at every size of one structure but not in the same order
                key, ops = (node.name, src), (node.origin[:1], p.origin[:1])
                decided = pinned_choice(pinned_choices, key, ops)
                if decided is None and _index_only(p.attrs["kernel"]) and set(p.origin) <= set(node.origin):
                    # already inlined in another part of this kernel (a reduction it took in): loaded here, the
                    # kernel would hold two forms of one value, and fuse_attention takes no softmax whose score
                    # is written two ways (Wav2Vec2's arange >= 0 mask at a range's largest sizes)
                    decided = True
                fused = _try_inline(node.attrs["kernel"], list(node.inputs), slot, p.attrs["kernel"],
                                    list(p.inputs), readers[src], decided)
                record(chosen, key, fused is not None, ops)
                if fused is not None:
                    before = reads(node)
                    node.attrs["kernel"], node.inputs = fused
                    after = reads(node)
                    readers.subtract(before - after)
                    readers.update(after - before)
                    if readers[src] == 0:   # the producer is gone: its own reads go with it
                        readers.subtract(reads(p))
                    node.origin = list(dict.fromkeys(node.origin + p.origin))
                    progress = True
                    break
    return drop_unused(g)


def _is_pinned(src, name, view_source, pinned) -> bool:
    """A value that must exist in memory anyway is read, not recomputed."""
    n = name
    while True:
        if n in pinned:
            return True
        if n == src:
            return False
        n = view_source[n]


def _reads(kc: K.Kernel, slot: int, kp: K.Kernel, readers: int) -> tuple:
    """-> (the consumer's loads of the slot, the loop trips around each, how many times it reads each
    produced element, whether the producer reduces, whether it is an epilogue: the consumer reads each
    reduced element once, as a bias add or activation after a gemv)."""
    memo: dict = {}
    loads = [e for e in K.walk(kc.body) if e.op == "load" and e.args[0] == slot]
    in_loops = [math.prod(v.args[1] for v in _loop_vars(e, memo)) for e in loads]
    dup = kc.size * sum(n * _read_share(e, kc.shape) for n, e in zip(in_loops, loads)) / max(kp.size, 1)
    has_reduce = any(e.op == "reduce" for e in K.walk(kp.body))
    epilogue = has_reduce and readers == 1 and dup <= 1.01 and all(n == 1 for n in in_loops)
    return loads, in_loops, dup, has_reduce, epilogue


def _pays(kc: K.Kernel, slot: int, kp: K.Kernel, readers: int) -> bool:
    """Whether inlining producer kp into consumer kc's input `slot` saves more than it recomputes."""
    loads, in_loops, dup, has_reduce, epilogue = _reads(kc, slot, kp, readers)
    if has_reduce and dup <= 1.01 and not epilogue and kp.size > 1:
        return False   # a per-element reduction (a gemv) that several kernels read stays one kernel
    if has_reduce and not epilogue:
        if any(n > 1 for n in in_loops):
            return False   # the reduction would be redone in every iteration of the consumer's loop
        if readers > 1 and any(e.op == "reduce" and e.args[0].startswith("arg") for e in K.walk(kp.body)):
            # a decision (the next token's ArgMax over the vocabulary) read by several kernels (the
            # tokens written, the stop condition): each would redo the whole reduction (GPT-2's decode
            # step ran its 50257-logit ArgMax twice, 15 us each on an H200)
            return False
        if readers > MAX_STITCH_READERS:
            # a statistic many kernels read (the sequence lengths every layer's attention masks and
            # rotates by): computed once and read, not redone inside each of them
            return False
        if _elements_read(loads) > 1 and kp.size > 1:
            # read at several indices (a rotary embedding's x[i] and x[i ± half] of a projection's
            # output): each load would redo its own reduction, a gemv's rows computed twice
            return False
    elif not has_reduce and not is_gather(kp):
        cost = sum(1 for e in K.walk(kp.body) if e.op not in ("const", "idx", "ridx", "load"))
        # a gather through loaded indices (an embedding lookup) is a chain of dependent reads:
        # cheap in work, not in latency, so it is not repeated in every reader
        cheap = cost <= CHEAP_OPS and not _indirect(kp)
        shared = readers > 1 and _recompute_bytes(kp, readers) > RECOMPUTE_BYTES
        if shared or not ((dup <= 1.01 and (readers == 1 or cheap)) or
                          (cost <= RECOMPUTE_OPS and dup <= MAX_RECOMPUTE)):
            return False
    return True


def _try_inline(kc: K.Kernel, c_inputs: list, slot: int, kp: K.Kernel, p_inputs: list, readers: int,
                decided: bool | None = None):
    """-> (fused kernel, its input names), or None when inlining would not pay (or `decided` is False;
    True inlines whether or not it pays)."""
    if decided is False:
        return None
    stats = not decided and _statistics_into_gemv(kc, slot, kp, readers)
    if not decided and not stats and not _pays(kc, slot, kp, readers):
        return None
    view_shape = kc.inputs[slot][0]
    names = [n for i, n in enumerate(c_inputs) if i != slot]
    c_map = {i: (i if i < slot else i - 1) for i in range(len(c_inputs)) if i != slot}
    p_map = {}
    for j, n in enumerate(p_inputs):
        if n not in names:
            names.append(n)
        p_map[j] = names.index(n)
    shapes = {}
    for i, n in enumerate(c_inputs):
        if i != slot:
            shapes[c_map[i]] = kc.inputs[i]
    for j in range(len(p_inputs)):
        shapes[p_map[j]] = kp.inputs[j]

    def producer_load(ld):
        s, index, mask, other = ld.args
        return K.load(p_map[s], index, ld.dtype, mask, other)

    produced = T(kp.shape, kp.dtype, lambda ix: K.rebuild(kp.body, tuple(ix), producer_load))
    viewed = reshape(produced, view_shape)

    def consumer_load(ld):
        s, index, mask, other = ld.args
        if s != slot:
            return K.load(c_map[s], index, ld.dtype, mask, other)
        value = viewed.at(index)
        if mask is not None:
            value = K.where(mask, guard_loads(value, mask), other)
        return value

    body = K.rebuild(kc.body, None, consumer_load)
    fused = K.Kernel(kc.shape, kc.dtype, body, tuple(shapes[i] for i in range(len(names))))
    if len(K.walk(body)) > MAX_BODY_NODES:
        return None
    if decided:
        return fused, names
    if stats:
        return (fused, names) if _hoisted(fused, kc) else None
    has_reduce, epilogue = _reads(kc, slot, kp, readers)[3:]
    if has_reduce and not (epilogue and _per_element(kp)):
        # the producer's reductions are shared by a row of its elements (a norm's statistics, not a
        # gemv's dot products): they stay once per row only where the fused kernel's rows are theirs
        launch = plan_launch(fused)
        if launch.mode not in ("row", "warp") or launch.rows > _reduction_rows(kp) \
                or _reduces_within_rows(fused, launch.rows):
            return None   # the reduction would be recomputed per output element, not once per row
        longest = max(_extent(e) for e in K.walk(kp.body))
        if not epilogue and launch.rows < MIN_STITCH_ROWS and kc.size > 4 * longest * max(launch.rows, 1):
            # a few rows, each far wider than the reduction (a sum over the attention mask read by a
            # whole score matrix): a block or two would do all the consumer's work. Rows about as wide
            # as the reduction (a softmax over 2 query rows of 3 heads, a LayerNorm at seq 6) stitch.
            return None
    return fused, names


def _statistics_into_gemv(kc: K.Kernel, slot: int, kp: K.Kernel, readers: int) -> bool:
    """Is kp a row-normalised vector (an RMSNorm or LayerNorm: row statistics, then an elementwise
    form) that only kc, a memory-bound GEMV of float32 weights, reads? Inlined, each of the GEMV's warps
    computes the statistics once (they do not depend on its dot product's index: codegen/cuda.py emits
    them before the loop, `_hoisted` checks) and forms the normalised elements as its dot product reads
    them: more instructions a weight element, and one kernel and one node gap fewer.

    Only float32 weights hide those instructions. On an H200 (benchmarks/results/2026-11-29-h200-s60, one
    run each side) GPT-2's float32 decode step at seq 1 went 0.367 -> 0.332 ms with its LayerNorms in its
    GEMVs; in fp16 the same stitch made it 0.190 -> 0.200 and Llama-1B's decode step 0.921 -> 0.953 (the
    post-attention RMSNorm in the gate/up GEMV): a half weight brings half the bytes an element, so the
    GEMV issues twice the instructions a byte and the norm's own no longer hide. A GEMV of packed codes is
    bound by its instructions already (codegen/vectors.py NibbleDot)."""
    if readers != 1 or not any(e.op == "reduce" for e in K.walk(kp.body)):
        return False
    if max(kc.inputs, key=lambda i: math.prod(i[0]))[1] != "float32":   # the weight: the GEMV's largest input
        return False
    consumer, producer = plan_launch(kc), plan_launch(kp)
    if consumer.mode != "warp" or producer.mode not in ("row", "warp") or producer.rows != 1:
        return False
    reductions = [e for e in K.walk(kc.body) if e.op == "reduce"]
    if not reductions or any(kc.inputs[s][1] in PACKED_CODES for s in range(len(kc.inputs))):
        return False
    longest = max(_extent(e) for e in K.walk(kp.body))
    return all(vector_loads(kc, r.args[2], r.args[1])[0] > 1 and _extent(r) >= longest for r in reductions)


def _hoisted(fused: K.Kernel, kc: K.Kernel) -> bool:
    """Do the reductions the producer brought in read none of the consumer's loop variables (so that
    they are computed once a row, before its loop)?"""
    own = {id(e) for e in K.walk(kc.body) if e.op == "reduce"}
    brought = [e for e in K.walk(fused.body) if e.op == "reduce" and id(e) not in own]
    return bool(brought) and not any(v.op == "ridx" for e in brought for v in K.free_vars(e))


def _index_only(kernel: K.Kernel) -> bool:
    """A function of the indices alone (an arange, a mask computed from the shapes): no load, no reduction."""
    return not any(e.op in ("load", "reduce") for e in K.walk(kernel.body))


def _reduction_rows(kernel: K.Kernel) -> int:
    """How many times the kernel computes its reductions: once per row in row mode, else per element."""
    launch = plan_launch(kernel)
    return launch.rows if launch.mode in ("row", "warp") else kernel.size


def _per_element(kernel: K.Kernel) -> bool:
    """Does every reduction of the kernel depend on every index of its output (a gemv's dot
    products), so that no two elements share one?"""
    idx = [K.idx(d) for d, n in enumerate(kernel.shape) if n > 1]
    return all(all(_mentions(e, [v]) for v in idx) for e in K.walk(kernel.body) if e.op == "reduce")


def _reduces_within_rows(kernel: K.Kernel, rows: int) -> bool:
    """Does a reduction of the kernel depend on where in its row an element is? Row mode computes a
    reduction once per row only where it does not. A consumer that iterates in another order than the
    reduction's rows (the channels-last copy before a convolution, reading a GroupNorm over W: each
    row a position, the channels along it) would redo every channel's statistics for every element:
    Wav2Vec2's first convolution block took 70 ms so (H100, fp16, 1 s of audio), 3 us unfused."""
    row_len, span, inner = kernel.size // max(rows, 1), 1, []
    for d in reversed(range(len(kernel.shape))):
        if span >= row_len:
            break
        span *= kernel.shape[d]
        inner.append(K.idx(d))
    return any(e.op == "reduce" and _mentions(e, inner) for e in K.walk(kernel.body))


def _mentions(e: K.Expr, variables: list) -> bool:
    """Does expression e read any of these index variables?"""
    return any(x is v for x in K.walk(e) for v in variables)


def _elements_read(loads: list) -> int:
    """How many different elements the loads read, as far as their indices tell: a variable that
    runs over one value reads where the constant 0 does (a softmax over one key reads its max at
    [.., 0] and at [.., r] with r in 0..0)."""
    def at(e):
        return 0 if (e.op == "ridx" and e.args[1] == 1) or (e.op == "const" and e.args[0] == 0) else e
    return len({tuple(at(i) for i in ld.args[1]) for ld in loads})


def _read_share(load: K.Expr, shape: tuple) -> float:
    """The share of a kernel's elements at which a load reads: a concatenation reads each part only in its own
    range of the axis (GPT-J's rotary: its rotated quarter of a head, then the head into the key cache of 385
    positions, each 1 element in 4 or 385 of its reader). 1 where the mask is not a function of few enough of
    the output's coordinates to count (or reads memory, or a loop's index)."""
    mask = load.args[2]
    if mask is None:
        return 1.0
    axes = sorted({e.args[0] for e in K.walk(mask) if e.op == "idx"})
    extents = [shape[a] for a in axes]
    if math.prod(extents) > MAX_MASK_POINTS:
        return 1.0
    grid = np.indices(extents).reshape(len(axes), -1).T if axes else np.zeros((1, 0), np.int64)
    points = np.zeros((len(grid), len(shape)), np.int64)
    points[:, axes] = grid
    got = eval_at_points([mask], points)
    return 1.0 if got is None else float(np.count_nonzero(got[0])) / len(grid)


def _extent(e) -> int:
    """A reduce's iteration count (0 for any other node)."""
    return math.prod(r.args[1] for r in e.args[2]) if e.op == "reduce" else 0


def _recompute_bytes(kp: K.Kernel, readers: int) -> int:
    """Bytes more that recomputing kp in each of its readers moves than materializing it: each reader
    then reads kp's full-size inputs itself, against one write of kp and a read per reader."""
    full = sum(1 for shape, _ in kp.inputs if 2 * math.prod(shape) >= kp.size)
    return (readers * full - readers - 1) * kp.size * dtypes.itemsize(kp.dtype)


def _indirect(kernel: K.Kernel) -> bool:
    """Some load's index depends on another load."""
    return any(e.op == "load" and K.indirect_index(e) for e in K.walk(kernel.body))


def is_gather(kernel: K.Kernel) -> bool:
    """A kernel that only moves elements (a slice, a head split, a transpose): its body is one load at
    an index computed from the output coordinates alone. Inlining it anywhere costs index arithmetic,
    never a recomputation, and the consumer then reads the source bytes instead of a copy of them."""
    body = kernel.body
    return body.op == "load" and body.args[2] is None and not K.indirect_index(body)


def _loop_vars(e, memo):
    return [v for v in K.free_vars(e, memo) if v.op == "ridx"]


def drop_unused(g: Graph) -> Graph:
    """Remove Kernel/View nodes nothing needs (reachability from the outputs and the nodes that
    always stay, so it does not depend on the node order)."""
    producer = {o: n for n in g.nodes for o in n.outputs if o}
    needed, stack = set(), [n for n in g.nodes if n.op not in ("Kernel", "View")]
    stack += [producer[o] for o in g.outputs if o in producer]
    while stack:
        n = stack.pop()
        if id(n) in needed:
            continue
        needed.add(id(n))
        for i in list(n.inputs) + sorted(outer_reads(n)):
            if i in producer:
                stack.append(producer[i])
    g.nodes = [n for n in g.nodes if id(n) in needed]
    return g
