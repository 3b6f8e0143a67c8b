"""Compile generated CUDA C with NVRTC (from cuda-python), on any machine: no GPU is needed.

The bundle carries a cubin per target (the primary payload: it loads on any driver that supports
the architecture) and PTX for GPUs without a matching cubin (PTX needs a driver at least as new as
this NVRTC, which the loader reports clearly when it is not).
"""
from __future__ import annotations

from ..errors import GrapecError, gpu_package


class NvrtcUnavailable(GrapecError):
    pass


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        raise NvrtcUnavailable(f"GPU code generation needs NVRTC: {gpu_package('cuda-bindings nvidia-cuda-nvrtc')}") from None
    return nvrtc


def nvrtc_version() -> str:
    nvrtc = _nvrtc()
    err, major, minor = nvrtc.nvrtcVersion()
    return f"{major}.{minor}"


def _check(nvrtc, result, what):
    err = result[0] if isinstance(result, tuple) else result
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise GrapecError(f"NVRTC {what} failed: {nvrtc.nvrtcGetErrorString(err)[1].decode()}")
    return result[1:] if isinstance(result, tuple) and len(result) > 1 else None


def compile_cuda(source: str, arch: str, ptx: bool = False, name: str = "grapec.cu", extra_options=()) -> bytes:
    """arch like 'sm_90'. Returns the cubin (or PTX text when ptx=True). On a compile error the
    GrapecError carries NVRTC's log (the caller adds the kernel source and its ONNX nodes)."""
    nvrtc = _nvrtc()
    (prog,) = _check(nvrtc, nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], []), "create program")
    target = arch.replace("sm_", "compute_") if ptx else arch
    opts = [f"--gpu-architecture={target}".encode(), b"--std=c++17", b"-default-device"]
    opts += [o.encode() for o in extra_options]
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            _, size = nvrtc.nvrtcGetProgramLogSize(prog)
            log = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, log)
            raise CudaCompileError(log.decode(errors="replace").rstrip("\x00 "))
        if ptx:
            (size,) = _check(nvrtc, nvrtc.nvrtcGetPTXSize(prog), "PTX size")
            buf = b" " * size
            _check(nvrtc, nvrtc.nvrtcGetPTX(prog, buf), "get PTX")
        else:
            (size,) = _check(nvrtc, nvrtc.nvrtcGetCUBINSize(prog), "cubin size")
            buf = b" " * size
            _check(nvrtc, nvrtc.nvrtcGetCUBIN(prog, buf), "get cubin")
        return bytes(buf)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


class CudaCompileError(GrapecError):
    """Generated code did not compile: a grapec bug. The message holds NVRTC's log."""
