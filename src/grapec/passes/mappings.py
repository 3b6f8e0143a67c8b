"""choose_mappings: the cost model picks each kernel's thread mapping, and with it the stitch scheme.

A kernel that stitches a row reduction into its readers (LayerNorm, softmax, a gemv with its
epilogue) can run as
  * a block per row, the row's reductions combined through shared memory (32-1024 threads);
  * a warp per row, 1-8 rows a block, reductions combined by warp shuffles;
  * a thread per element, each thread looping over its own reduction (where that loop is short,
    or a row has one column).
Each candidate is priced by the cost model (cost/model.py) with the target's device profile; the
cheapest is recorded in the kernel (Kernel.mapping), so the GPU build and the bundle agree on it.
`grapec inspect --fusion` shows the choice and the alternatives that lost (cost/report.py).
A fused attention kernel's tiling (codegen/attention.py attention_tiling) is recorded the same way.
"""
from __future__ import annotations

from dataclasses import replace

from ..cost.device import DeviceProfile
from ..cost.model import estimate, price_mappings
from ..cost.work import attention_work
from ..codegen.attention import attention_tiling
from ..codegen.launch import candidate_mappings, per_thread_for
from ..ir.attention import AttentionKernel
from ..ir.graph import Graph
from ..ir.kernel import is_kernel_node
from .choices import made_of, pinned as pinned_choice, record


TILING = "attention tiling"   # `chosen`'s key for an attention kernel's tiling: (TILING, node name)
# A size repeating its launch structure's choices takes the structure's attention tiling where the cost
# model prices it within this factor of the size's own. The tiling's warps per block follow the grid's
# fill of the SMs (heads x query tiles: a hyperbola in batch x seq), so a range of batch x seq that took
# each size's own was cut along those curves (GPT-2 batch 1:64 x seq 1:512: 78 launch structures, 66 with this).
PINNED_TILING_WITHIN = 1.10


def _tiling(k: AttentionKernel, pinned, profile: DeviceProfile) -> tuple:
    """The attention kernel's tiling: its own by its sizes (codegen/attention.py attention_tiling), or
    the pinned one where that differs only in warps per block and key tile (no key slices on either
    side: a slice of a shorter key range could be left with no keys) and is priced within
    PINNED_TILING_WITHIN of its own."""
    own = attention_tiling(k)
    if pinned is None or tuple(pinned) == own or pinned[1] != 1 or own[1] != 1:
        return own
    cost = lambda t: estimate(attention_work(replace(k, tiling=t)), profile).us   # noqa: E731
    return tuple(pinned) if cost(tuple(pinned)) <= PINNED_TILING_WITHIN * cost(own) else own


def choose_mappings(g: Graph, profile: DeviceProfile, chosen: dict | None = None) -> Graph:
    """chosen: kernel node name -> mapping, and (TILING, node name) -> a fused attention kernel's tiling
    (_tiling), filled in as they are picked; a name already in it
    keeps that mapping where it is one of the kernel's (a size of a range taking its launch
    structure's choices: compiler/structures.py). There an element-mode mapping also records the
    elements a thread computes, which a kernel's size picks (codegen/launch.py): a smaller size takes
    its structure's, so that all its sizes run one function."""
    for node in g.nodes:
        k = node.attrs.get("kernel") if node.op == "Kernel" else None
        if isinstance(k, AttentionKernel) and not k.tiling:   # its own launch, by its sizes: recorded, so
            key = (TILING, node.name)                            # that a plan names its function
            tiling = _tiling(k, pinned_choice(chosen, key, made_of(node.origin)), profile)
            record(chosen, key, tiling, made_of(node.origin))
            node.attrs["kernel"] = replace(k, tiling=tiling)
        if not is_kernel_node(node):
            continue
        candidates = candidate_mappings(k)
        pinned = pinned_choice(chosen, node.name, made_of(node.origin))
        if pinned is not None and pinned[:2] in candidates:   # repeated, not priced again
            mapping = pinned[:2]
        else:
            mapping = price_mappings(k, profile)[0][0]
        mapped = mapping if len(candidates) > 1 else k.mapping
        if mapping[0] == "element":
            per = pinned[2] if pinned is not None and pinned[:2] == mapping and len(pinned) > 2 \
                else per_thread_for(k.size)
            if per > 1:   # in the kernel (so in its plan's template: another function)
                mapped = (*mapping, per)
            mapping = (*mapping, per)
        record(chosen, node.name, mapping, made_of(node.origin))
        if mapped != k.mapping:
            node.attrs["kernel"] = replace(k, mapping=mapped)
    return g
