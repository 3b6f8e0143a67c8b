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
"""
from __future__ import annotations

from dataclasses import replace

from ..cost.device import DeviceProfile
from ..cost.model import price_mappings
from ..ir.graph import Graph
from ..ir.kernel import Kernel, is_kernel_node


def choose_mappings(g: Graph, profile: DeviceProfile, chosen: dict | None = None) -> Graph:
    """chosen: kernel node name -> mapping, filled in as the mappings are picked; a name already in it
    keeps that mapping where it is one of the kernel's (a size of a range taking its launch
    structure's choices: compiler/structures.py)."""
    for node in g.nodes:
        if not is_kernel_node(node):
            continue
        k = node.attrs["kernel"]
        if not isinstance(k, Kernel):   # a fused attention kernel has its own launch
            continue
        priced = price_mappings(k, profile)
        if len(priced) > 1:
            mapping = priced[0][0]
            if chosen is not None:
                pinned = chosen.get(node.name)
                if pinned is not None and any(m == pinned for m, *_ in priced):
                    mapping = pinned
                chosen[node.name] = mapping
            node.attrs["kernel"] = replace(k, mapping=mapping)
    return g
