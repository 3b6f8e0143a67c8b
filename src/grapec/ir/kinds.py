"""The plan's kinds of kernel, told apart by the "kind" of their JSON entry in a bundle:

    (none)        Kernel            kernel IR (ir/kernel.py), rendered by codegen/cuda.py
    attention     AttentionKernel   softmax(q kᵀ) v as one kernel (ir/attention.py)
    small_gemm    SmallGemmKernel   a few-row GEMM with its prologue and epilogue (ir/small_gemm.py)
    nonzero       NonZeroKernel     the coordinates of a tensor's non-zeros, padded to a bound (ir/selection.py)
    nms           NmsKernel         non-max suppression per batch and class, padded to a bound (ir/selection.py)
    nms_mask      NmsMaskKernel     which candidates each would suppress, for the GPU's NMS (ir/selection.py)
    topk          TopKKernel        the indices of the k best along an axis, k read at run time (ir/selection.py)

All but the first carry numpy semantics of their own (`run`), which the CPU backend executes.
"""
from __future__ import annotations

from .attention import AttentionKernel
from .kernel import Kernel
from .selection import NmsKernel, NmsMaskKernel, NonZeroKernel, TopKKernel
from .small_gemm import SmallGemmKernel

KINDS = {k.kind: k for k in (AttentionKernel, SmallGemmKernel, NonZeroKernel, NmsKernel, NmsMaskKernel,
                                     TopKKernel)}


def kernel_from_json(d: dict):
    """A bundle's kernel entry -> Kernel or one of KINDS."""
    kind = KINDS.get(d.get("kind"))
    return kind.from_json(d) if kind else Kernel.from_json(d)
