"""Large range families run on the GPU from their formulas: one exec per band of sizes, no plan per size
(issue 33; family_plan.py says how each step runs and why).

An exec of a family band is built at load from one member's plan, its origin (the member that launches the
most blocks), with:
    - a loader node first (codegen/size_program.py EVAL_SIZES) that computes the running size's record
      from its dims, which the runner writes with the inputs: a kernel step runs as its sized twin, at the
      band's largest grid, its numbers read from that record;
    - "widest" library steps at the band's widest shapes;
    - "variant" library steps at the origin's shapes; a node per distinct shape among the band's members is
      built too, and a switch between sizes sets the node whose shape differs (Wav2Vec2: the first
      convolution's GEMM, whose columns are the length, and the positional convolution's: about 4000
      variants over 158401 sizes). A variant kernel of another thread block cluster than its kernel node's
      (which the node's parameters cannot change) runs in a sibling kernel node of that cluster, with the
      node's edges, enabled alone while it holds the step.
A run then costs a 24-byte copy of the dims, those node settings where the variant changed, the inputs'
copies and one launch. Every member's inputs and outputs come from the formulas (bundle/families.py
member_io: a table of numbers per buffer), computed once at load for the whole family.

Which families: those of at least family_plan.FAMILY_EXEC_MIN members (GRAPEC_FAMILY_EXECS: "0" none, "all" every
family that can run so, a number: families of at least that many); the others, and the stored sizes, take the
shared execs' way (shared_exec.py), a plan and a graph per size at load. `grapec compile` says which.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ...codegen.size_program import EVAL_SIZES_BLOCK, MAX_DIMS, eval_sizes_grid
from ...errors import BackendError
from ...plan import KernelStep
from .device_array import DeviceArray
from .driver import call
from .family_plan import FamilyPlan, least_members, plan_family
from .graph import GraphBuilder, single_kernel


@dataclass
class Variant:
    """One shape of a variant step, as its node in a band's exec takes it."""
    setter: str          # cuGraphExecKernelNodeSetParams or cuGraphExecChildGraphNodeSetParams
    params: object       # the kernel's parameters, or the child graph
    node: object         # the node that runs it (a kernel node's sibling where its launch shape differs)
    shapes: tuple        # (argument shapes, output shape)


@dataclass
class BandExec:
    """One exec: a family's band of sizes."""
    family: int
    members: np.ndarray              # member indices
    origin: int                      # the bucket it was built from
    exec: object = None
    graph: object = None             # the graph exec was instantiated from (per-node profiling names its nodes)
    nodes: list = field(default_factory=list)      # per top-level step of the origin's plan
    params: dict = field(default_factory=dict)     # variant position -> [Variant]
    siblings: dict = field(default_factory=dict)   # variant position -> its nodes, one per launch form (the exec's
                                                   # own first, which holds no variant where none launches as it)
    variant_of: dict = field(default_factory=dict)  # variant position -> each member's variant (indexed by member)
    current: dict = field(default_factory=dict)    # variant position -> the variant its node holds now
    holder: int = -1                 # the member it ran last
    regions: dict = field(default_factory=dict)    # per-size constant -> the device region its kernels read
    places: dict = field(default_factory=dict)     # per-size constant -> (weight offsets, bytes) by member


def _launch_shape(node) -> tuple | None:
    """A kernel node's thread block cluster (what a node's parameters cannot change), None for no kernel node."""
    from cuda.bindings import driver
    if node is None or call("cuGraphNodeGetType", node) != driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL:
        return None
    v = call("cuGraphKernelNodeGetAttribute", node,
             driver.CUkernelNodeAttrID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION).clusterDim
    return v.x, v.y, v.z


def _graph_form(graph) -> tuple:
    """What a child graph node's update cannot change: its nodes' kinds and clusters, in order, and its edges."""
    n = call("cuGraphGetNodes", graph, 0)[-1]
    nodes = call("cuGraphGetNodes", graph, n)[0] if n else []
    return ("graph", tuple((int(call("cuGraphNodeGetType", x)), _launch_shape(x)) for x in nodes),
            call("cuGraphGetEdges", graph, 0)[-1])


def _form(child) -> tuple:
    """A captured library call's launch form: ("kernel", cluster) where it is one kernel (its exec node a kernel
    node), else its graph's form (a child graph node). Variants of one form share a node."""
    only = single_kernel(child)
    return ("kernel", _launch_shape(only)) if only is not None else _graph_form(child)


def _node_form(node) -> tuple:
    shape = _launch_shape(node)
    return ("kernel", shape) if shape is not None else _graph_form(call("cuGraphChildGraphNodeGetGraph", node))


def _sibling(graph, node, child):
    """A kernel node beside node, with its edges (in and out, their kinds too), running child's one kernel with that
    kernel's attributes (its thread block cluster). A switch enables one of them (cuGraphNodeSetEnabled, which
    takes kernel nodes but not child graph nodes: a variant of several kernels cannot have a sibling)."""
    kernel = single_kernel(child)
    sibling = call("cuGraphAddKernelNode", graph, [], 0, call("cuGraphKernelNodeGetParams", kernel))
    call("cuGraphKernelNodeCopyAttributes", sibling, kernel)
    n = call("cuGraphNodeGetDependencies", node, 0)[-1]
    if n:
        deps, data, n = call("cuGraphNodeGetDependencies", node, n)
        call("cuGraphAddDependencies", graph, deps, [sibling] * n, data, n)
    n = call("cuGraphNodeGetDependentNodes", node, 0)[-1]
    if n:
        after, data, n = call("cuGraphNodeGetDependentNodes", node, n)
        call("cuGraphAddDependencies", graph, [sibling] * n, after, data, n)
    return sibling


@dataclass
class _Build:
    """What the runner's hooks answer while a band's exec is built from its origin's plan."""
    origin: int          # bucket
    positions: dict      # id(step) -> its position in the origin's plan
    grids: dict          # sized position -> the band's largest grid
    records: dict        # sized position -> the device pointer of its numbers in the record
    overrides: dict      # library position -> (argument shapes, output shape)
    regions: dict        # per-size constant -> its region (the kernels that read it point there)


class FamilyExecs:
    """The runner's execs of large families (module docstring)."""

    def __init__(self, runner):
        self.r = runner
        self.plans: list = []            # FamilyPlan per family that runs so
        self.owner: dict = {}            # bucket -> (family number, member)
        self.execs: dict = {}            # (family number, band) -> BandExec
        self.skipped: list = []          # (members, reason) of large families that cannot run so
        self._io: dict = {}              # family number -> member_io of all its members
        self._record: dict = {}          # family number -> (program pointer, record pointer, loader grid)
        self._building: _Build | None = None   # the exec being built (the runner's hooks read it)
        self.dims = 0                    # device pointer: the running size's dims (MAX_DIMS int64)
        self.switch_seconds, self.switch_count = 0.0, 0
        self._choose()

    # --- which families ------------------------------------------------------------------------------
    def _choose(self):
        least = least_members()
        families = getattr(getattr(self.r.bundle.plans, "docs", None), "families", None)   # a range's (BucketDocs)
        if least is None or not families:
            return
        cuda = self.r.bundle.manifest["cuda"]
        if "grapec_eval_sizes" not in self._functions_available():
            return
        sized = set(cuda.get("sized") or [])
        for family in families:
            if len(family.buckets) < least or family.sizes.shape[1] > MAX_DIMS:
                continue
            fp = plan_family(family, sized)
            if fp.reason is not None:
                self.skipped.append((len(family.buckets), fp.reason))
                continue
            n = len(self.plans)
            self.plans.append(fp)   # its also-buckets (stored plans its formulas give) run with its members
            for m, b in enumerate(family.all_buckets):
                self.owner[b] = (n, m)

    def _functions_available(self) -> set:
        """Bundles made before the loader kernel was in their module (codegen/build.py) have none."""
        try:
            self.r.function("grapec_eval_sizes")
            return {"grapec_eval_sizes"}
        except BackendError:
            return set()

    def owns(self, bucket: int) -> bool:
        return bucket in self.owner

    def bands(self) -> list:
        return [(n, int(band)) for n, fp in enumerate(self.plans) for band in sorted(set(fp.bands.tolist()))]

    # --- building ------------------------------------------------------------------------------------
    def build_all(self, progress=None, done: int = 0, total: int = 0):
        for n in range(len(self.plans)):   # every member's I/O, here and not at a family's first request (0.3 s
            self.io(n)                     # for Wav2Vec2's larger families)
        for i, (n, band) in enumerate(self.bands()):
            self._exec(n, band)
            if progress is not None:
                progress(done + i + 1, total)

    def prepare(self, bucket: int):
        n, m = self.owner[bucket]
        self._exec(n, int(self.plans[n].bands[m]))

    def _exec(self, n: int, band: int) -> BandExec:
        ex = self.execs.get((n, band))
        if ex is None:
            self.r.synchronize()   # GEMM tuning at build time runs on the arena
            ex = self.execs[(n, band)] = self._build(n, band)
        return ex

    def _record_of(self, n: int) -> tuple:
        """(program, record, the loader's grid) of family n, the first two device pointers, made once: every band
        of it uses the same."""
        if n not in self._record:
            dev = self.r.dev
            prog = np.ascontiguousarray(self.plans[n].record_program())
            p = dev.alloc(prog.nbytes, "a family's size program")
            dev.upload(p, prog.ctypes.data, prog.nbytes)
            self._record[n] = (p, dev.alloc(8 * int(prog[2]) + 8, "a family's size record"), eval_sizes_grid(prog))
            if not self.dims:
                self.dims = dev.alloc(8 * MAX_DIMS, "the running size's dims")
        return self._record[n]

    def _build(self, n: int, band: int) -> BandExec:
        fp: FamilyPlan = self.plans[n]
        members = fp.members(band)
        first = fp.origin(members)
        origin = fp.buckets[first]
        at = int(np.searchsorted(members, first))   # the origin among the members
        ex = BandExec(n, members, origin)
        plan = self.r.bundle.plans[origin]
        prog, record, loader_grid = self._record_of(n)
        overrides = {p: fp.widest(p, members) for p, form in fp.library.items() if form.kind == "widest"}
        variants = {p: fp.variants(p, members) for p, form in fp.library.items() if form.kind == "variant"}
        for p, (rows, which) in variants.items():   # the exec holds the origin's own variant first
            overrides[p] = fp.unflatten(p, rows[which[at]])
        offsets, offset = {}, 0
        for p in fp.sized:   # the record's layout (size_record.py family_record_program)
            offsets[p] = record + 8 * offset
            offset += len(self.r.scalars[plan.steps[p].kernel]) + 1
        for name in fp.constants:   # each in a region of this exec's, filled at a switch (switch)
            offs, nbytes = fp.places(name, members)
            ex.places[name] = (np.full(len(fp.sizes), -1, np.int64), np.zeros(len(fp.sizes), np.int64))
            ex.places[name][0][members], ex.places[name][1][members] = offs, nbytes
            ex.regions[name] = self.r.dev.alloc(max(8, int(nbytes.max())), "a per-size constant's region")
        self._building = _Build(origin, {id(st): p for p, st in enumerate(plan.steps)}, fp.grids(members), offsets,
                                overrides, ex.regions)
        self.r.tuning = True
        try:
            graph = call("cuGraphCreate", 0)
            builder = GraphBuilder(self.r, origin)
            loader = builder.kernel(graph, [], self.r.function("grapec_eval_sizes"), loader_grid, EVAL_SIZES_BLOCK,
                                    [prog, record, self.dims], [])
            builder.add_steps(graph, plan.steps, [loader], record=ex.nodes)
            # the variants: a GEMM's first acceptable algorithm (not timed), a convolution warmed before its
            # capture (nothing lives in the arena at load); made before instantiating, as a variant of another
            # launch shape adds a node to the graph
            for p, (rows, which) in variants.items():
                ex.params[p] = self._variants(builder, graph, plan.steps[p], p, rows, ex)
                of = np.full(len(fp.sizes), -1, np.int64)
                of[members] = which
                ex.variant_of[p] = of
            ex.exec, ex.graph = call("cuGraphInstantiate", graph, 0), graph
            self.r.keep(origin, graph)
            self.r.switches["instantiated"] += 1
            for p, (rows, which) in variants.items():
                self._try_variants(p, ex)
                ex.current[p] = -1
                self._hold(ex, p, int(which[at]))
        finally:
            self.r.tuning = False
            self._building = None
        return ex

    def _variants(self, builder, graph, st, p: int, rows: list, ex: BandExec) -> list:
        """[Variant] per shape of a variant step. A node's parameters can change its kernels' arguments and grids
        but not its launch form (_form: one kernel and its thread block cluster, or a child graph's topology and
        clusters). Where the node is a kernel, a variant kernel of another cluster gets a sibling kernel node with
        the node's edges, and a switch enables the variant's node alone (the exec's own node too may hold none:
        its algorithm was timed at the origin's shape, the variants' are cuBLASLt's first ranked of a form it
        has a node of, else the first of one kernel; none is timed, as nothing lives in the arena at load).
        Where the node is a child graph (a cuDNN call of several kernels), which cannot be disabled, every
        variant must take its form; the driver checks the topology when it is set."""
        node = ex.nodes[p]
        own = _node_form(node)
        nodes = {own: node}   # launch form -> the node that launches so
        made = []
        for row in rows:
            shapes = self._building.overrides[p] = self.plans[ex.family].unflatten(p, row)
            try:
                if own[0] == "graph":   # a child graph node cannot be disabled: every variant takes its form
                    child = builder.matmul_child(st, accept=lambda g: _form(g) == own) \
                        if st.attrs.get("op") == "matmul" else builder.library_child(st)
                elif st.attrs.get("op") == "matmul":
                    child = builder.matmul_child(st, accept=lambda g: _form(g) in nodes) \
                        or builder.matmul_child(st, accept=lambda g: single_kernel(g) is not None)
                else:
                    child = builder.library_child(st)
                form = _form(child) if child is not None else None
                if form is None or (form != own and (own[0] == "graph" or form[0] == "graph")):
                    raise BackendError("no algorithm of it launches as one kernel" if own[0] == "kernel" else
                                       "no algorithm of it launches as the node's graph of kernels")
                if form not in nodes:
                    nodes[form] = _sibling(graph, node, child)
                if form[0] == "kernel":
                    made.append(Variant("cuGraphExecKernelNodeSetParams",
                                        call("cuGraphKernelNodeGetParams", single_kernel(child)), nodes[form], shapes))
                else:
                    made.append(Variant("cuGraphExecChildGraphNodeSetParams", child, nodes[form], shapes))
            except BackendError as e:
                raise self._unset(st, p, ex, shapes, e) from None
        ex.siblings[p] = list(nodes.values())
        self.r.switches["sibling_nodes"] += len(nodes) - 1
        return made

    def _try_variants(self, p: int, ex: BandExec):
        """Each variant set on the instantiated exec once, so a switch cannot fail later."""
        st = self.r.bundle.plans[ex.origin].steps[p]
        for v in ex.params[p]:
            try:
                call(v.setter, ex.exec, v.node, v.params)
            except BackendError as e:
                raise self._unset(st, p, ex, v.shapes, e) from None

    @staticmethod
    def _unset(st, p: int, ex: BandExec, shapes, e) -> BackendError:
        return BackendError(f"step {p} ({st.attrs.get('op')}, ONNX node(s) {', '.join(st.origin)}) of a range family "
                            f"(bucket {ex.origin}'s plan) cannot be set to its shapes {shapes} in the family's exec "
                            f"({e}); set GRAPEC_FAMILY_EXECS=0 to join every size's plan instead")

    @staticmethod
    def _hold(ex: BandExec, p: int, v: int) -> bool:
        """Variant v into its node, that node alone of the step's enabled; False where it held it already."""
        if ex.current[p] == v:
            return False
        new = ex.params[p][v]
        call(new.setter, ex.exec, new.node, new.params)
        if ex.current[p] < 0:   # the first hold: every other node of the step off
            for other in ex.siblings[p]:
                if other is not new.node:
                    call("cuGraphNodeSetEnabled", ex.exec, other, 0)
        else:
            held = ex.params[p][ex.current[p]].node
            if held is not new.node:
                call("cuGraphNodeSetEnabled", ex.exec, held, 0)
                call("cuGraphNodeSetEnabled", ex.exec, new.node, 1)
        ex.current[p] = v
        return True

    # --- the runner's hooks while an exec is built -----------------------------------------------------
    def sized_launch(self, bucket: int, st):
        """(sized twin, the band's largest grid, its record pointer, the per-size constants' regions) of a kernel
        step of the exec being built, or None."""
        b = self._building
        if b is None or bucket != b.origin or not isinstance(st, KernelStep):
            return None
        p = b.positions.get(id(st))
        if p not in b.records:
            return None
        name = self.r.bundle.manifest["cuda"]["kernels"][st.kernel]
        return self.r.function(name + "_sized"), b.grids[p], b.records[p], b.regions

    def library_shapes(self, bucket: int, st):
        """(argument shapes, output shape) of a library step of the exec being built: widest or a variant's."""
        b = self._building
        if b is None or bucket != b.origin:
            return None
        return b.overrides.get(b.positions.get(id(st)))

    # --- running --------------------------------------------------------------------------------------
    def io(self, n: int) -> dict:
        if n not in self._io:
            self._io[n] = self.plans[n].io()
        return self._io[n]

    def switch(self, bucket: int) -> BandExec:
        """The bucket's band exec, holding the bucket's variants; its dims written."""
        n, m = self.owner[bucket]
        fp = self.plans[n]
        ex = self._exec(n, int(fp.bands[m]))
        if ex.holder != m:
            t0 = time.perf_counter()
            for name, (offs, nbytes) in ex.places.items():   # this size's per-size constants into their regions
                if nbytes[m]:
                    call("cuMemcpyDtoDAsync", ex.regions[name], self.r.weights + int(offs[m]), int(nbytes[m]),
                         self.r.stream)
            nodes = sum(self._hold(ex, p, int(of[m])) for p, of in ex.variant_of.items())
            if ex.holder >= 0:
                self.switch_seconds += time.perf_counter() - t0
                self.switch_count += 1
                self.r.switches["patched"] += 1
                self.r.switches["nodes_patched"] += nodes
            ex.holder = m
        dims = np.zeros(MAX_DIMS, np.int64)
        size = fp.sizes[m]
        dims[:len(size)] = size
        call("cuMemcpyHtoDAsync", self.dims, dims.ctypes.data, dims.nbytes, self.r.stream)
        self.r._pending.append(dims)
        return ex

    def describe(self, bucket: int) -> str:
        """Which exec runs the bucket, for a benchmark's report."""
        n, m = self.owner[bucket]
        fp = self.plans[n]
        members = fp.members(int(fp.bands[m]))
        lo, hi = fp.sizes[members].min(axis=0).tolist(), fp.sizes[members].max(axis=0).tolist()
        return f"the band exec of range family {n}: {len(members)} sizes, {lo}..{hi}"

    def buffers(self, bucket: int, side: str) -> list:
        """[(name, Buffer)] of the bucket's inputs or outputs."""
        n, m = self.owner[bucket]
        return [(name, bufs[m]) for name, bufs in self.io(n)[side]]

    def ptr(self, buf) -> int:
        return (self.r.arena if buf.space == "arena" else self.r.weights) + buf.offset

    def run(self, bucket: int, feeds: dict, on_device: bool, bound: dict | None, watch) -> dict:
        r = self.r
        if watch is not None:
            raise BackendError("watching a buffer while a run goes is not supported for a size of a range family")
        r.dev.make_current()
        r.release_host_copies()
        ex = self.switch(bucket)
        binding, bound = bound is not None, bound or {}   # an IOBinding's outputs may all be the session's own
        for name, buf in self.buffers(bucket, "inputs"):
            if name in bound:
                call("cuMemcpyDtoDAsync", self.ptr(buf), bound[name], buf.nbytes, r.stream)
            else:
                r.copy_array_in(self.ptr(buf), buf.nbytes, feeds[name])
        call("cuGraphLaunch", ex.exec, r.stream)
        r.launched = 1
        outs = self.buffers(bucket, "outputs")
        for name, buf in outs:
            if name in bound:
                r.copy_buffer_out(buf, self.ptr(buf), bound[name], host=False)
        if binding or on_device:
            if binding:
                r.synchronize()   # IOBinding's outputs are ready when run returns (as the runner's other path)
            return {name: bound[name] if name in bound else DeviceArray.of(self.ptr(buf), buf, r.stream)
                    for name, buf in outs}
        arrays = r.download([(buf, self.ptr(buf)) for _, buf in outs])
        return {name: a for (name, _), a in zip(outs, arrays)}

    def input_buffer(self, bucket: int, name: str):
        self.r.dev.make_current()
        self.prepare(bucket)
        buf = dict(self.buffers(bucket, "inputs"))[name]
        return DeviceArray(self.ptr(buf), buf.shape, buf.dtype, self.r.stream)

    def close(self):
        for ex in self.execs.values():
            if ex.exec is not None:
                call("cuGraphExecDestroy", ex.exec)
            for ptr in ex.regions.values():
                self.r.dev.free(ptr)
        self.execs.clear()
        for prog, record, _grid in self._record.values():
            self.r.dev.free(prog)
            self.r.dev.free(record)
        self._record.clear()
        if self.dims:
            self.r.dev.free(self.dims)
            self.dims = 0
