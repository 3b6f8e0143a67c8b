"""One instantiated graph per launch structure (issue 33): the buckets of a bundle of several sizes
(a --dynamic range, buckets) that share a launch structure share one exec, and a switch between them
costs one node update, not a graph's.

Why: an exec of GPT-2 takes about 2.6 MiB of device memory, so keeping one per length does not fit
the memory a range is allowed, and patching a kept exec to another length's graph with
cuGraphExecUpdate costs about 1 us a node (0.1-0.15 ms for GPT-2). The lengths of a range fall into a
few launch structures (the runner's structure_of: a plan template, a graph shape and the same kernel
functions), and within one, the nodes can be made the same:
- a kernel step whose function is merged across sizes runs as its sized twin, its size arguments and
  grid read from a size record that the exec's first node loads (size_record.py);
- a GEMM whose operands differ only in rows runs at the structure's widest rows (widest_gemm);
- a per-size constant (the causal mask) is read from a region that the same first node fills.

So:
- every bucket's graph is built once and kept on the host (its nodes hold the bucket's own launches);
- a structure's exec is instantiated from the first of its buckets built (Session.build_graphs does
  all of them at load), and its nodes are named by that graph's nodes (`origin`), as the driver
  requires for per-node updates;
- a switch to bucket b repoints the loader node at b's copy list, and sets b's own launch on any other
  node whose launch still differs from the holder's (cuGraphExecKernelNodeSetParams;
  cuGraphExecChildGraphNodeSetParams for a library call that stayed a child graph). Which positions
  can differ is known per structure (`varying`), and a bucket's launches are compared by a
  signature computed once per bucket from its plan.

A structure's exec is keyed by its launch structure, its band of sizes (size_band: a structure's sizes
share an exec within a ratio of launched blocks, 1.5 by default), its node types and the thread block clusters of
its library kernels (a per-node update cannot change a node's cluster shape). Zero-copy I/O
(binding.py) patches the same exec through the origin nodes; the holder's patched nodes are set back
when another bucket takes the exec. A bundle of one bucket keeps an exec of its own (runner.py).

Measured on an H200 (GPT-2 fp16, seq 1..64, 2000 requests of random length per traffic, one process,
benchmarks/results/2026-11-26-h200-shared-execs): no node but the loader updated at a switch, 36-58 us
of host time a switch against 97-150 us for an exec per length; mean latency 1.00-1.08 ms against
1.21-1.76 (numpy in and out, uniform lengths) and 0.50-0.52 against 0.73-0.91 with device buffers
bound; 294 MiB of device memory against 298. Per-node updates alone were no better than updating the
whole graph: a switch that set the 67-85 nodes whose launches differed took 213-282 us (about 3.5 us
a node in the driver, the same through ctypes as through cuda.bindings), which is why the numbers
moved into device memory. GRAPEC_SHARED_EXECS=0 gives every bucket its own exec again (the runner's
LRU of max_graphs buckets; benchmarks/traffic.py --baseline-own-execs measures both).
"""
from __future__ import annotations

import math
import os
import time
from collections import OrderedDict

import numpy as np

from ...plan import KernelStep, LibraryStep, REGIONS, step_deps
from ..zero_copy import io_routes
from .driver import call
from .size_record import SizeRecords

BAND_RATIO = 1.5


def graph_shape(plan) -> tuple:
    """What a graph exec can be patched across (cuGraphExecUpdate): the kinds of the plan's top-level
    steps, their dependencies and the stitched runs."""
    return (tuple(type(st).__name__ for st in plan.steps), tuple(map(tuple, step_deps(plan.steps))),
            tuple((s.first, s.end) for s in plan.stitches))


def launch_structure(bundle, bucket: int, shape: tuple) -> tuple:
    """A bucket's launch structure: its plan's template (bundle/templates.py; the sizes of one share their
    arena offsets, compiler/shared_layout.py), its graph shape, and the GPU function and block of each
    kernel step (sizes whose kernels differ, such as an attention kernel that splits its keys over two
    warps from 33 keys on, are structures of their own), and its arena offsets."""
    plan = bundle.plans[bucket]
    docs = getattr(bundle.plans, "docs", None)
    if docs is not None:   # a read bundle's, or one with families (bundle/families.py BucketDocs)
        template = docs.template_of(bucket)
    else:   # a bundle compiled in this process: its plan's template worked out here
        import json
        from ...bundle.templates import split
        template = json.dumps(split(plan.to_json())[0])
    cuda = bundle.manifest["cuda"]
    kernels = tuple((cuda["kernels"][st.kernel], cuda["launch"][st.kernel][2]) for st in plan.steps
                    if isinstance(st, KernelStep))
    # a size that kept its own arena layout (compiler/structures.py reports it) is a structure of its
    # own: among the others it would leave unsized every kernel that touches a buffer it moved
    layout = tuple(b.offset for b in plan.buffers if b.space == "arena")
    return template, shape, kernels, layout


def members_of(runner, key, buckets=None) -> list:
    """The buckets (of `buckets`, default all) whose exec key (the runner's structure_of) is `key`."""
    return [b for b in (range(len(runner.bundle.plans)) if buckets is None else buckets) if runner.structure_of(b) == key]


def size_band(bundle, plan) -> int:
    """Which band of sizes a bucket falls in: the log, base band_ratio(), of the blocks its kernels launch
    in all. The buckets of one launch structure share an exec band by band, not all together: a shared
    exec runs every sized kernel at the grid of its largest bucket (blocks past a bucket's own grid
    return at once) and every GEMM at its widest rows, which its smaller buckets pay for (BERT fp16 on an
    H200, one exec for lengths 97..320: at 147, 29 us of GEMM rows and 8 us of empty attention blocks
    over the single-length bundle's 420, benchmarks/results/2026-11-28-h200-bert-gap). A band bounds
    that waste by the ratio, at an exec per band."""
    launch = bundle.manifest["cuda"]["launch"]
    blocks = sum(int(launch[st.kernel][1]) for st in plan.steps if isinstance(st, KernelStep))
    return int(bands_of(np.array([blocks]))[0])


def bands_of(blocks: np.ndarray) -> np.ndarray:
    """The band of each count of launched blocks: floor(log base band_ratio()); all 0 for one band."""
    ratio = band_ratio()
    if ratio <= 1.0:
        return np.zeros(len(blocks), np.int64)
    return np.floor(np.log(np.maximum(blocks, 1)) / math.log(ratio) + 1e-9).astype(np.int64)


def even_bands(blocks: np.ndarray) -> np.ndarray:
    """The band of each count of launched blocks of one range family: its span, largest over smallest, cut into the
    fewest bands of at most band_ratio() each, all of one ratio (equal in log). bands_of's grid of powers of the
    ratio, the same for every structure, can leave a family a sliver of a band at each end: as many execs or
    more, and bands as wide as the ratio (tiny Wav2Vec2 over 1600..160000 samples at 1.5: 17 execs against 19, each
    size's library work 1.130x its own on average against 1.137x, 1.328x at p99 against 1.405x)."""
    ratio = band_ratio()
    logs = np.log(np.maximum(blocks, 1).astype(np.float64))
    span = float(logs.max() - logs.min()) if len(blocks) else 0.0
    if ratio <= 1.0 or span <= 0:
        return np.zeros(len(blocks), np.int64)
    n = max(1, math.ceil(span / math.log(ratio) - 1e-9))
    return np.minimum(np.floor((logs - logs.min()) / (span / n)).astype(np.int64), n - 1)


def family_blocks(family, sizes: np.ndarray | None = None) -> np.ndarray:
    """The blocks all kernels of a range family (bundle/families.py) launch at each of these sizes (default its
    members'), from its CUDA formulas: no member's plan joined (158401 joined plans are more than a load can
    afford)."""
    from .size_record import family_kernels, family_launch_slots
    sizes = family.sizes if sizes is None else sizes
    launch = family_launch_slots(family)
    grids = [launch[k][0] for k in family_kernels(family).values()]
    blocks = np.zeros(len(sizes), np.int64)
    for lo in range(0, len(sizes) if grids else 0, 4096):   # in chunks: a family may hold 10^5 sizes
        blocks[lo:lo + 4096] = family.cuda.fit.numbers(sizes[lo:lo + 4096], grids).sum(axis=1)
    return blocks


def family_bands(family) -> np.ndarray:
    """size_band of every member of a range family at once (family_blocks)."""
    return bands_of(family_blocks(family))


def family_exec_keys(bundle, family) -> list | None:
    """exec_key of every member of a range family (bundle/families.py), without joining their plans: the
    launch structure of its first member (one template, graph and arena layout for all: compiler/families.py
    form_family checks the layout) with each member's band (family_bands). None where a kernel's block
    differs between members (then their launch structures do too)."""
    from ...bundle.families import numbered_template
    rows = numbered_template(family.cuda.template)   # per kernel: [function, [kind, grid, block, split], scalars]
    if any(family.cuda.fit.constant(row[1][2]) is None for row in rows):
        return None
    first = family.buckets[0]
    structure = launch_structure(bundle, first, graph_shape(bundle.plans[first]))
    return [structure + (int(band),) for band in family_bands(family)]


def band_ratio() -> float:
    """GRAPEC_BAND_RATIO: the most a band's largest bucket may launch over its smallest (0: one band)."""
    return float(os.environ.get("GRAPEC_BAND_RATIO", str(BAND_RATIO)))


def exec_key(bundle, bucket: int, shape: tuple) -> tuple:
    """What shares one exec: the bucket's launch structure and its band of sizes (size_band)."""
    return launch_structure(bundle, bucket, shape) + (size_band(bundle, bundle.plans[bucket]),)


def enabled() -> bool:
    return os.environ.get("GRAPEC_SHARED_EXECS", "1") != "0"


class Structure:
    """One shared exec: instantiated from `origin`'s graph, holding bucket `holder`'s launches now."""

    def __init__(self, exec_, origin: int, nodes: list, signature: list, loader=None):
        self.exec, self.origin, self.nodes, self.loader = exec_, origin, nodes, loader
        self.holder = origin
        self.first_signature = signature
        self.varying: set = set()     # positions whose launch differs between some of its buckets
        self.members: set = {origin}


class SharedExecs:
    """The runner's shared execs, one per launch structure, least recently run first."""

    def __init__(self, runner, limit: int | None):
        self.r = runner
        self.limit = limit               # at most this many execs (a user's max_graphs), else one per structure
        self.structures: OrderedDict = OrderedDict()   # key -> Structure
        self.key_of: dict = {}           # bucket -> key: a small int standing for its launch structure
        self._key_ids: dict = {}         # the launch structure itself (a large tuple, slow to hash) -> key
        self._signatures: dict = {}      # bucket -> per-position launch signature
        self._params: dict = {}          # (bucket, position) -> what a switch sets (cached)
        self.switch_seconds = 0.0        # host time spent in switches, in all
        self.switch_count = 0
        self._positions: dict = {}       # bucket -> {id(step): position}
        self._widest_by_shape: dict = {}  # launch structure -> widest_gemm's facts per position
        self._io: dict = {}              # bucket -> positions of its I/O steps
        self.records = SizeRecords(runner)   # sized steps: numbers in device memory (size_record.py)

    # --- which buckets ---------------------------------------------------------------------------
    def eligible(self, plan) -> bool:
        """A plan of kernel and library steps only, graphed in one launch (no If/Loop regions, whose
        bodies' nodes are not top-level positions, and no stitched kernels)."""
        return not plan.stitches and not any(isinstance(st, REGIONS) for st in plan.steps) and \
            all(isinstance(st, (KernelStep, LibraryStep)) for st in plan.steps)

    def signature(self, bucket: int) -> list:
        """Per top-level step, what its node's launch is made of: equal signatures give equal node
        parameters (a GEMM's algorithm is tuned once per problem: blas.py)."""
        sig = self._signatures.get(bucket)
        if sig is None:
            r, plan = self.r, self.r.plan(bucket)
            sized = self.records.group(bucket).slots
            sig = []
            for p, st in enumerate(plan.steps):
                ptrs = tuple(r.ptr(bucket, a) if a >= 0 else 0 for a in [st.out] + list(st.args))
                if p in sized:   # the same node in every bucket: its numbers are in the size record
                    sig.append(("sized", p))
                elif isinstance(st, KernelStep):
                    sig.append((r.functions[st.kernel], tuple(r.launches[st.kernel]), repr(r.scalars[st.kernel]), ptrs))
                else:
                    wide = r.widest_gemm(bucket, st)
                    shapes = (tuple(map(tuple, [wide[1]] + [s or () for s in wide[0]])) if wide is not None else
                              tuple(tuple(plan.buffers[a].shape) if a >= 0 else () for a in [st.out] + list(st.args)))
                    sig.append((repr(sorted(st.attrs.items())), shapes, ptrs, st.branch))
            self._signatures[bucket] = sig
        return sig

    def key(self, bucket: int, seg) -> int:
        from cuda.bindings import driver
        if bucket not in self.key_of:
            types, clusters = [], []
            for st, node in zip(self.r.plan(bucket).steps, seg.nodes):
                kind = call("cuGraphNodeGetType", node)
                types.append(int(kind))
                if isinstance(st, LibraryStep) and kind == driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL:
                    v = call("cuGraphKernelNodeGetAttribute", node,
                             driver.CUkernelNodeAttrID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
                    clusters.append((v.clusterDim.x, v.clusterDim.y, v.clusterDim.z))
            full = (self.r.structure_of(bucket), tuple(types), tuple(clusters))
            self.key_of[bucket] = self._key_ids.setdefault(full, len(self._key_ids))
        return self.key_of[bucket]

    # --- GEMMs at the structure's widest M ---------------------------------------------------------
    def widest_gemm(self, bucket: int, st) -> tuple | None:
        """(operand shapes, output shape) of the same GEMM in the bucket of its structure with the most
        rows, where running that one instead is exact: a GEMM's output row i reads only row i of A
        (and of C), so M rows computed where the bucket needs m <= M give its m rows, and the others
        land in bytes that the widest bucket's layout gives this very buffer (compiler/shared_layout.py:
        buffer offsets of a structure are its largest size's). Then the GEMM's node is the same in
        every bucket of the structure and a switch leaves it alone. Only where nothing but the rows
        differ: the same attributes (no strided views), the same buffers at the same offsets, shapes
        [1.., rows, cols] that differ in rows only. None otherwise."""
        if st.attrs.get("op") != "matmul" or st.attrs.get("views"):
            return None
        plan = self.r.plan(bucket)
        p = self._positions_of(bucket)[id(st)]
        if p in self._io_steps(bucket):   # a caller's buffer bound there has the bucket's rows only
            return None
        best = self._widest(bucket).get(p)
        if best is None:
            return None
        attrs, places, shapes = self._gemm_facts(plan, st)
        if (attrs, places) != best[0:2] or not all(_rows_only(a, b) for a, b in zip(shapes, best[2])):
            return None
        return [list(s) if s else None for s in best[2][1:]], list(best[2][0])

    def _io_steps(self, bucket: int) -> set:
        """Positions of the steps that read an input or write an output (zero-copy may repoint them)."""
        if bucket not in self._io:
            self._io[bucket] = {i for route, _, _ in self.r.zero_copy.routes(bucket).values() for i in route.steps}
        return self._io[bucket]

    def _positions_of(self, bucket: int) -> dict:
        positions = self._positions.get(bucket)
        if positions is None:
            positions = self._positions[bucket] = {id(s): p for p, s in enumerate(self.r.plan(bucket).steps)}
        return positions

    @staticmethod
    def _gemm_facts(plan, st) -> tuple:
        args = [st.out] + list(st.args)
        return (repr(sorted(st.attrs.items())),
                tuple((plan.buffers[a].space, plan.buffers[a].offset) if a >= 0 else None for a in args),
                tuple(tuple(plan.buffers[a].shape) if a >= 0 else () for a in args))

    def _widest(self, bucket: int) -> dict:
        """position -> (attrs, places, shapes) of the GEMM with the most rows among the buckets of this
        bucket's launch structure."""
        shape = self.r.structure_of(bucket)
        if shape not in self._widest_by_shape:
            best: dict = {}
            for b in self.r.members_of(shape):
                plan = self.r.bundle.plans[b]
                for p, st in enumerate(plan.steps):
                    if isinstance(st, LibraryStep) and st.attrs.get("op") == "matmul":
                        facts = self._gemm_facts(plan, st)
                        if p not in best or _rows(facts[2][0]) > _rows(best[p][2][0]):
                            best[p] = facts
            self._widest_by_shape[shape] = best
        return self._widest_by_shape[shape]

    # --- using them ------------------------------------------------------------------------------
    def take(self, bucket: int, seg):
        """Point seg (the bucket's one segment, its graph built) at its structure's exec, switching the
        exec to this bucket's launches where another bucket holds it. Only the switch itself is timed
        (switch_us): a structure's instantiation and a bucket's first joining of it (its launch
        signature worked out) happen once per bucket, at load where Session.build_graphs ran."""
        key = self.key_of.get(bucket)
        if key is None:
            key = self.key(bucket, seg)
        st = self.structures.get(key)
        if st is None:
            self._make_room()
            st = self.structures[key] = Structure(call("cuGraphInstantiate", seg.graph, 0), bucket, list(seg.nodes),
                                                  self.signature(bucket), seg.loader)
            self._unmove(bucket)   # a fresh exec has the bucket's own (arena) pointers
            self.r.switches["instantiated"] += 1
        elif bucket not in st.members:
            sig = self.signature(bucket)
            st.varying.update(p for p, (a, b) in enumerate(zip(st.first_signature, sig)) if a != b)
            st.members.add(bucket)
        self.structures.move_to_end(key)
        if st.holder != bucket:   # a fresh exec holds its first bucket: only a kept one switches
            t0 = time.perf_counter()
            self._switch(st, bucket, seg)
            self.switch_seconds += time.perf_counter() - t0
            self.switch_count += 1
        seg.exec, seg.own, seg.exec_nodes, seg.shared = st.exec, True, st.nodes, True

    def reset_switch_time(self):
        """Forget the switches so far (Session.build_graphs' own, made at load, are not requests')."""
        self.switch_seconds, self.switch_count = 0.0, 0

    def sized_launch(self, bucket: int, st):
        """A top-level kernel step's sized launch (size_record.py), or None."""
        p = self._positions_of(bucket).get(id(st))
        return None if p is None else self.records.launch(bucket, p, st)

    def _switch(self, st: Structure, bucket: int, seg):
        old, new = self.signature(st.holder), self.signature(bucket)
        positions = [p for p in st.varying if old[p] != new[p]]
        held = self.r._built.get(st.holder)
        if held is not None and held.moved:   # zero-copy moved some of the holder's nodes: set them back
            positions = sorted(set(positions) | self._io_steps(st.holder))
            held.moved = {}
        try:
            if st.loader is not None:   # the sized nodes read the incoming bucket's numbers
                self._set(st, bucket, seg, "loader")
            for p in positions:
                self._set(st, bucket, seg, p)
            self.r.switches["patched"] += 1
            self.r.switches["nodes_patched"] += len(positions)
        except Exception:   # noqa: BLE001 - a child graph of another topology: a new exec from this graph
            call("cuGraphExecDestroy", st.exec)
            self._unmove(bucket)
            st.exec, st.nodes, st.origin = call("cuGraphInstantiate", seg.graph, 0), list(seg.nodes), bucket
            st.loader = seg.loader
            self.r.switches["instantiated"] += 1
        st.holder = bucket

    def _set(self, st: Structure, bucket: int, seg, p: int):
        params = self._params.get((bucket, p))
        if params is None:
            from cuda.bindings import driver
            node = seg.loader if p == "loader" else seg.nodes[p]
            if call("cuGraphNodeGetType", node) == driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL:
                params = ("cuGraphExecKernelNodeSetParams", call("cuGraphKernelNodeGetParams", node))
            else:
                params = ("cuGraphExecChildGraphNodeSetParams", call("cuGraphChildGraphNodeGetGraph", node))
            self._params[(bucket, p)] = params
        call(params[0], st.exec, st.loader if p == "loader" else st.nodes[p], params[1])

    def _make_room(self):
        while self.limit is not None and self.structures and len(self.structures) >= self.limit:
            _, st = self.structures.popitem(last=False)
            self._release(st)
            self.r.switches["evicted"] += 1

    def _unmove(self, bucket: int):
        """Zero-copy (binding.py) no longer has any of the bucket's nodes on a caller's buffer."""
        built = self.r._built.get(bucket)
        if built is not None:
            built.moved = {}

    def _release(self, st: Structure):
        for b in st.members:
            self._unmove(b)
            for seg in self.r.segments(b):
                if getattr(seg, "shared", False) and seg.exec is st.exec:
                    seg.exec = None
        call("cuGraphExecDestroy", st.exec)

    def forget(self, bucket: int):
        """The bucket's graphs go (the runner closes): its cached launches with them."""
        self._signatures.pop(bucket, None)
        for k in [k for k in self._params if k[0] == bucket]:
            del self._params[k]

    def close(self):
        for st in self.structures.values():
            call("cuGraphExecDestroy", st.exec)
        self.structures.clear()
        self.records.close()

    def mean_switch_us(self) -> float:
        return self.switch_seconds / self.switch_count * 1e6 if self.switch_count else 0.0


def _rows(shape) -> int:
    return shape[-2] if len(shape) >= 2 else 1


def _rows_only(mine, widest) -> bool:
    """Shapes [1.., rows, cols] that differ at most in rows, with no more rows than the widest."""
    if len(mine) != len(widest):
        return False
    if len(mine) < 2:
        return tuple(mine) == tuple(widest)
    return (all(d == 1 for d in mine[:-2]) and all(d == 1 for d in widest[:-2]) and mine[-1] == widest[-1]
            and mine[-2] <= widest[-2])


class _PlanOnly:
    """What SharedExecs reads of a runner, from the bundle alone (no GPU, nothing allocated): a buffer's
    address is its space and offset, a function its name. Launches equal on the device are equal here
    and the other way round, so the positions a switch sets come out as the runner finds them."""

    class _Memory:   # SizeRecords' device memory: distinct made-up addresses, nothing kept
        def __init__(self):
            self.next = 1

        def alloc(self, nbytes, what):
            self.next += 1
            return self.next

        def upload(self, dst, src, nbytes):
            pass

    def __init__(self, bundle):
        cuda = bundle.manifest["cuda"]
        self.bundle, self.dev, self.weights = bundle, self._Memory(), 0
        self.launches, self.scalars, self.functions = cuda["launch"], cuda["scalars"], cuda["kernels"]
        self._plans, self._structures = {}, {}
        self.zero_copy = self   # SharedExecs asks the runner's zero-copy for routes: answered below
        self.shared = SharedExecs(self, None)
        self._members: dict = {}   # exec key -> the buckets compared (switch_sets: a sample of its sizes)

    def members_of(self, key) -> list:   # the runner's, or the sample switch_sets set
        return self._members.get(key) or members_of(self, key)

    def plan(self, bucket: int):
        if bucket not in self._plans:
            self._plans[bucket] = self.bundle.plans[bucket]
        return self._plans[bucket]

    def ptr(self, bucket: int, b: int):
        buf = self.plan(bucket).buffers[b]
        return buf.space, buf.offset

    def routes(self, bucket: int) -> dict:   # zero-copy's, without its cost estimates
        return {name: (route, 0.0, 0.0) for name, route in io_routes(self.plan(bucket)).items()}

    def structure_of(self, bucket: int):
        if bucket not in self._structures:
            self._structures[bucket] = exec_key(self.bundle, bucket, graph_shape(self.plan(bucket)))
        return self._structures[bucket]

    def widest_gemm(self, bucket: int, st):   # as the runner's, which the same switch turns off
        return None if os.environ.get("GRAPEC_WIDEST_GEMMS", "1") == "0" else self.shared.widest_gemm(bucket, st)

    def function(self, name: str):
        return name


def switch_sets(bundle) -> list:
    """Per launch structure of several sizes, what a switch between its sizes sets beyond the loader,
    worked out from the bundle alone as the CUDA runner does (grapec inspect): [(its buckets, the
    positions whose launch differs between them)], over at most SAMPLED of its sizes (sampled)."""
    view = _PlanOnly(bundle)
    keys = exec_keys(bundle)
    view._structures.update(enumerate(keys))
    by_structure: dict = {}
    for b, key in enumerate(keys):
        by_structure.setdefault(key, []).append(b)
    for members in by_structure.values():
        view._members[keys[members[0]]] = sampled(members)
    out = []
    for members in by_structure.values():
        if len(members) < 2:
            continue
        plan = view.plan(members[0])
        if not plan.steps or not view.shared.eligible(plan):   # the others keep an exec each (runner.py _shares)
            continue
        first, *rest = [view.shared.signature(b) for b in sampled(members)]
        out.append((members, [p for p in range(len(first)) if any(s[p] != first[p] for s in rest)]))
    return out


SAMPLED = 48   # sizes of an exec that `grapec inspect` compares (a range's may be 10^5, each a plan to join)


def sampled(buckets: list, n: int = SAMPLED) -> list:
    """At most n of the buckets, spread evenly, the first and the last among them."""
    if len(buckets) <= n:
        return list(buckets)
    return [buckets[round(i * (len(buckets) - 1) / (n - 1))] for i in range(n)]


def exec_keys(bundle) -> list:
    """exec_key of every bucket: a range family's members from their family's formulas (family_exec_keys),
    the other buckets from their plans."""
    keys: list = [None] * len(bundle.plans)
    docs = getattr(bundle.plans, "docs", None)
    for f in getattr(docs, "families", ()):
        found = family_exec_keys(bundle, f) if f.cuda is not None else None
        for b, k in zip(f.buckets, found or ()):
            keys[b] = k
    return [k if k is not None else exec_key(bundle, b, graph_shape(bundle.plans[b])) for b, k in enumerate(keys)]
