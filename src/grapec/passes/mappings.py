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


def choose_mappings(g: Graph, profile: DeviceProfile) -> Graph:
    for node in g.nodes:
        if not is_kernel_node(node):
            continue
        k = node.attrs["kernel"]
        if not isinstance(k, Kernel):   # a fused attention kernel has its own launch
            continue
        priced = price_mappings(k, profile)
        if len(priced) > 1:
            node.attrs["kernel"] = replace(k, mapping=priced[0][0])
    return g
