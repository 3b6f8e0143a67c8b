"""A stitched kernel: the stages of a Stitch (plan.py, passes/grid_stitch.py) in one cooperative kernel.

Each stage is the function the step would launch on its own, turned into a device function of the
same source: `blockIdx` and `gridDim` become its virtual block and grid (macros over the stage's
text), its shared arrays become slices of the kernel's dynamic shared memory (stages run one after
another, so they all start at offset 0 and the kernel needs the largest stage's bytes, not the sum),
and __restrict__ goes (a buffer read through the non-coherent path early in the kernel may be
rewritten by a later stage when the memory plan reuses its bytes).

    stage kind        called                                     its barrier wait
    small_gemm        once per block, on the real grid (it       inside, where it waits for its
                      loops over its tiles itself)               predecessor: its first weights load first
    kernel/attention  for each virtual block vb = blockIdx.x,    before the loop, in the kernel
                      blockIdx.x + gridDim.x, ..

The barrier is split: a block *arrives* when it has finished a stage (a release add on a 64-bit
counter) and *waits* before the next stage reads anything (thread 0 spins until the counter holds
every block's arrival). The counter is never reset: at entry each block rounds the count down to a
multiple of (stages - 1) x gridDim.x, the arrivals of one launch, which is this launch's base (no
block can have passed the first barrier yet, so at most gridDim.x - 1 arrivals are ahead of it).
The runtime zeroes the counter once, when the graph is built (runtime/cuda/graph.py).

A stage needing fewer threads than the kernel's block (an attention kernel of one warp) runs on the
first threads only; its __syncthreads() becomes a named barrier over those threads. Generated
element, row and warp kernels stride over whatever block they get and take the kernel's whole block.
"""
from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass

from ..ir.attention import AttentionKernel
from ..ir.small_gemm import SmallGemmKernel

STITCH_PRELUDE = r"""
extern __shared__ __align__(16) unsigned char g_dyn_smem[];
__device__ __forceinline__ unsigned char* g_take(unsigned& off, unsigned bytes) {
  off = (off + 15u) & ~15u;
  unsigned char* p = g_dyn_smem + off;
  off += bytes;
  return p;
}
__device__ __forceinline__ unsigned long long g_grid_count(const unsigned long long* bar) {
  unsigned long long v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(bar) : "memory");
  return v;
}
__device__ __forceinline__ void g_grid_spin(const unsigned long long* bar, unsigned long long target) {
  while ((long long)(g_grid_count(bar) - target) < 0) __nanosleep(20);
  __threadfence();
}
__device__ __forceinline__ void g_grid_arrive(unsigned long long* bar) {
  __syncthreads();   /* the whole block is done with the stage */
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(bar, 1ull);
  }
}
/* a macro, not a function: its __syncthreads is the one where it expands (a guarded stage's named barrier) */
#define G_GRID_WAIT(bar, target) do { if (threadIdx.x == 0) g_grid_spin(bar, target); __syncthreads(); } while (0)
"""

MIN_BLOCKS_PER_SM = 1   # __launch_bounds__' second argument: caps registers so this many blocks fit an SM

_HEADER = re.compile(r'extern "C" __global__ void (?:__launch_bounds__\([^)]*\) )?(\w+)\((.*)\) \{\n')
_SHARED = re.compile(r"^(\s*)__shared__\s+(?:__align__\(\d+\)\s+)?(\w+)\s+(.*?);(.*)$", re.M)
_DECLARATOR = re.compile(r"(\w+)((?:\[\d+\])+)")
_SIZES = {"float": 4, "f16": 2, "bf16": 2, "double": 8, "i64": 8, "int": 4, "unsigned": 4}


class StitchError(ValueError):
    """A stage's text is not of a form the stitcher knows (a grapec bug: the planner chose it)."""


@dataclass
class StageFunction:
    name: str          # the stage's own function (codegen/module.py)
    text: str          # its device version, in namespace gs_<name>_b<block>
    params: list       # "type name" of its parameters, pointers then size scalars
    smem: int          # bytes of dynamic shared memory it uses
    once: bool         # called once per block on the real grid (small GEMM) rather than per virtual block
    threads: int       # threads it needs (0: whatever the block has)


def stage_function(name: str, body: str, kernel, launch, block: int) -> StageFunction:
    """The device version of kernel function `name` (its source `body`) for a kernel of `block` threads."""
    m = _HEADER.search(body)
    if m is None or m.group(1) != name:
        raise StitchError(f"kernel {name}: no kernel signature found to make a stage of")
    params = [p.strip() for p in m.group(2).split(",")]
    once = isinstance(kernel, SmallGemmKernel)
    threads = launch.block if isinstance(kernel, (SmallGemmKernel, AttentionKernel)) else 0
    if threads > block:
        raise StitchError(f"kernel {name} needs {threads} threads, the stitch has {block}")
    head = (f"__device__ __noinline__ void run({', '.join(params)}, const uint3 g_vblock, const uint3 g_vgrid, "
            "const unsigned long long* g_bar, const unsigned long long g_target) {\n  unsigned g_smem_off = 0u;\n")
    text = body[:m.start()] + head + body[m.end():]
    smem = 0

    def shared(mt):
        nonlocal smem
        indent, ctype, decls, tail = mt.groups()
        if ctype not in _SIZES:
            raise StitchError(f"kernel {name}: shared array of type {ctype}")
        out = []
        for d in re.split(r",\s*", decls):
            dm = _DECLARATOR.fullmatch(d.strip())
            if dm is None:
                raise StitchError(f"kernel {name}: shared declaration '{d}' has no literal dims")
            var, dims = dm.groups()
            nbytes = _SIZES[ctype] * math.prod(int(x) for x in re.findall(r"\d+", dims))
            smem = (smem + 15) // 16 * 16 + nbytes
            out.append(f"{ctype} (&{var}){dims} = *reinterpret_cast<{ctype} (*){dims}>(g_take(g_smem_off, {nbytes}u));")
        return indent + " ".join(out) + tail

    text = _SHARED.sub(shared, text).replace("__restrict__ ", "")
    guard = 0 < threads < block
    macros = ["#define blockIdx g_vblock", "#define gridDim g_vgrid",
              "#define G_AWAIT_PREDECESSOR() " + ("G_GRID_WAIT(g_bar, g_target)" if once else "((void)0)")]
    if guard:
        macros.append(f'#define __syncthreads() asm volatile("bar.sync 1, {threads};" ::: "memory")')
    undo = ["#undef blockIdx", "#undef gridDim", "#undef G_AWAIT_PREDECESSOR"] + (["#undef __syncthreads"] if guard else [])
    wrapped = "\n".join([f"namespace {namespace(name, block)} {{"] + macros + [text] + undo + ["}"])
    return StageFunction(name, wrapped, params, smem, once, threads)


def namespace(name: str, block: int) -> str:
    """A stage function's device version depends on the stitch's block (which threads it guards)."""
    return f"gs_{name}_b{block}"


def virtual_grid(kernel, launch, block: int) -> int:
    """Blocks a looped stage runs at `block` threads a block."""
    if isinstance(kernel, AttentionKernel):
        return launch.grid
    if launch.mode == "element":
        return -(-max(kernel.size, 1) // (block * launch.per_thread))
    if launch.mode == "warp":
        return -(-launch.rows // (block // 32))
    return launch.grid   # row mode: a block per row, whatever its threads


def render_stitch(stages: list, block: int) -> tuple:
    """stages: [(StageFunction, virtual grid)] in order -> (kernel name, CUDA C of the kernel).
    Parameters: the barrier counter, every stage's pointers, then every stage's size scalars."""
    pointers, scalars, calls = ["unsigned long long* g_bar"], [], []
    n = len(stages)
    for j, (fn, vgrid) in enumerate(stages):
        names = []
        for p in fn.params:
            ctype, pname = p.rsplit(" ", 1)
            mine = f"a{j}_{pname}"
            (scalars if "*" not in ctype else pointers).append(f"{ctype.replace('__restrict__', '').strip()} {mine}")
            names.append(mine)
        args = ", ".join(names)
        target = f"g_base + {j}ull * gridDim.x" if j else "0ull"
        lines = []
        if fn.once:
            call = f"{namespace(fn.name, block)}::run({args}, blockIdx, gridDim, g_bar, {target});"
        else:
            if j:
                lines.append(f"  G_GRID_WAIT(g_bar, {target});")
            call = (f"for (unsigned vb = blockIdx.x; vb < {vgrid}u; vb += gridDim.x) "
                    f"{namespace(fn.name, block)}::run({args}, make_uint3(vb, 0u, 0u), make_uint3({vgrid}u, 1u, 1u), "
                    "g_bar, 0ull);")
        lines.append(f"  if (threadIdx.x < {fn.threads}u) {call}" if 0 < fn.threads < block else f"  {call}")
        if j < n - 1:
            lines.append("  g_grid_arrive(g_bar);")
        calls += lines
    body = "\n".join(calls)
    params = ", ".join(pointers + scalars)
    sig = hashlib.sha1((params + body).encode()).hexdigest()[:12]
    name = f"gs_{sig}"
    text = "\n".join([
        f'extern "C" __global__ void __launch_bounds__({block}, {MIN_BLOCKS_PER_SM}) {name}({params}) {{',
        f"  const unsigned long long g_per_launch = {n - 1}ull * gridDim.x;",
        "  const unsigned long long g_base = g_grid_count(g_bar) / g_per_launch * g_per_launch;",
        body, "}"])
    return name, text
