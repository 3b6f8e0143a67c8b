"""Device code for control flow inside the CUDA graph: the setter kernels of conditional nodes.

A graphed If becomes `grapec_if_cond` followed by a conditional IF node (then/else bodies); a
graphed Loop becomes `grapec_loop_enter`, then a conditional WHILE node whose body ends with
`grapec_loop_next`. They evaluate on the device what runtime/walker.py does on the host, and set the
node's condition with cudaGraphSetConditional. That call lives in the CUDA device runtime, so this
module is compiled with NVRTC as relocatable code (-rdc) and linked with nvJitLink against
libcudadevrt.a: all of it on the build machine, no GPU needed. The linked cubin goes into the
bundle as the section `control.<sm_XX>`.

`SCAN_STORE` (a Loop's scan output row) and `LOAD_SIZES` (a shared exec's size record) need no
device runtime: they join the ordinary module.
"""
from __future__ import annotations

import glob
import os

from ..errors import GrapecError, gpu_package
from .nvrtc import compile_cuda

SETTERS = r"""
typedef long long i64;
typedef unsigned long long grapec_cond_handle;
extern "C" __device__ void cudaGraphSetConditional(grapec_cond_handle handle, unsigned int value);

/* If: the branch the IF node runs. */
extern "C" __global__ void grapec_if_cond(grapec_cond_handle h, const bool* cond) {
  cudaGraphSetConditional(h, *cond ? 1u : 0u);
}

/* Loop, before the WHILE node: counter := 0, cond_in := cond (or true); run the body at all? */
extern "C" __global__ void grapec_loop_enter(grapec_cond_handle h, i64* counter, bool* cond_in,
                                             const i64* trip, const bool* cond) {
  const bool c = cond ? *cond : true;
  *counter = 0;
  *cond_in = c;
  cudaGraphSetConditional(h, (c && (!trip || 0 < *trip)) ? 1u : 0u);
}

/* Loop, last node of the WHILE body: cond_in := cond_out, counter += 1; run it again? */
extern "C" __global__ void grapec_loop_next(grapec_cond_handle h, i64* counter, bool* cond_in,
                                            const bool* cond_out, const i64* trip) {
  const bool c = *cond_out;
  const i64 i = *counter + 1;
  *counter = i;
  *cond_in = c;
  cudaGraphSetConditional(h, (c && (!trip || i < *trip)) ? 1u : 0u);
}
"""

SCAN_STORE = r"""
/* A Loop's scan output: row *counter of dst := src (nbytes per row; 4-byte words when they fit). */
extern "C" __global__ void grapec_scan_store(char* dst, const char* src, const i64* counter, const i64 nbytes,
                                             const i64 rows) {
  const i64 r = *counter;
  if (r < 0 || r >= rows) return;
  char* d = dst + r * nbytes;
  const i64 stride = (i64)gridDim.x * blockDim.x;
  if ((nbytes & 3) == 0) {
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (nbytes >> 2); i += stride)
      ((unsigned int*)d)[i] = ((const unsigned int*)src)[i];
  } else {
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < nbytes; i += stride) d[i] = src[i];
  }
}
"""
SCAN_STORE_BLOCK = 256

LOAD_SIZES = r"""
/* The first node of a shared exec (runtime/cuda/size_record.py): n copies, each (dst, src, nbytes),
   that put one size's record and per-size constants where the sized kernels read them. A switch
   between sizes repoints this one node at another size's list. */
extern "C" __global__ void grapec_load_sizes(const i64* __restrict__ copies, const i64 n) {
  const i64 stride = (i64)gridDim.x * blockDim.x;
  for (i64 c = 0; c < n; ++c) {
    char* d = (char*)copies[3 * c];
    const char* s = (const char*)copies[3 * c + 1];
    const i64 nbytes = copies[3 * c + 2];
    if (((unsigned long long)d | (unsigned long long)s | (unsigned long long)nbytes) % 8 == 0) {
      for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (nbytes >> 3); i += stride)
        ((unsigned long long*)d)[i] = ((const unsigned long long*)s)[i];
    } else {
      for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < nbytes; i += stride) d[i] = s[i];
    }
  }
}
"""
LOAD_SIZES_BLOCK, LOAD_SIZES_GRID = 256, 32


def scan_store_grid(nbytes: int) -> int:
    words = nbytes // 4 if nbytes % 4 == 0 else nbytes
    return max(1, min((words + SCAN_STORE_BLOCK - 1) // SCAN_STORE_BLOCK, 1024))


class DeviceRuntimeUnavailable(GrapecError):
    pass


def cudadevrt_candidates() -> list:
    """Every libcudadevrt.a at hand: from the nvidia-cuda-runtime wheel, then a CUDA toolkit. The one
    to use is the one the loaded nvJitLink accepts (a linker older than the library refuses it)."""
    candidates = []
    try:
        import nvidia
        for base in nvidia.__path__:
            candidates += sorted(glob.glob(os.path.join(base, "cu*", "lib", "libcudadevrt.a")), reverse=True)
            candidates += glob.glob(os.path.join(base, "cuda_runtime", "lib", "libcudadevrt.a"))
    except ImportError:
        pass
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            candidates.append(os.path.join(os.environ[env], "lib64", "libcudadevrt.a"))
    candidates.append("/usr/local/cuda/lib64/libcudadevrt.a")
    found = list(dict.fromkeys(c for c in candidates if os.path.exists(c)))
    if not found:
        raise DeviceRuntimeUnavailable(
            "If/Loop inside the CUDA graph needs the CUDA device runtime (libcudadevrt.a) to link its setter "
            "kernels: pip install nvidia-cuda-runtime nvidia-nvjitlink, or compile with --host-control to run "
            "the control on the host")
    return found


def build_control_cubin(arch: str) -> bytes:
    """The setter kernels for one target, linked: NVRTC -rdc, then nvJitLink with libcudadevrt."""
    libraries = cudadevrt_candidates()
    relocatable = compile_cuda(SETTERS, arch, extra_options=["-rdc=true"], name="grapec_control.cu")
    try:
        from cuda.bindings import nvjitlink
        version = ".".join(map(str, nvjitlink.version()))
    except Exception as e:  # noqa: BLE001 - no module, or no libnvJitLink for it to load
        raise DeviceRuntimeUnavailable(f"linking the If/Loop setter kernels needs nvJitLink ({e}): "
                                       f"{gpu_package('cuda-bindings nvidia-nvjitlink')}, or compile with "
                                       "--host-control") from None
    failures = []
    for library in libraries:
        try:
            return _link(nvjitlink, arch, relocatable, library)
        except Exception as e:  # noqa: BLE001 - try the next library; all failures are reported below
            failures.append(f"{library}: {e}")
    raise DeviceRuntimeUnavailable(f"nvJitLink {version} could not link the If/Loop setter kernels for {arch} "
                                   f"with any CUDA device runtime found:\n  " + "\n  ".join(failures)
                                   + "\ninstall nvidia-nvjitlink and nvidia-cuda-runtime of one CUDA version, "
                                   "or compile with --host-control")


def _link(nvjitlink, arch: str, relocatable: bytes, library: str) -> bytes:
    handle = nvjitlink.create(1, [f"-arch={arch}"])
    try:
        nvjitlink.add_data(handle, nvjitlink.InputType.CUBIN, relocatable, len(relocatable), "grapec_control.cubin")
        try:
            nvjitlink.add_file(handle, nvjitlink.InputType.LIBRARY, library)
            nvjitlink.complete(handle)
        except Exception as e:  # noqa: BLE001
            size = nvjitlink.get_error_log_size(handle)
            log = bytearray(size)
            if size:
                nvjitlink.get_error_log(handle, log)
            raise GrapecError(f"{e} {bytes(log).decode(errors='replace').strip()}".strip()) from None
        out = bytearray(nvjitlink.get_linked_cubin_size(handle))
        nvjitlink.get_linked_cubin(handle, out)
        return bytes(out)
    finally:
        nvjitlink.destroy(handle)
