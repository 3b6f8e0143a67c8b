"""Compile the rendered CUDA C for the host CPU (g++), one single-thread "block" per loop iteration.

This is how the CUDA code generator is tested on machines without a GPU: the same source that
NVRTC compiles for the GPU is compiled with a few shims (blockIdx, half conversions through _Float16) and run on
the very buffers of a plan, next to the numpy interpreter.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import tempfile

import numpy as np

from .prelude import COMMON, NARROW_CONVERSIONS, TYPES
from .module import SIZED, CudaModule, build_module, scalar_literal

HOST_SHIM = r"""
#include <cmath>
#include <cstdint>
struct grapec_dim3 { unsigned long long x, y, z; };
static grapec_dim3 blockIdx, threadIdx, blockDim;
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#include <cstring>
static inline float grapec_h2f(unsigned short h) { _Float16 v; std::memcpy(&v, &h, 2); return (float)v; }
static inline unsigned short grapec_f2h(float f) { _Float16 v = (_Float16)f; unsigned short h; std::memcpy(&h, &v, 2); return h; }
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
static inline double __longlong_as_double(long long i) { double d; std::memcpy(&d, &i, 8); return d; }
static inline float h2f(unsigned short h) { return grapec_h2f(h); }
static inline unsigned short f2h(float f) { return grapec_f2h(f); }
template <typename T, typename Op> static inline T g_block_reduce(T v, Op) { return v; }  // one thread per block
template <typename T> static inline void g_block_argreduce(T&, long long&, bool, bool) {}
#define G_WARP 1   /* warp mode: one thread per row */
#define G_PREFETCH(p) ((void)(p))
#define G_AWAIT_PREDECESSOR() ((void)0)
struct alignas(16) uint4 { unsigned int x, y, z, w; };
struct alignas(8) uint2 { unsigned int x, y; };
#define __shared__ static
#define __launch_bounds__(n)
#define __syncthreads() ((void)0)
static inline unsigned atomicAnd(unsigned* p, unsigned v) { const unsigned o = *p; *p &= v; return o; }
static inline int atomicAdd(int* p, int v) { const int o = *p; *p += v; return o; }
static inline long long __double_as_longlong(double d) { long long i; std::memcpy(&i, &d, 8); return i; }
static inline unsigned long long atomicOr(unsigned long long* p, unsigned long long v) { const unsigned long long o = *p; *p |= v; return o; }
static inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
static inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
static inline float __fsub_rn(float a, float b) { volatile float r = a - b; return r; }
static inline float __fdiv_rn(float a, float b) { volatile float r = a / b; return r; }
static inline float g_dot8_q4(uint4 x, unsigned w, float z) {   /* the GPU's (codegen/prelude.py NIBBLE_DOT), in floats */
  const unsigned xs[4] = {x.x, x.y, x.z, x.w};
  float s = 0.f;
  for (int i = 0; i < 8; ++i)
    s += grapec_h2f((unsigned short)(i % 2 ? xs[i / 2] >> 16 : xs[i / 2] & 0xFFFFu)) * ((float)((w >> (4 * i)) & 15u) - z);
  return s;
}
template <typename T, typename Op> static inline T g_warp_reduce(T v, Op) { return v; }
template <typename T> static inline void g_warp_argreduce(T&, long long&, bool, bool) {}
"""


class HostModule:
    """Kernels compiled for the CPU; call(kernel_index, out, *inputs) runs every thread.

    module: the CudaModule to run (codegen/module.py), e.g. one whose kernels share functions with
    size arguments; by default the kernels' own, one function each."""

    def __init__(self, kernels: list, workdir: str | None = None, module: CudaModule | None = None,
                 sized_extra_blocks: int | None = None):
        """sized_extra_blocks: run each merged function's sized twin instead (its sizes and grid from a
        record in memory, codegen/module.py sized_twin), over that many blocks more than it needs,
        as a node sized for a larger member of its launch structure would."""
        module = module or build_module(kernels)
        wrappers = []
        for i, k in enumerate(kernels):
            n_in = len(k.inputs)
            params = ", ".join(["void* out"] + [f"void* in{j}" for j in range(n_in)])
            ptrs = [f"({_ptr(k.dtype)})out"] + [f"({_ptr(dt, True)})in{j}" for j, (_, dt) in enumerate(k.inputs)]
            launch = module.launches[i]
            blocks = launch.rows if launch.mode in ("row", "warp") \
                else -(-max(k.size, 1) // launch.per_thread)   # blockDim is 1
            name, record, run = module.names[i], "", blocks
            if sized_extra_blocks is not None and name in module.sized:
                values = [v if t == "i64" else int(np.float64(v).view(np.int64)) for t, v in module.scalars[i]]
                record = f"  static const long long g_record[] = {{{', '.join(f'{v}LL' for v in values + [blocks])}}};\n"
                name, args, run = name + SIZED, ", ".join(ptrs + ["g_record"]), blocks + sized_extra_blocks
            else:
                args = ", ".join(ptrs + [scalar_literal(t, v) for t, v in module.scalars[i]])
            wrappers.append(f'extern "C" void launch{i}({params}) {{\n{record}'
                            f"  blockDim.x = 1; threadIdx.x = 0;\n"
                            f"  for (unsigned long long t = 0; t < {run}ULL; ++t) {{ blockIdx.x = t; {name}({args}); }}\n}}")
        src = HOST_SHIM + TYPES + COMMON + NARROW_CONVERSIONS + "\n\n".join(module.bodies) + "\n" + "\n".join(wrappers)
        tag = hashlib.sha1(src.encode()).hexdigest()[:16]
        d = workdir or tempfile.mkdtemp(prefix="grapec-host-")
        cpp, so = os.path.join(d, f"m{tag}.cpp"), os.path.join(d, f"m{tag}.so")
        with open(cpp, "w") as f:
            f.write(src)
        r = subprocess.run(["g++", "-std=c++17", "-O1", "-shared", "-fPIC", "-w", "-o", so, cpp],
                           capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"host compile of generated code failed ({cpp}):\n{r.stderr[:4000]}")
        self.lib = ctypes.CDLL(so)
        self.source = src

    def call(self, i: int, out, inputs: list):
        fn = getattr(self.lib, f"launch{i}")
        for a in [out, *inputs]:
            assert a.flags["C_CONTIGUOUS"]
        target, held = _aligned(out), [_aligned(a) for a in inputs]   # alive until the call returns
        fn(*[ctypes.c_void_p(a.ctypes.data) for a in [target, *held]])
        if target is not out:
            out[...] = target


def _aligned(a: np.ndarray) -> np.ndarray:
    """a, or a copy of it that starts on 256 bytes, as every buffer does on the GPU (the arena, the
    weight store): the generated code reads 16-byte vectors, which the host compiler may read with
    instructions that need their alignment, while numpy views of a bundle's bytes need not have it."""
    if a.ctypes.data % 256 == 0 or a.nbytes == 0:
        return a
    raw = np.empty(a.nbytes + 256, np.uint8)
    start = -raw.ctypes.data % 256
    copy = raw[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
    copy[...] = a
    return copy


def _ptr(dt: str, const: bool = False) -> str:
    from .cuda import ctype
    return f"{'const ' if const else ''}{ctype(dt)}*"
