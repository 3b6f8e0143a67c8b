"""The CUDA backend: a plan replayed as CUDA graphs built explicitly from its steps.

At load: pick the bundle's code for this GPU (a cubin of the same major architecture, else PTX),
load the module, upload the weights once, allocate one arena shared by all buckets. A bucket's
graph is built on its first run and kept: kernel steps become kernel nodes, matmul steps child
graphs captured from cuBLASLt; each node depends on the one before it (the schedule's order; the
memory plan would allow more parallelism, which a later scheduler will use). If/Loop steps split the
plan: the control runs on the host between graph launches (reported by the compiler).
"""
from __future__ import annotations

import numpy as np

from ... import dtypes
from ...errors import BackendError
from ..walker import run_if, run_loop
from .blas import apply_views
from .driver import Device, KernelArgs, call

def select_code(bundle, device) -> tuple:
    """-> (image bytes, 'cubin sm_90' | 'ptx compute_90'); a clear error when nothing fits."""
    cuda = bundle.manifest.get("cuda")
    if not cuda:
        raise BackendError("this bundle has no GPU code (compiled without NVRTC or with --no-gpu); "
                           "recompile it with `grapec compile --target " + device.arch + "`, or use --backend cpu")
    major, minor = device.cc
    fits = [t for t in cuda["targets"] if int(t[3:-1]) == major and int(t[-1]) <= minor]
    if fits:
        best = max(fits, key=lambda t: int(t[3:]))
        return bundle.extra_sections[f"cubin.{best}"], f"cubin {best}"
    ptx = cuda.get("ptx")
    if ptx and int(ptx.split("_")[1]) <= major * 10 + minor:
        return bundle.extra_sections[f"ptx.{ptx}"], f"ptx {ptx}"
    have = ", ".join(cuda["targets"]) + (f" and PTX {ptx}" if ptx else ", no PTX")
    raise BackendError(f"this bundle's GPU code is for {have}; this GPU ({device.name}) is {device.arch}: "
                       f"recompile with `grapec compile --target {device.arch}`")


class _Segment:
    """A run of kernel/library steps as one instantiated CUDA graph."""

    def __init__(self, exec_, n_nodes):
        self.exec = exec_
        self.n_nodes = n_nodes


class CudaPlanRunner:
    def __init__(self, bundle, device: int = 0, tf32: bool = False):
        self.bundle = bundle
        self.dev = Device(device)
        image, self.code = select_code(bundle, self.dev)
        try:
            self.module = call("cuModuleLoadData", image)
        except BackendError as e:
            if "PTX" in str(e) or "UNSUPPORTED" in str(e):
                raise BackendError(f"the driver cannot load this bundle's {self.code}: {e}. PTX needs a driver at least "
                                   f"as new as the NVRTC that made it ({bundle.manifest['cuda'].get('nvrtc')}); "
                                   f"recompile with --target {self.dev.arch} for a cubin") from None
            raise
        names = bundle.manifest["cuda"]["kernels"]
        by_name: dict = {}
        for n in names:   # identical kernels share one function
            if n not in by_name:
                by_name[n] = call("cuModuleGetFunction", self.module, n.encode())
        self.functions = [by_name[n] for n in names]
        self.launches = bundle.manifest["cuda"].get("launch")   # [mode, grid, block, split] per kernel
        if self.launches is None:
            raise BackendError("this bundle was made by an older grapec (no kernel launch shapes); recompile it")
        self.scalars = bundle.manifest["cuda"].get("scalars") or [[] for _ in names]   # size arguments
        self.weights = self.dev.alloc(len(bundle.weights), "weights")
        self.dev.upload(self.weights, bundle.weights, len(bundle.weights))
        self.arena_bytes = max((p["arena_bytes"] for p in bundle.plans), default=0)
        self.arena = self.dev.alloc(self.arena_bytes, "the activation arena")
        self.blas = None
        self.tf32 = tf32
        self._graphs: dict = {}
        self._keep: list = []
        self._pending: list = []

    def close(self):
        """Give the device memory and graphs back (also done when the session is collected)."""
        if getattr(self, "dev", None) is None:
            return
        for items in self._graphs.values():
            for it in items:
                if isinstance(it, _Segment):
                    call("cuGraphExecDestroy", it.exec)
        self._graphs.clear()
        for p in (getattr(self, "arena", 0), getattr(self, "weights", 0)):
            self.dev.free(p)
        self.arena = self.weights = 0
        if getattr(self, "module", None) is not None:
            call("cuModuleUnload", self.module)
            self.module = None
        call("cuStreamDestroy", self.dev.stream)
        self.dev = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown: the driver may be gone already
            pass

    # --- addresses -------------------------------------------------------------------------------
    def ptr(self, bucket: int, b: int) -> int:
        name, space, off, nbytes, dt, shape = self.bundle.plans[bucket]["buffers"][b]
        return (self.arena if space == "arena" else self.weights) + off

    # --- building graphs -------------------------------------------------------------------------
    def program(self, bucket: int, steps: list) -> list:
        """Steps -> [segment | control step], built once per step list."""
        key = (bucket, id(steps))
        if key not in self._graphs:
            items, run = [], []
            for st in steps:
                if st["op"] in ("kernel", "library"):
                    run.append(st)
                    continue
                if run:
                    items.append(self._segment(bucket, run))
                    run = []
                items.append(st)
            if run:
                items.append(self._segment(bucket, run))
            self._graphs[key] = items
        return self._graphs[key]

    def _segment(self, bucket: int, steps: list) -> _Segment:
        from cuda.bindings import driver
        graph = call("cuGraphCreate", 0)
        prev = []
        bufs = self.bundle.plans[bucket]["buffers"]
        for st in steps:
            if st["op"] == "kernel":
                _, grid, block, _ = self.launches[st["kernel"]]
                args = KernelArgs([self.ptr(bucket, st["out"])] + [self.ptr(bucket, a) for a in st["args"]],
                                  self.scalars[st["kernel"]])
                self._keep.append(args)
                p = driver.CUDA_KERNEL_NODE_PARAMS()
                p.func = self.functions[st["kernel"]]
                p.gridDimX, p.gridDimY, p.gridDimZ = grid, 1, 1
                p.blockDimX, p.blockDimY, p.blockDimZ = block, 1, 1
                p.sharedMemBytes = 0
                p.kernelParams = args.address
                node = call("cuGraphAddKernelNode", graph, prev, len(prev), p)
            else:
                node = self._library_node(graph, prev, bucket, st, bufs)
            prev = [node]
        exec_ = call("cuGraphInstantiate", graph, 0)
        self._keep.append(graph)
        return _Segment(exec_, len(steps))

    def _library_node(self, graph, prev, bucket, st, bufs):
        attrs = st["attrs"]
        if attrs["op"] != "matmul":
            raise BackendError(f"library op '{attrs['op']}' (from ONNX node(s) {', '.join(st['origin'])}) has no GPU "
                               "implementation in this grapec yet")
        if self.blas is None:
            from .blas import shared_blas
            self.blas = shared_blas(self.dev, tf32=self.tf32)
        args = [a for a in st["args"]]
        shapes = [bufs[a][5] if a >= 0 else None for a in args]
        ptrs = [self.ptr(bucket, a) if a >= 0 else 0 for a in args]
        out = bufs[st["out"]]
        out_shape, out_ptr, layouts = apply_views(attrs, shapes, ptrs, out[5], self.ptr(bucket, st["out"]), out[4])
        child = self.blas.matmul_graph(attrs, shapes, out[4], ptrs, out_shape, out_ptr, layouts)
        self._keep.append(child)
        return call("cuGraphAddChildGraphNode", graph, prev, len(prev), child)

    # --- running ---------------------------------------------------------------------------------
    def execute(self, bucket: int, steps: list):
        for item in self.program(bucket, steps):
            if isinstance(item, _Segment):
                call("cuGraphLaunch", item.exec, self.dev.stream)
            elif item["op"] == "if":
                run_if(item, _BucketMemory(self, bucket), lambda steps: self.execute(bucket, steps))
            else:
                run_loop(item, _BucketMemory(self, bucket), lambda steps: self.execute(bucket, steps))

    def _copy(self, bucket, src, dst):
        nb = self.bundle.plans[bucket]["buffers"][dst][3]
        if nb and self.ptr(bucket, src) != self.ptr(bucket, dst):
            call("cuMemcpyDtoDAsync", self.ptr(bucket, dst), self.ptr(bucket, src), nb, self.dev.stream)

    def _read(self, bucket, b) -> np.ndarray:
        name, space, off, nbytes, dt, shape = self.bundle.plans[bucket]["buffers"][b]
        out = np.empty(shape, dtypes.np_dtype(dt))
        self.dev.synchronize()
        self.dev.download(out.ctypes.data, self.ptr(bucket, b), nbytes)
        return out

    def _write(self, bucket, b, arr: np.ndarray):
        arr = np.ascontiguousarray(arr)
        self.dev.synchronize()
        self.dev.upload(self.ptr(bucket, b), arr.ctypes.data, arr.nbytes)

    def feed(self, bucket: int, name: str, b: int, value):
        row = self.bundle.plans[bucket]["buffers"][b]
        cai = getattr(value, "__cuda_array_interface__", None)
        if cai is not None:
            if int(cai["data"][0]) != self.ptr(bucket, b):   # not already the graph's own buffer
                call("cuMemcpyDtoDAsync", self.ptr(bucket, b), int(cai["data"][0]), row[3], self.dev.stream)
        else:
            a = np.ascontiguousarray(value)
            call("cuMemcpyHtoDAsync", self.ptr(bucket, b), a.ctypes.data, a.nbytes, self.dev.stream)
            self._pending.append(a)   # the async copy may read it after we return

    def run(self, bucket: int, feeds: dict, on_device: bool = False) -> dict:
        plan = self.bundle.plans[bucket]
        self._pending = []
        for name, b in plan["inputs"]:
            self.feed(bucket, name, b, feeds[name])
        self.execute(bucket, plan["steps"])
        if on_device:
            return {name: DeviceArray(self.ptr(bucket, b), plan["buffers"][b][5], plan["buffers"][b][4])
                    for name, b in plan["outputs"]}
        return {name: self._read(bucket, b) for name, b in plan["outputs"]}

    def input_buffer(self, bucket: int, name: str):
        plan = self.bundle.plans[bucket]
        b = dict(plan["inputs"])[name]
        return DeviceArray(self.ptr(bucket, b), plan["buffers"][b][5], plan["buffers"][b][4])


class _BucketMemory:
    """The host-control interface (runtime/control.py) over one bucket's device buffers."""

    def __init__(self, runner: CudaPlanRunner, bucket: int):
        self.r, self.bucket = runner, bucket

    def scalar(self, b):
        return self.r._read(self.bucket, b).reshape(-1)[0]

    def set(self, b, arr):
        dt = dtypes.np_dtype(self.r.bundle.plans[self.bucket]["buffers"][b][4])
        self.r._write(self.bucket, b, np.asarray(arr, dt))

    def snapshot(self, b):
        return self.r._read(self.bucket, b)

    def copy(self, src, dst):
        self.r._copy(self.bucket, src, dst)

    def copy_row(self, src, dst, i):
        nb = self.r.bundle.plans[self.bucket]["buffers"][src][3]
        call("cuMemcpyDtoDAsync", self.r.ptr(self.bucket, dst) + i * nb, self.r.ptr(self.bucket, src), nb,
             self.r.dev.stream)


class DeviceArray:
    """A view of device memory in the arena, for zero-copy interop (__cuda_array_interface__)."""

    def __init__(self, ptr: int, shape, dtype: str):
        self.ptr, self.shape, self.dtype = ptr, tuple(shape), dtype

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": dtypes.np_dtype(self.dtype).str, "data": (self.ptr, False),
                "version": 3, "strides": None}
