"""Which backend runs here: `auto` picks the CUDA backend when a usable NVIDIA GPU is present; and
whether a bundle's memory fits in what this machine has."""
from __future__ import annotations

import os

from ..errors import BackendError


def host_memory_available() -> int | None:
    """Bytes of host memory available for new allocations (Linux MemAvailable), None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_fits(needs: dict, available: int | None, where: str):
    """Refuse before allocating when the bundle's sizes (what -> bytes) exceed what `where` has."""
    total = sum(needs.values())
    if available is not None and total > available:
        parts = ", ".join(f"{what} {n / 2**20:,.1f} MiB" for what, n in needs.items())
        raise BackendError(f"the bundle needs {total / 2**20:,.1f} MiB of {where} ({parts}); "
                           f"{available / 2**20:,.1f} MiB is available")


def gpu_count() -> int:
    """Number of CUDA devices the driver reports (0 without cuda-python, a driver or a GPU)."""
    try:
        from cuda.bindings import driver
    except ImportError:
        return 0
    try:
        (err,) = driver.cuInit(0)
        if int(err) != 0:
            return 0
        err, n = driver.cuDeviceGetCount()
        return int(n) if int(err) == 0 else 0
    except Exception:  # noqa: BLE001 - no usable driver means no GPU, for `auto`
        return 0


def cuda_backend_available() -> bool:
    """cuda-python's driver bindings and nvmath-python (cuBLASLt) are installed."""
    try:
        import cuda.bindings.driver  # noqa: F401
        import nvmath.bindings.cublasLt  # noqa: F401
    except ImportError:
        return False
    return True


def require_cuda(device: int = 0):
    """Refuse the CUDA backend by name, before anything loads, where this machine cannot run it."""
    try:
        import cuda.bindings.driver  # noqa: F401
    except ImportError:
        raise BackendError("the cuda backend needs cuda-bindings, which is not installed: pip install 'grapec[gpu]'") from None
    n = gpu_count()
    if not n:
        raise BackendError("the cuda backend needs an NVIDIA GPU and its driver, and none was found here "
                           "(use --backend cpu, or auto to pick what there is)")
    if not isinstance(device, int) or not 0 <= device < n:
        raise BackendError(f"device {device}: this machine has {n} CUDA device(s), numbered from 0")
    if not cuda_backend_available():
        raise BackendError("the cuda backend runs GEMMs through nvmath-python (cuBLASLt), which is not installed: "
                           "pip install 'grapec[gpu]'")


def resolve_backend(name: str, device: int = 0) -> tuple:
    """-> (backend, why): `auto` becomes cuda or cpu, with the reason in words."""
    if name == "cuda":
        require_cuda(device)
        return name, f"cuda backend (as asked), GPU {device}"
    if name != "auto":
        return name, f"{name} backend (as asked)"
    n = gpu_count()
    if n and device >= n:
        raise BackendError(f"--device {device}: this machine has {n} CUDA device(s), numbered from 0")
    if n and cuda_backend_available():
        return "cuda", f"CUDA backend on GPU {device} of {n}"
    if n:
        return "cpu", f"CPU backend: {n} GPU(s) found, but nvmath-python (cuBLASLt) is not installed"
    return "cpu", "CPU backend: no NVIDIA GPU found"
