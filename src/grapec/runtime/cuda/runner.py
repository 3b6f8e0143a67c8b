"""The CUDA backend: a plan replayed as CUDA graphs built explicitly from its steps (graph.py).

At load: pick the bundle's code for this GPU (a cubin of the same major architecture, else PTX),
load the module (and the conditional-node setter kernels where the plan has graphed regions),
upload the weights once, allocate one arena shared by all buckets. A bucket's graph is built on
its first run and kept, for at most `max_graphs` buckets and `graph_memory` bytes of instantiated
graphs (a range of sizes may have hundreds): the least recently run bucket gives way, and where
its graph has the shape of the new one its exec is patched in place (cuGraphExecUpdate: new
kernel arguments, grids and functions) instead of a new one being instantiated. Graphed If/Loop
regions are conditional nodes inside the graph, so such a model replays as one cuGraphLaunch; a
host-driven region (--host-control) splits the plan, and its control runs on the host between
launches through the walker the CPU backend uses (runtime/walker.py).
"""
from __future__ import annotations

import os
from collections import Counter, OrderedDict

import numpy as np

from ... import dtypes
from ...devices import check_fits
from ...errors import BackendError
from ...plan import REGIONS, step_deps, walk_steps
from ..walker import run_region
from .binding import ZeroCopy
from .driver import Device, call
from .graph import GraphBuilder, edge_counts

# Conditional IF nodes with an else body need CUDA 12.8 (WHILE and plain IF came with 12.4).
CONDITIONAL_DRIVER = 12080
# Programmatic edges between the kernel nodes of a graph came with CUDA 12.3.
DEPENDENT_LAUNCH_DRIVER = 12030


def runs_here(arch: str, cc: tuple) -> bool:
    """A cubin for sm_XY runs on a GPU of the same major version and at least its minor version."""
    return int(arch[3:-1]) == cc[0] and int(arch[-1]) <= cc[1]


def select_code(bundle, device) -> tuple:
    """-> (image bytes, 'cubin sm_90' | 'ptx compute_90'); a clear error when nothing fits."""
    cuda = bundle.manifest.get("cuda")
    if not cuda:
        raise BackendError("this bundle has no GPU code (compiled without NVRTC or with --no-gpu); "
                           "recompile it with `grapec compile --target " + device.arch + "`, or use --backend cpu")
    major, minor = device.cc
    fits = [t for t in cuda["targets"] if runs_here(t, device.cc)]
    if fits:
        best = max(fits, key=lambda t: int(t[3:]))
        return bundle.extra_sections[f"cubin.{best}"], f"cubin {best}"
    ptx = cuda.get("ptx")
    if ptx and int(ptx.split("_")[1]) <= major * 10 + minor:
        return bundle.extra_sections[f"ptx.{ptx}"], f"ptx {ptx}"
    have = ", ".join(cuda["targets"]) + (f" and PTX {ptx}" if ptx else ", no PTX")
    raise BackendError(f"this bundle's GPU code is for {have}; this GPU ({device.name}) is {device.arch}: "
                       f"recompile with `grapec compile --target {device.arch}`")


def uses_dependent_launch(bundle, code: str, cc: tuple) -> bool:
    """Join kernel nodes by programmatic edges (graph.py)? Only where every kernel of the loaded code
    waits for its predecessor: a bundle that says so (codegen/build.py), code for sm_90 or newer (below
    it the wait compiles to nothing), a Hopper-or-newer GPU and driver. GRAPEC_DEPENDENT_LAUNCH=0 turns
    it off (benchmarks/graph_options.py measures both)."""
    if os.environ.get("GRAPEC_DEPENDENT_LAUNCH", "1") == "0" or not bundle.manifest["cuda"].get("dependent_launch"):
        return False
    code_arch = int(code.rsplit("_", 1)[1])
    return code_arch >= 90 and cc[0] >= 9 and call("cuDriverGetVersion") >= DEPENDENT_LAUNCH_DRIVER


# Buckets whose graphs stay instantiated at once, by default. An exec of GPT-2 (about 300 nodes) takes
# about 2.6 MiB of device memory; a switch to a bucket not kept costs a graph build and a patch.
MAX_GRAPHS = 8
EXEC_BYTES_PER_NODE = 3 * 1024   # about what an instantiated kernel node takes on the device (DESIGN.md)


class _Segment:
    """A run of steps (graphed regions included) as one instantiated CUDA graph: steps[first:] of its
    list have the nodes `nodes`; `own` says the exec was instantiated from this very graph (not a
    spare exec updated to it), which per-node updates of the exec need (binding.py)."""

    def __init__(self, graph, exec_, own: bool, first: int = 0, nodes: list | None = None):
        self.graph, self.exec, self.own, self.first, self.nodes = graph, exec_, own, first, nodes or []


class _Built:
    """A bucket with graphs: its plan (kept, so the step lists the graphs were built from stay the
    same objects), what its nodes point at, and the device memory its execs took."""

    def __init__(self, plan):
        self.plan, self.kept, self.exec_bytes = plan, [], 0
        self.moved: dict = {}   # storage buffer -> the caller's pointer its nodes use now (binding.py)


class CudaPlanRunner:
    def __init__(self, bundle, device: int = 0, tf32: bool = False, max_graphs: int | None = None,
                 graph_memory: int | None = None):
        self.bundle = bundle
        self.max_graphs = max(1, max_graphs or MAX_GRAPHS)
        self.graph_memory = graph_memory   # bytes of instantiated graphs to stay under (None: no limit)
        self._built: OrderedDict = OrderedDict()   # bucket -> _Built, least recently run first
        self._spare = None      # an evicted bucket's exec, offered to the next segment built
        self.switches = Counter()   # "instantiated", "patched", "evicted": what bucket switches cost
        self.dev = Device(device)
        image, self.code = select_code(bundle, self.dev)
        self.module = self._load(image, self.code)
        names = bundle.manifest["cuda"]["kernels"]
        by_name: dict = {}
        for n in names:   # identical kernels share one function
            if n not in by_name:
                by_name[n] = call("cuModuleGetFunction", self.module, n.encode())
        self.functions = [by_name[n] for n in names]
        self._extra: dict = {}
        self.launches = bundle.manifest["cuda"].get("launch")   # [mode, grid, block, split] per kernel
        if self.launches is None:
            raise BackendError("this bundle was made by an older grapec (no kernel launch shapes); recompile it")
        self.scalars = bundle.manifest["cuda"].get("scalars") or [[] for _ in names]   # size arguments
        self.control = self._control_module(bundle)
        check_fits({"weights": len(bundle.weights), "activation arena": bundle.largest_arena()},
                   self.dev.mem_info()[0], f"free GPU memory on {self.dev.name}")
        self.weights = self.dev.alloc(len(bundle.weights), "weights")
        self.dev.upload(self.weights, bundle.weights, len(bundle.weights))
        self.arena_bytes = bundle.largest_arena()
        self.arena = self.dev.alloc(self.arena_bytes, "the activation arena")
        self.blas = None
        self.tf32 = tf32
        self._graphs: dict = {}
        self._loose: list = []
        self._pending: list = []
        # a captured cuBLASLt call of one kernel becomes a plain kernel node, not a child graph: 1-2% per
        # replay on the zoo (benchmarks/graph_options.py); GRAPEC_FLAT_GEMMS=0 keeps child graphs
        self.flat_gemms = os.environ.get("GRAPEC_FLAT_GEMMS", "1") != "0"
        self.dependent_launch = uses_dependent_launch(bundle, self.code, self.dev.cc)
        self.zero_copy = ZeroCopy(self)   # caller buffers bound to inputs and outputs (IOBinding)
        self.tuning = False   # True while a bucket's graphs are built ahead of its run (GEMM tuning may write the arena)
        self.launched = 0   # cuGraphLaunch calls of the last run: 1 for a fully graphed plan; host-driven
                            # loops launch their body once per iteration

    def _load(self, image, what):
        try:
            return call("cuModuleLoadData", image)
        except BackendError as e:
            if "PTX" in str(e) or "UNSUPPORTED" in str(e):
                raise BackendError(f"the driver cannot load this bundle's {what}: {e}. PTX needs a driver at least "
                                   f"as new as the NVRTC that made it ({self.bundle.manifest['cuda'].get('nvrtc')}); "
                                   f"recompile with --target {self.dev.arch} for a cubin") from None
            raise

    def _control_module(self, bundle):
        """The setter kernels of graphed If/Loop regions: a linked cubin for this GPU, and a driver
        that has conditional nodes. Either missing is a clear error, not a silent host fallback."""
        if not bundle.manifest["cuda"].get("control"):   # codegen/build.py: some plan has a graphed region
            return None
        fits = [k for k in bundle.extra_sections if k.startswith("control.sm_")
                and runs_here(k[len("control."):], self.dev.cc)]
        if not fits:
            raise BackendError(f"this bundle runs If/Loop inside the CUDA graph but has no setter kernels for "
                               f"{self.dev.arch}: recompile with --target {self.dev.arch} (or --host-control)")
        version = call("cuDriverGetVersion")
        if version < CONDITIONAL_DRIVER:
            raise BackendError(f"this bundle runs If/Loop as CUDA conditional nodes, which need a driver for CUDA "
                               f"12.8 or newer (this one is {version // 1000}.{version % 1000 // 10}); update the "
                               "driver or recompile with --host-control")
        return self._load(bundle.extra_sections[max(fits, key=lambda k: int(k[len("control.sm_"):]))],
                          "If/Loop setter kernels")

    def function(self, name: str):
        if name not in self._extra:
            self._extra[name] = call("cuModuleGetFunction", self.module, name.encode())
        return self._extra[name]

    def control_function(self, name: str):
        key = "control:" + name
        if key not in self._extra:
            self._extra[key] = call("cuModuleGetFunction", self.control, name.encode())
        return self._extra[key]

    def keep(self, bucket: int, obj):
        """Keep alive what a graph node points at (kernel arguments, captured child graphs), for as
        long as the bucket keeps its graphs (or the runner lives, for a graph built outside them)."""
        built = self._built.get(bucket)
        (built.kept if built is not None else self._loose).append(obj)

    def plan(self, bucket: int):
        """The bucket's plan: the one its graphs were built from while it has graphs."""
        built = self._built.get(bucket)
        return built.plan if built is not None else self.bundle.plans[bucket]

    def blas_for_graphs(self):
        if self.blas is None:
            from .blas import shared_blas
            self.blas = shared_blas(self.dev, tf32=self.tf32)
        return self.blas

    def close(self):
        """Give the device memory and graphs back (also done when the session is collected)."""
        if getattr(self, "dev", None) is None:
            return
        for bucket in list(self._built):
            self._evict(bucket, spare=False)
        for p in (getattr(self, "arena", 0), getattr(self, "weights", 0)):
            self.dev.free(p)
        self.arena = self.weights = 0
        for attr in ("module", "control"):
            if getattr(self, attr, None) is not None:
                call("cuModuleUnload", getattr(self, attr))
                setattr(self, attr, None)
        call("cuStreamDestroy", self.dev.stream)
        self.dev = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown: the driver may be gone already
            pass

    # --- addresses -------------------------------------------------------------------------------
    def ptr(self, bucket: int, b: int) -> int:
        buf = self.plan(bucket).buffers[b]
        return (self.arena if buf.space == "arena" else self.weights) + buf.offset

    # --- building graphs -------------------------------------------------------------------------
    def program(self, bucket: int, steps: list) -> list:
        """Steps -> [segment | host-driven region step], built once per step list."""
        key = (bucket, id(steps))
        if key not in self._graphs:
            items, first = [], 0
            for i, st in enumerate(steps + [None]):
                if st is None or (isinstance(st, REGIONS) and not st.graphed):
                    if i > first:
                        items.append(self._segment(bucket, steps, first, i))
                    if st is not None:
                        items.append(st)
                    first = i + 1
            self._graphs[key] = items
        return self._graphs[key]

    def prepare(self, bucket: int):
        """Build the bucket's graphs before its inputs are written: tuning a GEMM's algorithm at build
        time runs it on arena bytes, which may be an input's. Graphs built later (the bodies of
        host-driven regions, mid-run) keep cuBLASLt's first choice."""
        if bucket in self._built:
            self._built.move_to_end(bucket)
            return
        self.dev.synchronize()   # a run in flight still uses the arena (and maybe the exec patched next)
        self._make_room()
        built = self._built[bucket] = _Built(self.bundle.plans[bucket])
        free = call("cuMemGetInfo")[0]
        self.tuning = True
        try:
            self.program(bucket, built.plan.steps)
        finally:
            self.tuning = False
            self._drop_spare()
        # cuMemGetInfo moves in pages: a small graph reads as free, so count at least what a node costs
        nodes = sum(1 for _ in walk_steps(built.plan.steps))
        built.exec_bytes = max(free - call("cuMemGetInfo")[0], nodes * EXEC_BYTES_PER_NODE)

    def _make_room(self):
        """Evict least recently run buckets until one more fits; the first one's exec is kept spare,
        to be patched into the next segment built."""
        used = sum(b.exec_bytes for b in self._built.values())
        estimate = max((b.exec_bytes for b in self._built.values()), default=0)
        while self._built and (len(self._built) >= self.max_graphs or
                               (self.graph_memory is not None and used + estimate > self.graph_memory)):
            bucket, built = next(iter(self._built.items()))
            used -= built.exec_bytes
            self._evict(bucket, spare=self._spare is None)

    def _evict(self, bucket: int, spare: bool):
        built = self._built.pop(bucket)
        for key in [k for k in self._graphs if k[0] == bucket]:
            for it in self._graphs.pop(key):
                if isinstance(it, _Segment):
                    if spare and self._spare is None:
                        self._spare = it
                    else:
                        call("cuGraphExecDestroy", it.exec)
                        call("cuGraphDestroy", it.graph)
        built.kept.clear()
        self.switches["evicted"] += 1

    def _drop_spare(self):
        if self._spare is not None:
            call("cuGraphExecDestroy", self._spare.exec)
            call("cuGraphDestroy", self._spare.graph)
            self._spare = None

    def _instantiate(self, graph) -> tuple:
        """(exec, own) for graph: the spare exec patched where the graphs have the same shape (own:
        False), else a new one."""
        spare, self._spare = self._spare, None
        if spare is not None:
            try:
                call("cuGraphExecUpdate", spare.exec, graph)
                call("cuGraphDestroy", spare.graph)
                self.switches["patched"] += 1
                return spare.exec, False
            except BackendError:   # another topology: CUDA refuses the update, the exec goes
                call("cuGraphExecDestroy", spare.exec)
                call("cuGraphDestroy", spare.graph)
        self.switches["instantiated"] += 1
        return call("cuGraphInstantiate", graph, 0), True

    def own_exec(self, seg: _Segment):
        """Give a segment an exec instantiated from its own graph (per-node updates name the nodes of
        the graph an exec was instantiated from)."""
        if not seg.own:
            call("cuGraphExecDestroy", seg.exec)
            seg.exec, seg.own = call("cuGraphInstantiate", seg.graph, 0), True
            self.switches["instantiated"] += 1

    def _segment(self, bucket: int, steps: list, first: int, end: int) -> _Segment:
        """steps[first:end] as one graph; what they wait for before `first` ran in an earlier launch."""
        graph = call("cuGraphCreate", 0)
        order = [[d - first for d in deps if d >= first] for deps in step_deps(steps)[first:end]]
        nodes: list = []
        GraphBuilder(self, bucket).add_steps(graph, steps[first:end], [], order=order, record=nodes)
        return _Segment(graph, *self._instantiate(graph), first, nodes)

    def segment_of(self, bucket: int, step: int) -> _Segment:
        """The segment holding top-level step `step` of the bucket's plan (its graphs built)."""
        for it in self._graphs[(bucket, id(self.plan(bucket).steps))]:
            if isinstance(it, _Segment) and it.first <= step < it.first + len(it.nodes):
                return it
        raise KeyError(step)

    def edge_counts(self) -> dict:
        """Edges of the graphs built so far, by kind ({"default": n, "programmatic": m}): how many
        kernels start while the one before them still runs."""
        total = {"default": 0, "programmatic": 0}
        for items in self._graphs.values():
            for it in items:
                if isinstance(it, _Segment):
                    for kind, n in edge_counts(it.graph).items():
                        total[kind] += n
        return total


    # --- running ---------------------------------------------------------------------------------
    def execute(self, bucket: int, steps: list):
        for item in self.program(bucket, steps):
            if isinstance(item, _Segment):
                call("cuGraphLaunch", item.exec, self.dev.stream)
                self.launched += 1
            else:
                run_region(item, _BucketMemory(self, bucket), lambda sub: self.execute(bucket, sub))

    def _read(self, bucket, b) -> np.ndarray:
        buf = self.plan(bucket).buffers[b]
        out = np.empty(buf.shape, dtypes.np_dtype(buf.dtype))
        self.dev.synchronize()
        self.dev.download(out.ctypes.data, self.ptr(bucket, b), buf.nbytes)
        return out

    def _write(self, bucket, b, arr: np.ndarray):
        arr = np.ascontiguousarray(arr)
        self.dev.synchronize()
        self.dev.upload(self.ptr(bucket, b), arr.ctypes.data, arr.nbytes)

    def feed(self, bucket: int, name: str, b: int, value):
        buf = self.plan(bucket).buffers[b]
        cai = getattr(value, "__cuda_array_interface__", None)
        if cai is not None:
            if int(cai["data"][0]) != self.ptr(bucket, b):   # not already the graph's own buffer
                call("cuMemcpyDtoDAsync", self.ptr(bucket, b), int(cai["data"][0]), buf.nbytes, self.dev.stream)
        else:
            a = np.ascontiguousarray(value)
            call("cuMemcpyHtoDAsync", self.ptr(bucket, b), a.ctypes.data, a.nbytes, self.dev.stream)
            self._pending.append(a)   # the async copy may read it after we return

    def run(self, bucket: int, feeds: dict, on_device: bool = False, bound: dict | None = None) -> dict:
        """feeds: input name -> host or device array, copied into the arena. bound (IOBinding): input
        and output name -> a caller's device pointer, patched into the graph or copied (binding.py);
        a bound output is returned as its pointer, the others as device arrays (on_device) or numpy."""
        self.dev.make_current()
        self._pending = []
        self.launched = 0
        self.prepare(bucket)
        plan = self.plan(bucket)
        binding, bound = bound is not None, bound or {}
        copy_in, copy_out = ({}, {}) if not bound and not self._built[bucket].moved else \
            self.zero_copy.plan_io(bucket, bound)
        for name, b in plan.inputs:
            if name in copy_in:
                call("cuMemcpyDtoDAsync", self.ptr(bucket, b), copy_in[name], plan.buffers[b].nbytes, self.dev.stream)
            elif name not in bound:
                self.feed(bucket, name, b, feeds[name])
        self.execute(bucket, plan.steps)
        for name, b in plan.outputs:
            if name in copy_out:
                call("cuMemcpyDtoDAsync", copy_out[name], self.ptr(bucket, b), plan.buffers[b].nbytes, self.dev.stream)
        if binding:
            self.dev.synchronize()   # IOBinding's outputs are ready when run returns (as onnxruntime's)
            return {name: bound[name] if name in bound else
                    DeviceArray(self.ptr(bucket, b), plan.buffers[b].shape, plan.buffers[b].dtype)
                    for name, b in plan.outputs}
        if on_device:
            return {name: DeviceArray(self.ptr(bucket, b), plan.buffers[b].shape, plan.buffers[b].dtype)
                    for name, b in plan.outputs}
        return {name: self._read(bucket, b) for name, b in plan.outputs}

    def input_buffer(self, bucket: int, name: str):
        self.dev.make_current()
        self.prepare(bucket)   # before the caller writes the buffer
        plan = self.plan(bucket)
        b = dict(plan.inputs)[name]
        return DeviceArray(self.ptr(bucket, b), plan.buffers[b].shape, plan.buffers[b].dtype)


class _BucketMemory:
    """The walker's view (runtime/walker.py) of one bucket's device buffers, for host-driven regions."""

    def __init__(self, runner: CudaPlanRunner, bucket: int):
        self.r, self.bucket = runner, bucket

    def scalar(self, b):
        return self.r._read(self.bucket, b).reshape(-1)[0]

    def set(self, b, value):
        buf = self.r.plan(self.bucket).buffers[b]
        self.r._write(self.bucket, b, np.asarray(value, dtypes.np_dtype(buf.dtype)).reshape(buf.shape))


class DeviceArray:
    """A view of device memory in the arena, for zero-copy interop (__cuda_array_interface__)."""

    def __init__(self, ptr: int, shape, dtype: str):
        self.ptr, self.shape, self.dtype = ptr, tuple(shape), dtype

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": dtypes.np_dtype(self.dtype).str, "data": (self.ptr, False),
                "version": 3, "strides": None}
