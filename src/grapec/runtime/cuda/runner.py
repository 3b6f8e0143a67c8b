"""The CUDA backend: a plan replayed as CUDA graphs built explicitly from its steps (graph.py).

A runner is one lane of execution over a loaded model (model.py: code and weights, shared): its own
stream, activation arena (one for all buckets), cuBLASLt workspaces and graphs. A session runs N
runs at once with N runners over one model (runtime/session.py).

In a bundle of several buckets (a --dynamic range, buckets), the buckets of one launch structure
share one exec (shared_exec.py; their sizes in device memory, size_record.py), so a switch between
them updates one node; every bucket's graph is kept on the host. `max_graphs`, where a user gives it,
caps those execs. Buckets that cannot share (If/Loop regions, stitched kernels, a bundle of one
bucket, or GRAPEC_SHARED_EXECS=0) have an exec each:
a bucket's graph is built on its first run and kept, for at most `max_graphs` buckets and
`graph_memory` bytes of instantiated graphs (a range of sizes may have hundreds): the least recently
run bucket gives way, and where its graph has the shape of the new one its exec is patched in place
(cuGraphExecUpdate: new kernel arguments, grids and functions) instead of a new one being
instantiated. The evicted bucket's graphs (not their execs) stay parked on the host, so a switch
back to it is one such patch, with no graph build and no GEMM tuning. Graphed If/Loop regions are
conditional nodes inside the graph, so such a model replays as one cuGraphLaunch; a host-driven
region (--host-control) splits the plan, and its control runs on the host between launches through
the walker the CPU backend uses (runtime/walker.py).
"""
from __future__ import annotations

import math
import os
import time
from collections import Counter, OrderedDict

import numpy as np

from ... import dtypes
from ...errors import BackendError
from ...plan import REGIONS, Stitch, step_deps, walk_steps
from ..walker import run_region
from .binding import ZeroCopy
from .driver import call, copy_rows_async
from .graph import GraphBuilder, edge_counts
from .model import CudaModel
from . import host_arrays, shared_exec, watcher
from .device_array import DeviceArray
from .family_exec import FamilyExecs

# Buckets whose graphs stay instantiated at once, by default. An exec of GPT-2 (about 300 nodes) takes
# about 2.6 MiB of device memory; a switch to a bucket not kept patches its parked graph into a kept exec
# (its first run builds the graph).
MAX_GRAPHS = 8
EXEC_BYTES_PER_NODE = 3 * 1024   # about what an instantiated kernel node takes on the device (DESIGN.md)


class _Segment:
    """A run of steps (graphed regions included) as one instantiated CUDA graph: steps[first:] of its
    list have the nodes `nodes`; `own` says the exec was instantiated from this very graph (not a
    spare exec updated to it), which per-node updates of the exec need (binding.py)."""

    def __init__(self, graph, exec_, own: bool, first: int = 0, nodes: list | None = None):
        self.graph, self.exec, self.own, self.first, self.nodes = graph, exec_, own, first, nodes or []
        self.exec_nodes = self.nodes   # the nodes that name exec's nodes (another graph's, for a shared exec)
        self.shared = False            # exec is its launch structure's (shared_exec.py), not this segment's own
        self.loader = None             # a shared exec's first node, which loads the size record (size_record.py)


class _Built:
    """A bucket with graphs: its plan (kept, so the step lists the graphs were built from stay the
    same objects), what its nodes point at, and the device memory its execs took."""

    def __init__(self, plan):
        self.plan, self.kept, self.exec_bytes = plan, [], 0
        self.moved: dict = {}   # storage buffer -> the caller's pointer its nodes use now (binding.py)


class CudaPlanRunner:
    """model: a CudaModel runners share (made for as many arenas as there will be runners: it checks
    them against free memory); without one, the runner loads the bundle on GPU `device` itself.
    owns_model (default: it loaded it): close gives the model back too."""

    def __init__(self, bundle, device: int = 0, tf32: bool = False, max_graphs: int | None = None,
                 graph_memory: int | None = None, model: CudaModel | None = None, owns_model: bool | None = None):
        self.bundle = bundle
        self.owns_model = model is None if owns_model is None else owns_model
        self.model = model = model or CudaModel(bundle, device, tf32)
        self.dev = model.dev
        self.dev.make_current()
        self.code, self.functions, self.launches, self.scalars = model.code, model.functions, model.launches, model.scalars
        self.weights, self.tf32, self.dependent_launch = model.weights, model.tf32, model.dependent_launch
        self.max_graphs = max(1, max_graphs or MAX_GRAPHS)
        # buckets of one launch structure share an exec (shared_exec.py); max_graphs, where given, caps them
        self.shared = shared_exec.SharedExecs(self, max_graphs) if shared_exec.enabled() else None
        self._shareable: dict = {}   # bucket -> whether its plan can share its structure's exec
        # the sizes of large range families run from their formulas, an exec per band (family_exec.py)
        self.families = FamilyExecs(self) if getattr(getattr(bundle.plans, "docs", None), "families", None) else None
        self.graph_memory = graph_memory   # bytes of instantiated graphs to stay under (None: no limit)
        self._built: OrderedDict = OrderedDict()   # bucket -> _Built, least recently run first
        self._spare = None      # an evicted bucket's exec, offered to the next segment built
        # bucket -> (what its nodes point at, {program key: items}): the graphs of evicted buckets, kept
        # (graph objects, no execs) so that a switch back costs a patch only
        self._parked: dict = {}
        self._shapes: dict = {}   # bucket -> graph_shape
        self._structures: dict = {}   # bucket -> structure_of
        # GRAPEC_SPARE_BY_SHAPE=0: the spare exec is the least recently run bucket's, whatever its shape (a baseline)
        self.spare_by_shape = os.environ.get("GRAPEC_SPARE_BY_SHAPE", "1") != "0"
        self.switches = Counter()   # "instantiated", "patched", "evicted", "restored": what switches cost;
        # "sibling_nodes": range families' variant kernels of another launch shape than their node (family_exec.py)
        self.restore_seconds = 0.0  # host time of the restores (a parked bucket's graphs into an exec)
        self.arena_bytes = bundle.largest_arena()
        self.arena = self.dev.alloc(self.arena_bytes, "the activation arena")
        self.stream = call("cuStreamCreate", 0)
        self.blas = None
        self.dnn = None
        from .blas import Workspaces
        self.host_arrays = host_arrays.for_device(self.dev)   # outputs copied into page-locked memory
        self.workspaces = Workspaces(self.dev)   # this lane's: GEMMs of two lanes may run at once
        self._graphs: dict = {}
        self._counters: dict = {}   # (bucket, first step) -> device pointer of a stitch's barrier counter
        self._loose: list = []
        self._pending: list = []
        # a captured cuBLASLt call of one kernel becomes a plain kernel node, not a child graph: 1-2% per
        # replay on the zoo (benchmarks/graph_options.py); GRAPEC_FLAT_GEMMS=0 keeps child graphs
        self.flat_gemms = os.environ.get("GRAPEC_FLAT_GEMMS", "1") != "0"
        self.zero_copy = ZeroCopy(self)   # caller buffers bound to inputs and outputs (IOBinding)
        self.tuning = False   # True while a bucket's graphs are built ahead of its run (GEMM tuning may write the arena)
        self.launched = 0   # cuGraphLaunch calls of the last run: 1 for a fully graphed plan; host-driven
                            # loops launch their body once per iteration

    def function(self, name: str):
        return self.model.function(name)

    def control_function(self, name: str):
        return self.model.control_function(name)

    def synchronize(self):
        """Wait for this runner's stream (its last run)."""
        call("cuStreamSynchronize", self.stream)

    def stitch_counter(self, bucket: int, first: int) -> int:
        """The grid-barrier counter of the bucket's stitch at step `first` (codegen/grid_stitch.py): 8
        bytes of this runner's, zeroed once; its launches only ever add to it."""
        key = (bucket, first)
        if key not in self._counters:
            ptr = self.dev.alloc(8, "a grid-barrier counter")
            call("cuMemsetD8", ptr, 0, 8)
            self._counters[key] = ptr
        return self._counters[key]

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

    def dnn_for_graphs(self):
        if self.dnn is None:
            from .dnn import shared_dnn
            self.dnn = shared_dnn(self.dev, tf32=self.tf32)
        return self.dnn

    def close(self):
        """Give the device memory and graphs back (also done when the session is collected); the
        model too where this runner loaded it."""
        if getattr(self, "dev", None) is None:
            return
        self.dev.make_current()
        if self.shared is not None:
            self.shared.close()
        if self.families is not None:
            self.families.close()
        for bucket in list(self._built):
            self._evict(bucket, spare=False, park=False)
        for _, programs in self._parked.values():
            for items in programs.values():
                for it in items:
                    if isinstance(it, _Segment):
                        call("cuGraphDestroy", it.graph)
        self._parked = {}
        self.dev.free(getattr(self, "arena", 0))
        self.arena = 0
        for ptr in getattr(self, "_counters", {}).values():
            self.dev.free(ptr)
        self._counters = {}
        if getattr(self, "workspaces", None) is not None:
            self.workspaces.free()
        if getattr(self, "stream", None) is not None:
            call("cuStreamDestroy", self.stream)
            self.stream = None
        if self.owns_model:
            self.model.close()
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
        host-driven regions, mid-run) keep cuBLASLt's first choice. A bucket evicted before gets its
        parked graphs back, patched into the spare exec: no build, no tuning."""
        if self.families is not None and self.families.owns(bucket):
            self.families.prepare(bucket)
            return
        if self._shares(bucket):
            self.shared.take(bucket, self._build_shared(bucket))
            return
        if bucket in self._built:
            self._built.move_to_end(bucket)
            return
        self.synchronize()   # a run in flight still uses the arena (and maybe the exec patched next)
        self._make_room(bucket)
        built = self._built[bucket] = _Built(self.bundle.plans[bucket])
        free = call("cuMemGetInfo")[0]
        try:
            if bucket in self._parked:
                t0 = time.perf_counter()
                self._restore(bucket, built)
                self.restore_seconds += time.perf_counter() - t0
            else:
                self.tuning = True
                self.program(bucket, built.plan.steps)
        finally:
            self.tuning = False
            self._drop_spare()
        # cuMemGetInfo moves in pages: a small graph reads as free, so count at least what a node costs
        nodes = sum(1 for _ in walk_steps(built.plan.steps))
        built.exec_bytes = max(free - call("cuMemGetInfo")[0], nodes * EXEC_BYTES_PER_NODE)

    def _shares(self, bucket: int) -> bool:
        if self.shared is None:
            return False
        if bucket not in self._shareable:
            # a bundle of one bucket keeps an exec of its own, and so does one without sized twins (made
            # by an older grapec, or with nothing merged across buckets): without size records a switch
            # would update node after node, which costs more than updating the whole graph
            plan = self.bundle.plans[bucket]
            self._shareable[bucket] = (len(self.bundle.plans) > 1 and bool(self.bundle.manifest["cuda"].get("sized"))
                                       and bool(plan.steps) and self.shared.eligible(plan))
        return self._shareable[bucket]

    def _build_shared(self, bucket: int) -> _Segment:
        """The bucket's graph, built once and kept (not instantiated: its structure's exec runs it)."""
        built = self._built.get(bucket)
        if built is None:
            self.synchronize()   # GEMM tuning at build time runs on the arena
            built = self._built[bucket] = _Built(self.bundle.plans[bucket])
            steps = built.plan.steps
            self.tuning = True
            try:
                self._graphs[(bucket, id(steps))] = [self._segment(bucket, steps, 0, len(steps), instantiate=False)]
            finally:
                self.tuning = False
        return self._graphs[(bucket, id(built.plan.steps))][0]

    def sized_launch(self, bucket: int, st):
        """A shared exec's kernel step with its numbers in device memory (size_record.py), or None."""
        if self.families is not None and self.families.owns(bucket):
            return self.families.sized_launch(bucket, st)
        return self.shared.sized_launch(bucket, st) if self._shares(bucket) else None

    def library_shapes(self, bucket: int, st):
        """(argument shapes, output shape) a library step runs at other than its own: a range family's
        (family_exec.py), or a shared exec's GEMM at its structure's widest rows; None: its own."""
        if self.families is not None and self.families.owns(bucket):
            return self.families.library_shapes(bucket, st)
        return self.widest_gemm(bucket, st) if st.attrs.get("op") == "matmul" else None

    def widest_gemm(self, bucket: int, st):
        """A shared exec's GEMM step run at its structure's widest rows (shared_exec.py), or None."""
        if not self._shares(bucket) or os.environ.get("GRAPEC_WIDEST_GEMMS", "1") == "0":
            return None
        return self.shared.widest_gemm(bucket, st)

    def segments(self, bucket: int) -> list:
        return [it for k, items in self._graphs.items() if k[0] == bucket for it in items if isinstance(it, _Segment)]

    @property
    def switch_us(self) -> float:
        """Mean host time of a switch, in microseconds: between buckets of one shared exec, or (each
        bucket its own exec) of a parked bucket's graphs patched into a kept exec."""
        if self.shared is not None:
            parts = [(self.shared.switch_seconds, self.shared.switch_count)]
            if self.families is not None:
                parts.append((self.families.switch_seconds, self.families.switch_count))
            n = sum(c for _, c in parts)
            return sum(t for t, _ in parts) / n * 1e6 if n else 0.0
        n = self.switches["restored"]
        return self.restore_seconds / n * 1e6 if n else 0.0

    def build_all(self, progress=None) -> int:
        """Every bucket's graphs built (Session.build_graphs); buckets that share their structure's
        exec keep their graphs on the host, the others beyond max_graphs are parked. -> buckets built."""
        buckets = self.own_buckets()
        bands = self.families.bands() if self.families is not None else []
        total = len(buckets) + len(bands)
        for i, bucket in enumerate(buckets):
            if self._shares(bucket):
                self._build_shared(bucket)
            else:
                self.prepare(bucket)
            if progress is not None:
                progress(i + 1, total)
        for bucket in buckets:   # every structure's exec instantiated now, not on a request
            if self._shares(bucket):
                self.prepare(bucket)
        if self.families is not None:
            self.families.build_all(progress, len(buckets), total)
            self.families.switch_seconds, self.families.switch_count = 0.0, 0
        if self.shared is not None:
            self.shared.reset_switch_time()
        return len(self.bundle.plans)

    def own_buckets(self) -> list:
        """The buckets with plans of their own here: all but a large range family's (family_exec.py)."""
        n = len(self.bundle.plans)
        if self.families is None or not self.families.owner:
            return list(range(n))
        return [b for b in range(n) if not self.families.owns(b)]

    def _restore(self, bucket: int, built: _Built):
        """A parked bucket's graphs instantiated again (the spare exec patched where it fits)."""
        built.kept, programs = self._parked.pop(bucket)
        for key, items in programs.items():
            for it in items:
                if isinstance(it, _Segment):
                    it.exec, it.own = self._instantiate(it.graph)
            self._graphs[key] = items
        self.switches["restored"] += 1

    def _make_room(self, bucket: int):
        """Evict least recently run buckets until one more fits. The first one gives its exec as the
        spare, to be patched into the incoming bucket's graph: so it is, where one is built, the least
        recently run bucket whose graph has the incoming one's shape (CUDA refuses to patch across
        shapes, and a new exec costs an instantiation)."""
        own = [b for b in self._built if not self._shares(b)]
        used = sum(self._built[b].exec_bytes for b in own)
        estimate = max((self._built[b].exec_bytes for b in own), default=0)
        while own and (len(own) >= self.max_graphs or
                       (self.graph_memory is not None and used + estimate > self.graph_memory)):
            victim = own[0]
            if self._spare is None and self.spare_by_shape:
                shape = self.graph_shape(bucket)
                victim = next((b for b in own if self.graph_shape(b) == shape), victim)
            own.remove(victim)
            used -= self._built[victim].exec_bytes
            self._evict(victim, spare=self._spare is None)

    def graph_shape(self, bucket: int) -> tuple:
        """What a graph exec can be patched across (cuGraphExecUpdate): shared_exec.graph_shape."""
        if bucket not in self._shapes:
            self._shapes[bucket] = shared_exec.graph_shape(self.bundle.plans[bucket])
        return self._shapes[bucket]

    def structure_of(self, bucket: int) -> tuple:
        """What the bucket shares an exec with: its launch structure and band of sizes (shared_exec.exec_key)."""
        if bucket not in self._structures:
            self._structures[bucket] = shared_exec.exec_key(self.bundle, bucket, self.graph_shape(bucket))
        return self._structures[bucket]

    def members_of(self, key) -> list:
        """The buckets that share an exec key (structure_of)."""
        return shared_exec.members_of(self, key, self.own_buckets())

    def _evict(self, bucket: int, spare: bool, park: bool = True):
        """Give the bucket's execs back (one kept spare where asked); its graphs stay parked on the host
        (park), so that its next run patches them into an exec instead of building them again."""
        built = self._built.pop(bucket)
        programs = {key: self._graphs.pop(key) for key in [k for k in self._graphs if k[0] == bucket]}
        for items in programs.values():
            for it in items:
                if isinstance(it, _Segment):
                    if it.shared or it.exec is None:   # its structure's exec (shared_exec.py) is not its own
                        it.exec = None
                        if not park:
                            call("cuGraphDestroy", it.graph)
                        continue
                    if spare and self._spare is None:
                        self._spare = it.exec
                    else:
                        call("cuGraphExecDestroy", it.exec)
                    it.exec = None
                    if not park:
                        call("cuGraphDestroy", it.graph)
        if park:
            self._parked[bucket] = (built.kept, programs)
        else:
            built.kept.clear()
        self.switches["evicted"] += 1

    def _drop_spare(self):
        if self._spare is not None:
            call("cuGraphExecDestroy", self._spare)
            self._spare = None

    def _instantiate(self, graph) -> tuple:
        """(exec, own) for graph: the spare exec patched where the graphs have the same shape (own:
        False), else a new one."""
        spare, self._spare = self._spare, None
        if spare is not None:
            try:
                call("cuGraphExecUpdate", spare, graph)
                self.switches["patched"] += 1
                return spare, False
            except BackendError:   # another topology: CUDA refuses the update, the exec goes
                call("cuGraphExecDestroy", spare)
        self.switches["instantiated"] += 1
        return call("cuGraphInstantiate", graph, 0), True

    def own_exec(self, seg: _Segment):
        """Give a segment an exec instantiated from its own graph (per-node updates name the nodes of
        the graph an exec was instantiated from)."""
        if not seg.own:
            call("cuGraphExecDestroy", seg.exec)
            seg.exec, seg.own = call("cuGraphInstantiate", seg.graph, 0), True
            self.switches["instantiated"] += 1

    def _segment(self, bucket: int, steps: list, first: int, end: int, instantiate: bool = True) -> _Segment:
        """steps[first:end] as one graph; what they wait for before `first` ran in an earlier launch.
        instantiate=False: the graph only (a shared exec runs it: shared_exec.py)."""
        graph = call("cuGraphCreate", 0)
        order = [[d - first for d in deps if d >= first] for deps in step_deps(steps)[first:end]]
        nodes: list = []
        plan = self.plan(bucket)
        stitches = [Stitch(s.first - first, s.end - first, s.block) for s in plan.stitches
                    if first <= s.first and s.end <= end] if steps is plan.steps else []
        builder = GraphBuilder(self, bucket)
        load = self.shared.records.loader(bucket) if not instantiate and self._shares(bucket) else None
        loader = builder.kernel(graph, [], *load) if load is not None else None   # size_record.py: first
        builder.add_steps(graph, steps[first:end], [loader] if loader is not None else [], order=order, record=nodes,
                          stitches=stitches)
        if not instantiate:
            seg = _Segment(graph, None, False, first, nodes)
            seg.loader = loader
            return seg
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
    def execute(self, bucket: int, steps: list, progress=None):
        """progress: what a host-driven Loop of `steps` calls as it goes (runtime/walker.py)."""
        for item in self.program(bucket, steps):
            if isinstance(item, _Segment):
                call("cuGraphLaunch", item.exec, self.stream)
                self.launched += 1
            else:
                run_region(item, _BucketMemory(self, bucket), lambda sub: self.execute(bucket, sub), progress)

    def _read(self, bucket, b) -> np.ndarray:
        return self._download(bucket, [b])[0]

    def _download(self, bucket, bufs: list) -> list:
        plan = self.plan(bucket)
        return self.download([(plan.buffers[b], self.ptr(bucket, b)) for b in bufs])

    def download(self, places: list) -> list:
        """[(Buffer, its device pointer)] copied to new host arrays on this runner's stream, then waited for
        (every copy on the runner's own stream: the legacy stream would join another thread's stream capture)."""
        outs = [self.host_arrays.empty(buf.shape, dtypes.np_dtype(buf.dtype)) for buf, _ in places]
        for (buf, ptr), out in zip(places, outs):
            if out.nbytes:
                self.copy_buffer_out(buf, ptr, out.ctypes.data, host=True)
        self.synchronize()
        return outs

    def copy_buffer_out(self, buf, src: int, dst: int, host: bool):
        """buf's elements from src to dense memory at dst (host or device), on this runner's stream;
        padded rows (buf.pitch) are compacted by the copy itself."""
        if buf.pitch:
            isz = dtypes.itemsize(buf.dtype)
            copy_rows_async(dst, buf.shape[-1] * isz, src, buf.pitch * isz, buf.shape[-1] * isz,
                            math.prod(buf.shape[:-1]), self.stream, dst_host=host)
        else:
            call("cuMemcpyDtoHAsync" if host else "cuMemcpyDtoDAsync", dst, src, buf.nbytes, self.stream)

    def _write(self, bucket, b, arr: np.ndarray):
        arr = np.ascontiguousarray(arr)
        if arr.nbytes:
            call("cuMemcpyHtoDAsync", self.ptr(bucket, b), arr.ctypes.data, arr.nbytes, self.stream)
        self.synchronize()

    def feed(self, bucket: int, name: str, b: int, value):
        self.copy_array_in(self.ptr(bucket, b), self.plan(bucket).buffers[b].nbytes, value)

    def copy_array_in(self, dst: int, nbytes: int, value):
        """A host or device array's bytes to dst on this runner's stream (nothing where it already lies there)."""
        cai = getattr(value, "__cuda_array_interface__", None)
        if cai is not None:
            if int(cai["data"][0]) != dst:   # not already the graph's own buffer
                call("cuMemcpyDtoDAsync", dst, int(cai["data"][0]), nbytes, self.stream)
        else:
            a = np.ascontiguousarray(value)
            call("cuMemcpyHtoDAsync", dst, a.ctypes.data, a.nbytes, self.stream)
            self._pending.append(a)   # the async copy may read it after we return

    def release_host_copies(self):
        """Forget the host arrays kept alive for asynchronous copies (inputs, a switch's dims): a new run's stream
        work comes after theirs, so they have been read."""
        self._pending = []

    def run(self, bucket: int, feeds: dict, on_device: bool = False, bound: dict | None = None, watch=None) -> dict:
        """feeds: input name -> host or device array, copied into the arena. bound (IOBinding): input
        and output name -> a caller's device pointer, patched into the graph or copied (binding.py);
        a bound output is returned as its pointer, the others as device arrays (on_device) or numpy.
        watch (runtime/watch.py): a buffer copied to watch.on_value while the run goes (watcher.py)."""
        if self.families is not None and self.families.owns(bucket):
            return self.families.run(bucket, feeds, on_device, bound, watch)
        self.dev.make_current()
        self.release_host_copies()
        self.launched = 0
        self.prepare(bucket)
        plan = self.plan(bucket)
        binding, bound = bound is not None, bound or {}
        copy_in, copy_out = ({}, {}) if not bound and not self._built[bucket].moved else \
            self.zero_copy.plan_io(bucket, bound)
        for name, b in plan.inputs:
            if name in copy_in:
                call("cuMemcpyDtoDAsync", self.ptr(bucket, b), copy_in[name], plan.buffers[b].nbytes, self.stream)
            elif name not in bound:
                self.feed(bucket, name, b, feeds[name])
        progress = None
        if watch is not None:
            watcher.fill(self, bucket, watch)
            progress = lambda: watch.on_value(self._read(bucket, watch.buffer))  # noqa: E731
        self.execute(bucket, plan.steps, progress)
        if watch is not None:
            watcher.follow(self, bucket, watch)
        for name, b in plan.outputs:
            if name in copy_out:
                self.copy_buffer_out(plan.buffers[b], self.ptr(bucket, b), copy_out[name], host=False)
        if binding:
            self.synchronize()   # IOBinding's outputs are ready when run returns (as onnxruntime's)
            return {name: bound[name] if name in bound else DeviceArray.of(self.ptr(bucket, b), plan.buffers[b], self.stream)
                    for name, b in plan.outputs}
        if on_device:
            return {name: DeviceArray.of(self.ptr(bucket, b), plan.buffers[b], self.stream) for name, b in plan.outputs}
        return dict(zip([name for name, _ in plan.outputs], self._download(bucket, [b for _, b in plan.outputs])))

    def input_buffer(self, bucket: int, name: str):
        if self.families is not None and self.families.owns(bucket):
            return self.families.input_buffer(bucket, name)
        self.dev.make_current()
        self.prepare(bucket)   # before the caller writes the buffer
        plan = self.plan(bucket)
        b = dict(plan.inputs)[name]
        return DeviceArray(self.ptr(bucket, b), plan.buffers[b].shape, plan.buffers[b].dtype, self.stream)


class _BucketMemory:
    """The walker's view (runtime/walker.py) of one bucket's device buffers, for host-driven regions."""

    def __init__(self, runner: CudaPlanRunner, bucket: int):
        self.r, self.bucket = runner, bucket

    def scalar(self, b):
        return self.r._read(self.bucket, b).reshape(-1)[0]

    def set(self, b, value):
        buf = self.r.plan(self.bucket).buffers[b]
        self.r._write(self.bucket, b, np.asarray(value, dtypes.np_dtype(buf.dtype)).reshape(buf.shape))
