"""What the CUDA backend can run, decided at compile time from the plan alone.

Kernel steps always can (every kernel-IR op renders to CUDA C). Library steps are the gap: the
GPU runs `matmul` through cuBLASLt and `conv` and `sdpa` through cuDNN, on floating-point data only. The compiler refuses a bundle with
GPU code whose plan has a step outside this (or, with --no-gpu, marks the bundle CPU-only), so a
bundle never fails at load for want of a GPU implementation.
"""
from __future__ import annotations

from ..plan import LibraryStep, walk_steps

# op -> operand dtypes the GPU library takes here: cuBLASLt (matmul), cuDNN (conv, sdpa)
GPU_LIBRARY = {"matmul": {"float32", "float16", "bfloat16", "float64"}, "conv": {"float32", "float16", "bfloat16"},
               "sdpa": {"float16", "bfloat16"}}


def library_gap(op: str, dtype: str) -> str | None:
    """Why a library op on operands of `dtype` cannot run on the GPU, or None if it can."""
    if op not in GPU_LIBRARY:
        return f"library op '{op}' has no GPU implementation"
    if dtype not in GPU_LIBRARY[op]:
        return f"library op '{op}' on {dtype} has no GPU implementation (it takes {', '.join(sorted(GPU_LIBRARY[op]))})"
    return None


def gpu_gaps(plans: list) -> list:
    """One line per distinct gap, naming the ONNX nodes it comes from."""
    found: dict = {}
    for plan in plans:
        for st in walk_steps(plan.steps):
            if isinstance(st, LibraryStep):
                why = library_gap(st.attrs["op"], plan.buffers[st.args[0]].dtype)
                if why:
                    found.setdefault(why, set()).update(st.origin)
    return [f"{why}: ONNX node(s) {', '.join(sorted(nodes)[:5])}{' and more' if len(nodes) > 5 else ''}"
            for why, nodes in found.items()]
