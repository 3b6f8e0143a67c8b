"""A GEMM with few rows as one kernel: out = epilogue(prologue(A) @ Wᵀ), fp16/bf16, fp32 accumulation.

`SmallGemmKernel` is the plan's third kind of kernel (after the kernel-IR `Kernel` and the
`AttentionKernel`). At batch 1 a transformer's GEMMs have a handful of rows (GPT-2 at seq 8: 8), so
each is a stream over its weight matrix; cuBLASLt's kernels walk K serially in a few tiles there and
take 3.5-6 us where reading the weights takes 1-2. The kernel that replaces them stages A's rows in
shared memory, computing them on the way (`prologue`: the LayerNorm that produced them, now never
written to memory), and splits the weight over every warp of the GPU; the bias, the activation and
the residual are its `epilogue`. One node instead of two, and no LayerNorm round trip.

Slots (KernelStep args, in order):
    0 .. p-1   the prologue's inputs (p = len(prologue.inputs)), or A itself (p = 1) without one
    p          W, [N, K], K contiguous (a model's [K, N] weight is transposed at compile time)
    p+1 ..     the epilogue's slots 1.. (a residual [M, N], a bias [N])

    prologue   a kernel-IR Kernel over A's shape [*lead, M', K] (rows = prod(lead) * M'), each of
               its row reductions over one row; None: slot 0 is A
    epilogue   a kernel-IR Kernel over [M, N]; slot 0 is the float32 product at its index

Semantics, as both backends compute them:
    a   = prologue(slots 0..p-1) rounded to `dtype`, as [M, K]     (what the unfused graph stored)
    acc = float32(a) @ float32(W)ᵀ
    out = epilogue(acc, slots p+1..) rounded to `dtype`, stored as [M, N] (the output is contiguous)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from .. import dtypes
from .kernel import Kernel, inputs_from_json, inputs_to_json

KIND = "small_gemm"


@dataclass(frozen=True)
class SmallGemmKernel:
    shape: tuple                 # the output's shape, [*lead, N] with prod(lead) = rows
    dtype: str                   # float16 | bfloat16: A, W and out
    inputs: tuple                # (shape, dtype) per slot, as Kernel.inputs
    rows: int                    # M
    cols: int                    # N
    depth: int                   # K
    prologue: Kernel | None
    epilogue: Kernel

    kind = KIND

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def a_slots(self) -> int:
        return len(self.prologue.inputs) if self.prologue is not None else 1

    @property
    def flops(self) -> int:
        return 2 * self.rows * self.cols * self.depth

    def without_prologue(self) -> "SmallGemmKernel":
        """This GEMM reading A from memory (its prologue then a kernel of its own)."""
        if self.prologue is None:
            return self
        a = (tuple(self.prologue.shape), self.prologue.dtype)
        return replace(self, prologue=None, inputs=(a,) + tuple(self.inputs[self.a_slots:]))

    def to_json(self) -> dict:
        return {"kind": KIND, "shape": list(self.shape), "dtype": self.dtype,
                "inputs": inputs_to_json(self.inputs), "sizes": [self.rows, self.cols, self.depth],
                "prologue": self.prologue.to_json() if self.prologue is not None else None,
                "epilogue": self.epilogue.to_json()}

    @staticmethod
    def from_json(d: dict) -> "SmallGemmKernel":
        m, n, k = (int(x) for x in d["sizes"])
        return SmallGemmKernel(tuple(d["shape"]), d["dtype"], inputs_from_json(d["inputs"]),
                               m, n, k, Kernel.from_json(d["prologue"]) if d["prologue"] else None,
                               Kernel.from_json(d["epilogue"]))

    def run(self, inputs: list, out: np.ndarray | None = None) -> np.ndarray:
        from .interpret import run_kernel
        p = self.a_slots
        a = run_kernel(self.prologue, inputs[:p]) if self.prologue is not None else inputs[0]
        a = np.asarray(a).astype(dtypes.np_dtype(self.dtype)).reshape(self.rows, self.depth).astype(np.float32)
        w = np.asarray(inputs[p]).reshape(self.cols, self.depth).astype(np.float32, copy=False)
        extras = [np.asarray(x).reshape(shape) for x, (shape, _) in zip(inputs[p + 1:], self.epilogue.inputs[1:])]
        y = run_kernel(self.epilogue, [a @ w.T, *extras])
        if out is None:
            out = np.empty(self.shape, dtypes.np_dtype(self.dtype))
        out[...] = y.reshape(self.shape)
        return out
