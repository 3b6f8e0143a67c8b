"""GPU code for a bundle: render every kernel once (codegen/module.py: kernels of different buckets
that differ only in sizes share a function), compile a cubin per target and one PTX.

Bundle sections written here:
    cuda.source        the CUDA C (what NVRTC compiled; kept for error reports and `inspect`)
    cubin.<sm_XX>      machine code per target
    ptx.<compute_XX>   PTX for the lowest target, for GPUs without a matching cubin
    control.<sm_XX>    the setter kernels of graphed If/Loop regions, linked with the device
                       runtime (codegen/control.py); only when a plan has a graphed region
Manifest entry "cuda": {"kernels": [function name per bundle kernel], "launch": [[mode, grid, block,
split] per bundle kernel] (codegen/launch.py), "scalars": [[[type, value]..] per bundle kernel: the
size arguments passed after its pointers], "targets": [...], "ptx": arch or null, "nvrtc": version,
"sized": [merged function names that also have a twin NAME_sized reading its size arguments and grid
from device memory (codegen/module.py sized_twin)], "dependent_launch": true (every kernel waits for
its predecessor in G_AWAIT_PREDECESSOR, so the
runtime may join kernel nodes by programmatic edges on sm_90 and newer; absent in older bundles),
"stitches": [[bucket, first step, function, dynamic shared bytes] per Stitch of the plans]
(codegen/grid_stitch.py)}.
"""
from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor

from ..ir.kinds import kernel_from_json
from ..plan import ScanStoreStep, kernel_steps, regions, walk_steps
from .control import LOAD_SIZES, SCAN_STORE, build_control_cubin
from .size_program import EVAL_SIZES
from .grid_stitch import STITCH_PRELUDE, render_stitch, stage_function, virtual_grid
from .module import build_module, kernel_users
from .nvrtc import CudaCompileError, compile_cuda, nvrtc_version


def build_gpu_code(kernels_json: list, plans: list, targets: list, with_ptx: bool = True, shared: set = frozenset(),
                   mapper=map) -> tuple:
    """-> (sections {name: bytes}, manifest entry). shared: kernels whose functions also run sizes stored as
    formulas (bundle/families.py), merged as if their plans were several. mapper: how the kernels are
    rendered (codegen/module.py build_module)."""
    users = kernel_users(plans, len(kernels_json))
    for k in shared:
        users[k].add(-1)
    module = build_module(kernels_json, users, mapper)
    source = module.source
    if any(isinstance(st, ScanStoreStep) for p in plans for st in walk_steps(p.steps)):
        source += SCAN_STORE
    if module.sized:   # a shared exec's loader; a family's, where some sizes are stored as formulas
        source += LOAD_SIZES + (EVAL_SIZES if shared else "")
    stitched, stitches = stitch_code(module, kernels_json, plans)
    source += stitched
    line_of, line = [], module.prelude.count("\n") + 1
    for body, first in zip(module.bodies, module.first_user):
        line_of.append((line, first))
        line += body.count("\n") + 2
    origins = kernel_origins(plans)
    sections = {"cuda.source": source.encode()}
    jobs = {f"cubin.{arch}": (arch, False) for arch in targets}
    ptx_arch = None
    if with_ptx and targets:
        ptx_arch = min(targets, key=lambda a: int(a.split("_")[1])).replace("sm_", "compute_")
        jobs[f"ptx.{ptx_arch}"] = (min(targets), True)
    # side by side: NVRTC lets go of the GIL while it compiles (GPT-2's 2-D range: 40 s -> 24 s on 2 cores)
    with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
        done = {name: pool.submit(_compile, source, arch, ptx, origins, line_of) for name, (arch, ptx) in jobs.items()}
        sections.update((name, f.result()) for name, f in done.items())
    graphed = any(r.graphed for p in plans for r in regions(p))
    for arch in targets if graphed else ():
        sections[f"control.{arch}"] = build_control_cubin(arch)
    entry = {"control": graphed, "kernels": module.names, "launch": [la.to_json() for la in module.launches],
             "scalars": module.scalars, "targets": list(targets), "ptx": ptx_arch, "nvrtc": nvrtc_version(),
             "dependent_launch": True, "sized": module.sized}
    if stitches:
        entry["stitches"] = stitches
    return sections, entry


def stitch_code(module, kernels_json: list, plans: list) -> tuple:
    """-> (CUDA C of every plan's stitched kernels, the manifest's "stitches" rows). Last in the source:
    its stage functions redefine the kernels' macros inside their namespaces."""
    if not any(p.stitches for p in plans):
        return "", []
    kernels = [kernel_from_json(k) for k in kernels_json]
    stage_texts, kernel_texts, rows, made = {}, [], [], set()
    for bucket, plan in enumerate(plans):
        for sti in plan.stitches:
            stages = []
            for st in plan.steps[sti.first:sti.end]:
                k, fname = st.kernel, module.names[st.kernel]
                key = (fname, sti.block)
                if key not in stage_texts:
                    stage_texts[key] = stage_function(fname, module.body_of[fname], kernels[k], module.launches[k], sti.block)
                stages.append((stage_texts[key], virtual_grid(kernels[k], module.launches[k], sti.block)))
            name, text = render_stitch(stages, sti.block)
            if name not in made:
                made.add(name)
                kernel_texts.append(text)
            rows.append([bucket, sti.first, name, max(fn.smem for fn, _ in stages)])
    source = "\n" + STITCH_PRELUDE + "\n".join(fn.text for fn in stage_texts.values()) + "\n\n" + "\n\n".join(kernel_texts) + "\n"
    return source, rows


def _compile(source, arch, ptx, origins, line_of):
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
    """Per bundle kernel index, the ONNX nodes it was made from (in any bucket)."""
    out: dict = {}
    for _, st in kernel_steps(plans):
        out.setdefault(st.kernel, set()).update(st.origin)
    return out
