"""A thin layer over the CUDA driver API (cuda.bindings.driver): every call checked, errors named.

Only what the runtime needs: a context, device memory, modules, explicit graphs, streams (each
runner creates its own: runner.py).
"""
from __future__ import annotations

import ctypes
import threading

from ...errors import BackendError, gpu_package


_DRIVER = None


def _driver():
    global _DRIVER
    if _DRIVER is None:   # once: call() is on the request path (a switch's node update), an import is not free
        try:
            from cuda.bindings import driver
        except ImportError:
            raise BackendError(f"the CUDA backend needs the CUDA driver bindings: {gpu_package('cuda-bindings')}") from None
        _DRIVER = driver
    return _DRIVER


class CudaError(BackendError):
    pass


def call(name: str, *args):
    """driver.<name>(*args), raising CudaError('cuXxx failed: CUDA_ERROR_... (text)') on failure."""
    d = _driver()
    res = getattr(d, name)(*args)
    err, vals = (res[0], res[1:]) if isinstance(res, tuple) else (res, ())
    if int(err) != 0:
        _, text = d.cuGetErrorString(err)
        try:
            label = d.CUresult(int(err)).name
        except ValueError:
            label = str(int(err))
        raise CudaError(f"{name} failed: {label} ({text.decode() if text else 'no description'})")
    if not vals:
        return None
    return vals[0] if len(vals) == 1 else vals


def event_done(event) -> bool:
    """Is the work recorded before `event` done? (cuEventQuery's NOT_READY is an answer, not a failure)"""
    d = _driver()
    res = d.cuEventQuery(event)
    err = res[0] if isinstance(res, tuple) else res
    if err == d.CUresult.CUDA_ERROR_NOT_READY:
        return False
    if int(err) != 0:
        call("cuEventQuery", event)   # raises, with the driver's words
    return True


def capture_stream():
    """A stream to capture on that the legacy default stream does not wait for: a copy on the legacy
    stream in another thread (cuMemcpyHtoD at load, a caller's own copy) would otherwise join the
    capture and invalidate it. Runners' streams stay blocking, so that work a caller puts on the
    legacy stream is ordered after a run, as __cuda_array_interface__ consumers expect."""
    from cuda.bindings import driver
    return call("cuStreamCreate", int(driver.CUstream_flags.CU_STREAM_NON_BLOCKING))


class Device:
    """One GPU with its primary context made current."""

    def __init__(self, ordinal: int = 0):
        d = _driver()
        call("cuInit", 0)
        n = call("cuDeviceGetCount")
        if ordinal >= n:
            raise BackendError(f"device {ordinal} requested, but {n} CUDA device(s) are present")
        self.ordinal = ordinal
        self.dev = call("cuDeviceGet", ordinal)
        self.ctx = call("cuDevicePrimaryCtxRetain", self.dev)
        call("cuCtxSetCurrent", self.ctx)
        A = d.CUdevice_attribute
        self.cc = (call("cuDeviceGetAttribute", A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.dev),
                   call("cuDeviceGetAttribute", A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self.dev))
        self.name = call("cuDeviceGetName", 256, self.dev).split(b"\0")[0].decode()
        self.sms = call("cuDeviceGetAttribute", A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, self.dev)

    def make_current(self):
        """A context is current per thread: a session called from a new thread makes it current there."""
        call("cuCtxSetCurrent", self.ctx)

    @property
    def arch(self) -> str:
        return f"sm_{self.cc[0]}{self.cc[1]}"

    def mem_info(self) -> tuple:
        """(free, total) bytes of this GPU (cuMemGetInfo reads the current context's device)."""
        self.make_current()
        free, total = call("cuMemGetInfo")
        return int(free), int(total)

    def alloc(self, nbytes: int, what: str) -> int:
        if nbytes == 0:
            return 0
        try:
            return int(call("cuMemAlloc", nbytes))
        except CudaError as e:
            if "OUT_OF_MEMORY" in str(e):
                free, total = self.mem_info()
                raise BackendError(f"out of GPU memory allocating {what}: {nbytes / 2**20:.1f} MiB requested, "
                                   f"{free / 2**20:.1f} MiB free of {total / 2**20:.0f} MiB on {self.name}") from None
            raise

    def free(self, ptr: int):
        if ptr:
            call("cuMemFree", ptr)

    def upload(self, dst: int, data, nbytes: int):
        if nbytes:
            call("cuMemcpyHtoD", dst, data, nbytes)

    def download(self, host, src: int, nbytes: int):
        if nbytes:
            call("cuMemcpyDtoH", host, src, nbytes)

    def synchronize(self):
        """Wait for all work on this GPU's context (every stream); a runner waits for its own stream."""
        self.make_current()
        call("cuCtxSynchronize")


def copy_rows_async(dst: int, dst_pitch: int, src: int, src_pitch: int, row_bytes: int, rows: int, stream,
                    dst_host: bool = False):
    """Copy `rows` rows of row_bytes from device memory src (rows src_pitch bytes apart) to dst
    (dst_pitch apart; host memory when dst_host): a padded output compacted by the copy engine."""
    from cuda.bindings import driver
    p = driver.CUDA_MEMCPY2D()
    p.srcMemoryType = driver.CUmemorytype.CU_MEMORYTYPE_DEVICE
    p.srcDevice, p.srcPitch = src, src_pitch
    if dst_host:
        p.dstMemoryType = driver.CUmemorytype.CU_MEMORYTYPE_HOST
        p.dstHost = dst
    else:
        p.dstMemoryType = driver.CUmemorytype.CU_MEMORYTYPE_DEVICE
        p.dstDevice = dst
    p.dstPitch, p.WidthInBytes, p.Height = dst_pitch, row_bytes, rows
    call("cuMemcpy2DAsync", p, stream)


def graph_ms(graph, stream, launches: int) -> float:
    """GPU milliseconds per launch of graph on stream (after one warm launch: code loaded, caches
    as in a replay); the graph is destroyed."""
    exec_ = call("cuGraphInstantiate", graph, 0)
    try:
        return exec_ms(exec_, stream, launches)
    finally:
        call("cuGraphExecDestroy", exec_)
        call("cuGraphDestroy", graph)


def exec_ms(exec_, stream, launches: int) -> float:
    """GPU milliseconds per launch of an instantiated graph, after one warm launch."""
    start, end = call("cuEventCreate", 0), call("cuEventCreate", 0)
    try:
        call("cuGraphLaunch", exec_, stream)
        call("cuEventRecord", start, stream)
        for _ in range(launches):
            call("cuGraphLaunch", exec_, stream)
        call("cuEventRecord", end, stream)
        call("cuEventSynchronize", end)
        return float(call("cuEventElapsedTime", start, end)) / launches
    finally:
        for e in (start, end):
            call("cuEventDestroy", e)


_SCALAR_TYPES = {"i64": ctypes.c_int64, "f64": ctypes.c_double}


class KernelArgs:
    """The void*[] array a kernel node takes: device pointers, then scalar [type, value] arguments
    (sizes of a function shared by buckets, codegen/module.py); kept alive with the node."""

    def __init__(self, pointers: list, scalars: list = ()):
        self.values = [ctypes.c_uint64(p) for p in pointers] + [_SCALAR_TYPES[t](v) for t, v in scalars]
        self.array = (ctypes.c_void_p * max(len(self.values), 1))(*[ctypes.addressof(v) for v in self.values])

    @property
    def address(self) -> int:
        return ctypes.addressof(self.array)


def captured(stream, launch) -> object:
    """The CUDA graph of what launch() puts on `stream` (relaxed capture: library calls may query
    the driver meanwhile)."""
    from cuda.bindings import driver
    call("cuStreamBeginCapture", stream, driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED)
    try:
        launch()
    finally:
        graph = call("cuStreamEndCapture", stream)
    return graph


_SHARED: dict = {}
_SHARED_LOCK = threading.Lock()


def shared(cls, device, tf32: bool = False):
    """One cls(device, tf32=tf32) per device and precision mode in the process (a library handle with
    the problems it has met: blas.Blas, dnn.Dnn), shared by all sessions."""
    key = (cls, device.ordinal, tf32)
    with _SHARED_LOCK:
        if key not in _SHARED:
            _SHARED[key] = cls(device, tf32=tf32)
        return _SHARED[key]
