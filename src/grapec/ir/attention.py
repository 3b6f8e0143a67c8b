"""Attention as one kernel: out = softmax(score(q @ kᵀ)) @ v, with the softmax over the key axis.

`AttentionKernel` is the plan's second kind of kernel (the first is a kernel-IR `Kernel`). A
KernelStep runs it like any kernel: slots 0, 1, 2 are the buffers holding q, k and v, slots 3.. the
extra inputs of the score (a mask, a bias), and the step's output buffer receives the result.

    q      [*batch, S, D]   read through `Operand` strides (a head of a fused QKV buffer, in place)
    k      [*batch, T, D]
    v      [*batch, T, Dv]
    out    [*batch, S, Dv]  written through strides (merged heads, in place)
    score  a kernel-IR Kernel over [*batch, S, T]: slot 0 is the raw product (q @ kᵀ) * alpha at the
           kernel's own index, slots 1.. are the attention's slots 3..; it holds what the exporter put
           between the two products (a scale, an additive mask, a Where on a boolean mask)

Semantics, as both backends compute them (flash attention's, so they agree on masked rows too):

    x[.., i, j] = score(raw)                      computed in float32
    m = max_j x;  m = 0 where m is -inf           (a fully masked row gives 0 / 0 = NaN, as ONNX's
    p = exp(x - m);  l = sum_j p                   Softmax of all -inf does)
    out = (round(p) @ v) / l                      p rounded to the element type for the second product

The GPU renders it as one flash-attention kernel on tensor cores (codegen/attention.py); here it is
numpy, the reference that kernel is checked against and what the CPU backend runs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import dtypes
from .kernel import Kernel, inputs_from_json, inputs_to_json
from .library import flash_softmax_product, strided

KIND = "attention"


@dataclass(frozen=True)
class Operand:
    """Element (*b, r, c) of a [*batch, rows, cols] operand sits at offset + Σ b·batch + r·row + c·col
    elements into its buffer (stride 0 broadcasts a dimension)."""
    offset: int
    strides: tuple   # one per batch dim, then the row stride, then the column stride

    def view(self, buf: np.ndarray, shape: tuple) -> np.ndarray:
        return strided(buf, self.offset, shape, self.strides)

    def to_json(self) -> list:
        return [self.offset, list(self.strides)]

    @staticmethod
    def from_json(row) -> "Operand":
        return Operand(int(row[0]), tuple(int(s) for s in row[1]))


@dataclass(frozen=True)
class AttentionKernel:
    shape: tuple      # the output buffer's shape (out's strides say where each element goes)
    dtype: str        # float16 | bfloat16: q, k, v and out
    inputs: tuple     # (shape, dtype) per slot, as Kernel.inputs: q, k, v buffers, then the score's extras
    batch: tuple
    seq_q: int
    seq_k: int
    head_dim: int
    value_dim: int
    q: Operand
    k: Operand
    v: Operand
    out: Operand
    score: Kernel
    # keys j > i + causal_offset are hidden by the score (a causal mask, passes/causal_mask.py): the
    # GPU kernel skips the key tiles past its queries' last visible key. The score still masks within
    # a tile, so the semantics (and the CPU backend) are the same with or without it.
    causal_offset: int | None = None
    # (warps per query tile, key slices, keys per warp per step) once chosen (passes/mappings.py), so
    # that the plan, and a range's structure of plans, names the GPU function it runs; empty: the
    # default rules pick by the sizes (codegen/attention.py attention_tiling). The CPU backend ignores it.
    tiling: tuple = ()

    kind = KIND

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def flops(self) -> int:
        return 2 * math.prod(self.batch) * self.seq_q * self.seq_k * (self.head_dim + self.value_dim)

    def to_json(self) -> dict:
        return {"kind": KIND, "shape": list(self.shape), "dtype": self.dtype,
                "inputs": inputs_to_json(self.inputs), "batch": list(self.batch),
                "sizes": [self.seq_q, self.seq_k, self.head_dim, self.value_dim],
                "operands": [o.to_json() for o in (self.q, self.k, self.v, self.out)],
                "score": self.score.to_json(),
                **({"causal_offset": self.causal_offset} if self.causal_offset is not None else {}),
                **({"tiling": list(self.tiling)} if self.tiling else {})}

    @staticmethod
    def from_json(d: dict) -> "AttentionKernel":
        s, t, dq, dv = (int(x) for x in d["sizes"])
        q, k, v, out = (Operand.from_json(o) for o in d["operands"])
        return AttentionKernel(tuple(d["shape"]), d["dtype"], inputs_from_json(d["inputs"]),
                               tuple(int(b) for b in d["batch"]), s, t, dq, dv, q, k, v, out,
                               Kernel.from_json(d["score"]), d.get("causal_offset"),
                               tuple(int(n) for n in d.get("tiling", ())))

    def run(self, inputs: list, out: np.ndarray | None = None) -> np.ndarray:
        from .interpret import run_kernel
        if out is None:
            out = np.zeros(self.shape, dtypes.np_dtype(self.dtype))
        b, s, t = self.batch, self.seq_q, self.seq_k
        q = self.q.view(inputs[0], (*b, s, self.head_dim)).astype(np.float32)
        k = self.k.view(inputs[1], (*b, t, self.head_dim)).astype(np.float32)
        v = self.v.view(inputs[2], (*b, t, self.value_dim)).astype(np.float32)
        raw = (q @ np.swapaxes(k, -1, -2)).astype(self.score.inputs[0][1])
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            x = run_kernel(self.score, [raw, *inputs[3:]]).astype(np.float32)
        o = flash_softmax_product(x, v, dtypes.np_dtype(self.dtype))
        self.out.view(out, (*b, s, self.value_dim))[...] = o.astype(out.dtype)
        return out
