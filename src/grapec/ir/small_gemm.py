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
    p          W, [N, K], K contiguous (a model's [K, N] weight is transposed at compile time), or, with
               `packed` (MatMulNBits' 4-bit codes, unpacked in the kernel), its codes [N, bytes a row]
               (uint8, MatMulNBits' own bytes: low nibble first, so that the bundle stores them once for every
               kernel that reads them), scales [N, blocks] (A's type) and,
               with zero points, their uint8 nibbles [N, ceil(blocks / 2)] (none: 8)
    p+w ..     the epilogue's slots 1.. (a residual [M, N], a bias [N]); w = w_slots (1 unpacked)

    prologue   a kernel-IR Kernel over A's shape [*lead, M', K] (rows = prod(lead) * M'), each of
               its row reductions over one row; None: slot 0 is A
    epilogue   a kernel-IR Kernel over [M, N]; slot 0 is the float32 product at its index

Semantics, as both backends compute them:
    a   = prologue(slots 0..p-1) rounded to `dtype`, as [M, K]     (what the unfused graph stored)
    W   = packed: (code - zero point) * scale rounded to `dtype`   (the unfused graph's dequantized weight)
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
class PackedWeight:
    """A weight the kernel unpacks: MatMulNBits' 4-bit codes in blocks of `block` along K, with uint8 zero
    points or none (8)."""
    bits: int
    block: int
    zero_points: bool

    @property
    def slots(self) -> int:
        return 3 if self.zero_points else 2


def unpack_codes_in_order(codes: np.ndarray, depth: int) -> np.ndarray:
    """Codes [N, bytes], low nibble first -> [N, depth] uint8 in k order."""
    pairs = np.stack([codes & 15, codes >> 4], axis=-1).reshape(codes.shape[0], -1)
    return pairs[:, :depth]


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
    packed: PackedWeight | None = None
    split: bool = False          # the split form at MAX_ROWS rows or fewer (codegen/small_gemm.py is_split)

    kind = KIND

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def a_slots(self) -> int:
        return len(self.prologue.inputs) if self.prologue is not None else 1

    @property
    def w_slots(self) -> int:
        return self.packed.slots if self.packed is not None else 1

    @property
    def weight_bytes(self) -> int:
        """The bytes the weight's slots hold (codes, scales and zero points when packed)."""
        return sum(math.prod(s) * dtypes.itemsize(d) for s, d in self.inputs[self.a_slots:self.a_slots + self.w_slots])

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
        d = {"kind": KIND, "shape": list(self.shape), "dtype": self.dtype,
             "inputs": inputs_to_json(self.inputs), "sizes": [self.rows, self.cols, self.depth],
             "prologue": self.prologue.to_json() if self.prologue is not None else None,
             "epilogue": self.epilogue.to_json()}
        if self.packed is not None:
            d["packed"] = [self.packed.bits, self.packed.block, int(self.packed.zero_points)]
        if self.split:
            d["split"] = 1
        return d

    @staticmethod
    def from_json(d: dict) -> "SmallGemmKernel":
        m, n, k = (int(x) for x in d["sizes"])
        return SmallGemmKernel(tuple(d["shape"]), d["dtype"], inputs_from_json(d["inputs"]),
                               m, n, k, Kernel.from_json(d["prologue"]) if d["prologue"] else None,
                               Kernel.from_json(d["epilogue"]),
                               PackedWeight(*(int(x) for x in d["packed"][:2]), bool(d["packed"][2]))
                               if d.get("packed") else None, bool(d.get("split")))

    def run(self, inputs: list, out: np.ndarray | None = None) -> np.ndarray:
        from .interpret import run_kernel
        p = self.a_slots
        a = run_kernel(self.prologue, inputs[:p]) if self.prologue is not None else inputs[0]
        a = np.asarray(a).astype(dtypes.np_dtype(self.dtype)).reshape(self.rows, self.depth).astype(np.float32)
        w = self.unpacked(inputs[p:p + self.w_slots]) if self.packed is not None else \
            np.asarray(inputs[p]).reshape(self.cols, self.depth).astype(np.float32, copy=False)
        extras = [np.asarray(x).reshape(shape) for x, (shape, _) in
                  zip(inputs[p + self.w_slots:], self.epilogue.inputs[1:])]
        y = run_kernel(self.epilogue, [a @ w.T, *extras])
        if out is None:
            out = np.empty(self.shape, dtypes.np_dtype(self.dtype))
        out[...] = y.reshape(self.shape)
        return out

    def unpacked(self, slots: list) -> np.ndarray:
        """The packed weight's [N, K] values as the kernel computes them: (code - zero point) * scale,
        rounded to `dtype` (one rounding: the difference of two small integers is exact), as float32."""
        pw, n, depth = self.packed, self.cols, self.depth
        q = unpack_codes_in_order(np.asarray(slots[0]).reshape(n, -1), depth).astype(np.float32)
        blocks = -(-depth // pw.block)
        j = np.arange(depth) // pw.block
        scale = np.asarray(slots[1]).reshape(n, blocks).astype(np.float32)[:, j]
        if pw.zero_points:
            zp = np.asarray(slots[2]).reshape(n, -1)
            zero = np.stack([zp & 15, zp >> 4], axis=-1).reshape(n, -1)[:, j].astype(np.float32)
        else:
            zero = np.float32(1 << (pw.bits - 1))
        w = ((q - zero) * scale).astype(dtypes.np_dtype(self.dtype))
        return w.astype(np.float32)
