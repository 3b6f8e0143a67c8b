"""weights_as_nk: a matmul's constant weight stored [K, N] is read as [N, K] (trans_b) instead.

Used when one bundle holds several buckets (a --dynamic range, --bucket lists). The kernels that
replace a GEMM at few rows want the weight K-contiguous, [N, K] (passes/gemv.py, passes/small_gemm.py),
and make a transposed copy of a weight stored [K, N]; cuBLASLt, which the larger buckets keep, reads
either layout. Without this pass a range over seq 1..512 stores GPT-2's linear weights twice: the
small sizes' copies and the large sizes' originals (fp16: 483 MiB of weights instead of 325 MiB).
Transposing once, the same way in every bucket, gives byte-identical constants that the weight store
keeps once, and the few-row passes find the layout they want already there.
"""
from __future__ import annotations

import numpy as np

from ..ir.derived import derived
from ..ir.graph import Graph, view_source


def weights_as_nk(g: Graph) -> Graph:
    source = view_source(g)
    consumers = g.consumers()
    for node in g.nodes:
        attrs = node.attrs
        if node.op != "Library" or attrs.get("op") != "matmul" or attrs.get("trans_b") or attrs.get("views"):
            continue
        b = g.lookup(node.inputs[1])
        w = g.lookup(source(node.inputs[1]))
        if w is None or w.const is None or len(b.shape) != 2:
            continue
        if len(consumers.get(w.name, ())) > 1 or w.name in g.outputs:
            continue   # another reader wants the stored layout: a copy would not replace it
        weight = np.asarray(w.const).reshape(b.shape)
        inputs = list(node.inputs)
        nk = derived(f"nk{weight.shape}", (w.const,), lambda: np.ascontiguousarray(weight.T))
        inputs[1] = g.add_value(f"{w.name}_nk", b.dtype, weight.shape[::-1], nk).name
        node.inputs = inputs
        node.attrs = dict(attrs, trans_b=1)
    return g
