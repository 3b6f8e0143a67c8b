"""Data movement: every op here is an index remap (no arithmetic), so it folds into its consumer's
loads or, when it is still a plain reshape of a value, becomes a free View."""
from __future__ import annotations

import numpy as np

from ..ir.tensor import reshape, transpose
from . import op


@op("Reshape")
def reshape_(ctx):
    x = ctx.input(0)
    if ctx.has(1):
        shape = [int(d) for d in ctx.const(1, "shape")]
    else:  # opset < 5
        shape = list(ctx.attr("shape"))
    allowzero = ctx.attr("allowzero", 0)
    out = [x.shape[i] if d == 0 and not allowzero else d for i, d in enumerate(shape)]
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1]))
        out[out.index(-1)] = x.size // known if known else 0
    return [reshape(x, out)]


@op("Transpose")
def transpose_(ctx):
    x = ctx.input(0)
    perm = ctx.attr("perm", list(range(x.ndim))[::-1])
    return [transpose(x, perm)]
