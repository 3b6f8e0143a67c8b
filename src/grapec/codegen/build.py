"""GPU code for a bundle: render every kernel once, compile a cubin per target and one PTX.

Bundle sections written here:
    cuda.source        the CUDA C (what NVRTC compiled; kept for error reports and `inspect`)
    cubin.<sm_XX>      machine code per target
    ptx.<compute_XX>   PTX for the lowest target, for GPUs without a matching cubin
Manifest entry "cuda": {"kernels": [function name per bundle kernel], "launch": [[mode, grid, block,
split] per bundle kernel] (codegen/launch.py), "targets": [...], "ptx": arch or null, "nvrtc": version}.
"""
from __future__ import annotations

import re

from ..ir.kernel import Kernel
from .cuda import PRELUDE, CudaRenderer
from .launch import plan_launch
from .nvrtc import CudaCompileError, compile_cuda, nvrtc_version


def build_gpu_code(kernels_json: list, origins: dict, targets: list, with_ptx: bool = True) -> tuple:
    """-> (sections {name: bytes}, manifest entry). origins: kernel index -> ONNX node names."""
    names, launches, bodies, line_of, seen = [], [], [], [], {}
    line = PRELUDE.count("\n") + 1
    for i, kj in enumerate(kernels_json):
        kernel = Kernel.from_json(kj)
        launch = plan_launch(kernel)
        name, src = CudaRenderer(kernel, launch).render()
        names.append(name)
        launches.append(launch.to_json())
        if name in seen:
            continue
        seen[name] = i
        line_of.append((line, i))
        bodies.append(src)
        line += src.count("\n") + 2
    source = PRELUDE + "\n\n".join(bodies) + "\n"
    sections = {"cuda.source": source.encode()}
    for arch in targets:
        sections[f"cubin.{arch}"] = _compile(source, arch, False, kernels_json, origins, line_of, names)
    ptx_arch = None
    if with_ptx and targets:
        ptx_arch = min(targets, key=lambda a: int(a.split("_")[1])).replace("sm_", "compute_")
        sections[f"ptx.{ptx_arch}"] = _compile(source, min(targets), True, kernels_json, origins, line_of, names)
    entry = {"kernels": names, "launch": launches, "targets": list(targets), "ptx": ptx_arch, "nvrtc": nvrtc_version()}
    return sections, entry


def _compile(source, arch, ptx, kernels_json, origins, line_of, names):
    try:
        return compile_cuda(source, arch, ptx)
    except CudaCompileError as e:
        raise CudaCompileError(_explain(str(e), source, line_of, origins)) from None


def _explain(log: str, source: str, line_of: list, origins: dict) -> str:
    """Name the kernel(s) the first errors are in, with their source and ONNX nodes."""
    lines = source.splitlines()
    blamed = []
    for m in re.finditer(r"\((\d+)\): error", log):
        ln = int(m.group(1))
        owner = max((k for k in line_of if k[0] <= ln), default=None)
        if owner and owner[1] not in [b[1] for b in blamed]:
            blamed.append(owner)
    parts = [f"generated CUDA code failed to compile (a grapec bug, please report):\n{log[:3000]}"]
    for start, ki in blamed[:3]:
        end = next((s for s, _ in line_of if s > start), len(lines) + 1)
        parts.append(f"kernel {ki} from ONNX node(s) {', '.join(sorted(origins.get(ki, []))) or '?'}:\n"
                     + "\n".join(lines[start - 1:end - 1]))
    return "\n\n".join(parts)


def kernel_origins(plans: list) -> dict:
    out: dict = {}

    def walk(steps):
        for st in steps:
            if st["op"] == "kernel":
                out.setdefault(st["kernel"], set()).update(st.get("origin", []))
            for key in ("then", "else", "body"):
                if key in st:
                    walk(st[key]["steps"])
    for p in plans:
        walk(p["steps"])
    return out
