"""What the windowed ops share (convolution, pooling) and the masked reads other NN ops use too:
strides, dilations and explicit pads with auto_pad resolved, and loads masked past a tensor's edge."""
from __future__ import annotations

import math

import numpy as np

from .. import dtypes
from ..ir import kernel as K
from ..ir.tensor import guard_loads


def _and(a, b):
    return b if a is None else K.binary("and", a, b)


def _masked_at(t, index, valid, fill):
    """t[index] where `valid`, else `fill`; every load underneath is masked so nothing reads
    out of bounds."""
    if valid is None:
        return t.at(index)
    return K.where(valid, guard_loads(t.at(index), valid), fill)


def _lowest(dtype):
    if dtypes.is_int(dtype):
        return int(np.iinfo(dtypes.np_dtype(dtype)).min)
    if dtype == "bool":
        return False
    return -math.inf


def _acc_dtype(dtype):
    return dtypes.accumulation(dtype)


def _ints(v, n, default):
    return [int(a) for a in v] if v else [default] * n


def _same_pads(auto_pad, in_sp, ext, strides):
    """SAME_UPPER/SAME_LOWER: output ceil(in/stride), total pad split with the odd one at the end
    (UPPER) or the beginning (LOWER). Returns pads (begin.., end..)."""
    nd = len(in_sp)
    pads = [0] * (2 * nd)
    for i in range(nd):
        out = -(-in_sp[i] // strides[i])
        total = max(0, (out - 1) * strides[i] + ext[i] - in_sp[i])
        small = total // 2
        pads[i] = small if auto_pad == "SAME_UPPER" else total - small
        pads[i + nd] = total - pads[i]
    return pads


def _window_params(ctx, in_sp, kernel):
    """strides, dilations, explicit pads (auto_pad resolved), window extents."""
    nd = len(in_sp)
    strides = _ints(ctx.attr("strides"), nd, 1)
    dil = _ints(ctx.attr("dilations"), nd, 1)
    ext = [(kernel[i] - 1) * dil[i] + 1 for i in range(nd)]
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = _same_pads(auto_pad, in_sp, ext, strides)
    elif auto_pad == "VALID":
        pads = [0] * (2 * nd)
    elif auto_pad in ("NOTSET", ""):
        pads = _ints(ctx.attr("pads"), 2 * nd, 0)
    else:
        ctx.fail(f"auto_pad={auto_pad!r} is not supported")
    return strides, dil, pads, ext
