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
from ..cost.model import price_mappings
from ..codegen.attention import attention_tiling
from ..codegen.launch import candidate_mappings, per_thread_for
from ..ir.attention import AttentionKernel
from ..ir.graph import Graph
from ..ir.kernel import is_kernel_node


def choose_mappings(g: Graph, profile: DeviceProfile, chosen: dict | None = None) -> Graph:
    """chosen: kernel node name -> mapping, filled in as the mappings are picked; a name already in it
    keeps that mapping where it is one of the kernel's (a size of a range taking its launch
    structure's choices: compiler/structures.py). There an element-mode mapping also records the
    elements a thread computes, which a kernel's size picks (codegen/launch.py): a smaller size takes
    its structure's, so that all its sizes run one function."""
    for node in g.nodes:
        k = node.attrs.get("kernel") if node.op == "Kernel" else None
        if isinstance(k, AttentionKernel) and not k.tiling:   # its own launch, by its sizes: recorded, so
            node.attrs["kernel"] = replace(k, tiling=attention_tiling(k))   # that a plan names its function
        if not is_kernel_node(node):
            continue
        candidates = candidate_mappings(k)
        pinned = chosen.get(node.name) if chosen is not None else None
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
        if chosen is not None:
            chosen[node.name] = mapping
        if mapped != k.mapping:
            node.attrs["kernel"] = replace(k, mapping=mapped)
    return g
