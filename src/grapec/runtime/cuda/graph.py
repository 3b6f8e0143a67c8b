"""Plan steps -> nodes of a CUDA graph, built explicitly (no stream capture but for cuBLASLt).

One builder serves the top level and every region body, so a body holds the same kinds of node:
    KernelStep      a kernel node
    LibraryStep     the cuBLASLt or cuDNN call captured once at build time (blas.py, dnn.py): its one kernel as a
                    kernel node (launch attributes copied), else the captured child graph
    ScanStoreStep   a kernel node of grapec_scan_store (the row index is read on the device)
    IfStep          grapec_if_cond (sets the handle from the condition tensor), then a conditional
                    IF node with two bodies: then and else
    LoopStep        the enter copies, grapec_loop_enter, a conditional WHILE node whose body is the
                    Loop's body ending in grapec_loop_next, then the exit copies
A Stitch of the plan (passes/grid_stitch.py) is one cooperative kernel node for all its steps: its
grid stays resident, its stages separated by grid barriers on a counter of the runner's.
Each node waits for the steps its plan step names (`deps`, passes/streams.py): steps no edge
orders run as parallel branches. The handles of conditional nodes are created on the graph that
holds the node, as the driver requires for nesting. A cuBLASLt call uses its runner's workspace of its
step's branch: two calls that may run at once never share one.

Where the runner allows it (model.uses_dependent_launch), a generated kernel that waits for another
generated kernel is joined to it by a programmatic edge: it launches while its predecessor still
runs, loads its weights, and waits in G_AWAIT_PREDECESSOR (codegen/cuda.py) until the writes of all
its predecessors are visible. cuBLASLt kernels keep plain edges on both sides: after one, a kernel that waits
gained nothing measurable (H100, benchmarks/graph_options.py: BERT seq 128, whose 40 programmatic
edges were nearly all after a GEMM, ran 1% slower with them; GPT-2 seq 8, whose 62 join its own
kernels, 10% faster), and a cuBLASLt kernel after ours does not wait.
"""
from __future__ import annotations

from ...codegen.control import SCAN_STORE_BLOCK, scan_store_grid
from ...codegen.gpu_support import library_gap
from ...errors import BackendError
from ...plan import IfStep, KernelStep, LibraryStep, LoopStep, ScanStoreStep, step_deps
from .driver import KernelArgs, call


def is_kernel_node(node) -> bool:
    from cuda.bindings import driver
    return call("cuGraphNodeGetType", node) == driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL


def single_kernel(graph):
    """The graph's node where it is one kernel node, else None."""
    nodes, count = call("cuGraphGetNodes", graph, 0)
    if count != 1:
        return None
    nodes, _ = call("cuGraphGetNodes", graph, count)
    return nodes[0] if is_kernel_node(nodes[0]) else None


def edge_counts(graph) -> dict:
    """The graph's own edges (not its bodies'), by kind: {"default": n, "programmatic": m}."""
    from cuda.bindings import driver
    n = call("cuGraphGetEdges", graph, 0)[-1]
    counts = {"default": 0, "programmatic": 0}
    if n:
        _, _, data, n = call("cuGraphGetEdges", graph, n)
        for e in data[:n]:
            programmatic = e.type == driver.CUgraphDependencyType.CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC
            counts["programmatic" if programmatic else "default"] += 1
    return counts


class GraphBuilder:
    """moved: storage buffer -> a caller's device pointer that takes its place (zero-copy I/O,
    binding.py); every buffer of that storage (plan.aliases) points there."""

    def __init__(self, runner, bucket: int, moved: dict | None = None):
        self.r = runner
        self.bucket = bucket
        plan = runner.plan(bucket)
        self.bufs = plan.buffers
        self.moved = moved or {}
        self.root = plan.storage_of() if self.moved else None

    def ptr(self, b: int) -> int:
        if b < 0:
            return 0
        if self.moved and self.root[b] in self.moved:
            return self.moved[self.root[b]]
        return self.r.ptr(self.bucket, b)

    def add_steps(self, graph, steps: list, entry: list, order: list | None = None, stamps: list | None = None,
                  record: list | None = None, stitches: list = ()) -> list:
        """Add steps to graph, each after the steps it waits for (plan.step_deps, or `order`: each
        step's dependencies as indices into steps) and the first ones after `entry`; returns the
        nodes nothing in the list waits for (what follows must wait for them).
        stamps: [(start event, end event)] per step: each step is put between two event record
        nodes (runtime/cuda/timeline.py), and no edge is programmatic.
        record: gets each step's node, in order (what zero-copy I/O repoints later).
        stitches: [Stitch] over `steps` (plan.py): each run is one cooperative kernel node, which every
        step of the run has as its node; ignored with stamps (each step is timed alone)."""
        nodes, kernel_nodes, waited = [], set(), set()
        runs = {} if stamps is not None else {s.first: s for s in stitches}
        all_deps = step_deps(steps) if order is None else order
        for i, (st, deps) in enumerate(zip(steps, all_deps)):
            waited.update(deps)
            if i < len(nodes):   # a later stage of a stitch added at its first step
                continue
            if i in runs:
                run = runs[i]
                outside = sorted({d for ds in all_deps[run.first:run.end] for d in ds if d < run.first})
                node = self.stitch(graph, [nodes[d] for d in outside] or list(entry), steps[run.first:run.end], run)
                nodes += [node] * (run.end - run.first)
                continue
            preds = [nodes[d] for d in deps] or list(entry)
            if stamps is not None:
                preds = [call("cuGraphAddEventRecordNode", graph, preds, len(preds), stamps[i][0])]
            # a programmatic edge joins two generated kernels; any other predecessor gets a plain one
            early = [nodes[d] for d in deps if d in kernel_nodes] \
                if isinstance(st, KernelStep) and self.r.dependent_launch and stamps is None else []
            plain = [p for p in preds if not any(p is e for e in early)]
            if isinstance(st, KernelStep):
                node = self.kernel(graph, plain, *self.kernel_step_launch(st), programmatic=early)
                kernel_nodes.add(len(nodes))
            elif isinstance(st, LibraryStep):
                node = self.library(graph, plain, st)
            elif isinstance(st, ScanStoreStep):
                row = self.bufs[st.src].nbytes
                node = self.kernel(graph, plain, self.r.function("grapec_scan_store"), scan_store_grid(row),
                                   SCAN_STORE_BLOCK, [self.ptr(st.dst), self.ptr(st.src), self.ptr(st.counter)],
                                   [["i64", row], ["i64", self.bufs[st.dst].shape[0]]])
            elif isinstance(st, IfStep) and st.graphed:
                node = self.if_node(graph, plain, st)
            elif isinstance(st, LoopStep) and st.graphed:
                node = self.while_node(graph, plain, st)
            else:  # pragma: no cover - host-driven regions split the plan before it gets here
                raise AssertionError("a host-driven region inside a CUDA graph")
            if stamps is not None:
                call("cuGraphAddEventRecordNode", graph, [node], 1, stamps[i][1])
            nodes.append(node)
        if record is not None:
            record.extend(nodes)
        tail = list({id(n): n for i, n in enumerate(nodes) if i not in waited}.values())
        return tail if nodes else list(entry)

    # --- node kinds ------------------------------------------------------------------------------
    def kernel_step_launch(self, st: KernelStep) -> tuple:
        """(function, grid, block, pointers, scalars) of a kernel step; for a step of a shared exec
        whose numbers live in device memory (size_record.py), its sized twin at the structure's largest
        grid, its per-size constants read from their regions, and the record as its last pointer."""
        _, grid, block, _ = self.r.launches[st.kernel]
        sized = self.r.sized_launch(self.bucket, st)
        if sized is not None:
            func, grid, record, regions = sized
            ptrs = [regions.get(self.bufs[a].name) or self.ptr(a) for a in [st.out] + list(st.args)]
            return func, grid, block, ptrs + [record], []
        return (self.r.functions[st.kernel], grid, block, [self.ptr(st.out)] + [self.ptr(a) for a in st.args],
                self.r.scalars[st.kernel])

    def kernel_params(self, func, grid, block, pointers, scalars=(), shared_bytes: int = 0):
        """The node parameters of one launch; its argument array is kept with the bucket."""
        from cuda.bindings import driver
        args = KernelArgs(pointers, scalars)
        self.r.keep(self.bucket, args)
        p = driver.CUDA_KERNEL_NODE_PARAMS()
        p.func = func
        p.gridDimX, p.gridDimY, p.gridDimZ = grid, 1, 1
        p.blockDimX, p.blockDimY, p.blockDimZ = block, 1, 1
        p.sharedMemBytes = shared_bytes
        p.kernelParams = args.address
        return p

    def kernel(self, graph, deps, func, grid, block, pointers, scalars=(), programmatic=()):
        """A kernel node after deps, and after the nodes of `programmatic` by programmatic edges (it
        launches while they run and waits for them in G_AWAIT_PREDECESSOR)."""
        from cuda.bindings import driver
        p = self.kernel_params(func, grid, block, pointers, scalars)
        node = call("cuGraphAddKernelNode", graph, deps, len(deps), p)
        if programmatic:
            edge = driver.CUgraphEdgeData()
            edge.from_port = driver.CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC
            edge.type = driver.CUgraphDependencyType.CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC
            n = len(programmatic)
            call("cuGraphAddDependencies", graph, list(programmatic), [node] * n, [edge] * n, n)
        return node

    def stitch(self, graph, deps, stages: list, run):
        """The stitched kernel of `stages` (KernelSteps; codegen/grid_stitch.py) as one cooperative kernel
        node: its grid is as many blocks as stay resident together, its barrier counter the runner's."""
        from cuda.bindings import driver
        func, shared_bytes, grid = self.r.model.stitch(self.bucket, run.first, run.block)
        pointers, scalars = [self.r.stitch_counter(self.bucket, run.first)], []
        for st in stages:
            _, _, _, ptrs, sc = self.kernel_step_launch(st)
            pointers += ptrs
            scalars += sc
        p = self.kernel_params(func, grid, run.block, pointers, scalars, shared_bytes)
        node = call("cuGraphAddKernelNode", graph, deps, len(deps), p)
        value = driver.CUkernelNodeAttrValue()
        value.cooperative = 1
        call("cuGraphKernelNodeSetAttribute", node, driver.CUkernelNodeAttrID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE, value)
        return node

    def matmul_child(self, st: LibraryStep, accept=None):
        """The step's cuBLASLt call, captured as a graph (kept with the bucket); accept: blas.py matmul_graph's."""
        from .blas import apply_views
        attrs = st.attrs
        gap = library_gap(attrs["op"], self.bufs[st.args[0]].dtype)
        if gap:   # the compiler refuses such bundles; one from elsewhere still gets a clear error
            raise BackendError(f"{gap} (ONNX node(s) {', '.join(st.origin)}); this bundle runs on the CPU backend only")
        shapes = [list(self.bufs[a].shape) if a >= 0 else None for a in st.args]
        ptrs = [self.ptr(a) for a in st.args]
        out = self.bufs[st.out]
        out_shape = list(out.shape)
        wide = self.r.library_shapes(self.bucket, st) if not self.moved else None
        if wide is not None:   # its structure's widest rows (the node is then the same in all its buckets), or a family's
            shapes, out_shape = wide
        dtype = self.bufs[st.args[0]].dtype   # A and B; the output may be float32 (attrs out_dtype)
        out_shape, out_ptr, layouts = apply_views(attrs, shapes, ptrs, out_shape, self.ptr(st.out), dtype, out.dtype)
        child = self.r.blas_for_graphs().matmul_graph(attrs, shapes, dtype, ptrs, out_shape, out_ptr, layouts,
                                                      self.r.workspaces.get(st.branch), tune=self.r.tuning,
                                                      accept=accept)
        if child is not None:
            self.r.keep(self.bucket, child)
        return child

    def conv_child(self, st: LibraryStep):
        """The step's cuDNN convolution, captured as a graph (kept with the bucket)."""
        attrs = st.attrs
        gap = library_gap(attrs["op"], self.bufs[st.args[0]].dtype)
        if gap:
            raise BackendError(f"{gap} (ONNX node(s) {', '.join(st.origin)}); this bundle runs on the CPU backend only")
        shapes = [list(self.bufs[a].shape) if a >= 0 else None for a in st.args]
        out = self.bufs[st.out]
        out_shape = list(out.shape)
        wide = self.r.library_shapes(self.bucket, st) if not self.moved else None
        if wide is not None:   # a range family's band at its widest length, or one of its variants (family_exec.py)
            shapes, out_shape = wide
        child = self.r.dnn_for_graphs().conv_graph(attrs, shapes, out.dtype, [self.ptr(a) for a in st.args],
                                                   out_shape, self.ptr(st.out), self.r.workspaces.get(st.branch),
                                                   warm=self.r.tuning)
        self.r.keep(self.bucket, child)
        return child

    def sdpa_child(self, st: LibraryStep):
        """The step's cuDNN attention, captured as a graph (kept with the bucket)."""
        dtype = self.bufs[st.args[0]].dtype
        gap = library_gap("sdpa", dtype)
        if gap:
            raise BackendError(f"{gap} (ONNX node(s) {', '.join(st.origin)}); this bundle runs on the CPU backend only")
        child = self.r.dnn_for_graphs().sdpa_graph(st.attrs, dtype, [self.ptr(a) for a in st.args], self.ptr(st.out),
                                                   self.r.workspaces.get(st.branch), warm=self.r.tuning)
        self.r.keep(self.bucket, child)
        return child

    def library_child(self, st: LibraryStep):
        """The step's library call (cuDNN convolution or attention, cuBLASLt GEMM), captured as a graph."""
        op = st.attrs["op"]
        return self.conv_child(st) if op == "conv" else self.sdpa_child(st) if op == "sdpa" else self.matmul_child(st)

    def library(self, graph, deps, st: LibraryStep):
        child = self.library_child(st)
        if self.r.flat_gemms:
            node = self.inlined(graph, deps, child)
            if node is not None:
                return node
        return call("cuGraphAddChildGraphNode", graph, deps, len(deps), child)

    def inlined(self, graph, deps, child):
        """A captured child graph of one kernel node, added as a kernel node of graph (its launch
        attributes, thread-block clusters included, copied); None for anything else."""
        only = single_kernel(child)
        if only is None:
            return None
        node = call("cuGraphAddKernelNode", graph, deps, len(deps), call("cuGraphKernelNodeGetParams", only))
        call("cuGraphKernelNodeCopyAttributes", node, only)
        return node

    def conditional(self, graph, deps, kind: str, n_bodies: int, setter: str, pointers: list) -> tuple:
        """setter kernel (its first argument the new handle) -> conditional node; (node, bodies)."""
        from cuda.bindings import driver
        handle = call("cuGraphConditionalHandleCreate", graph, self.r.dev.ctx, 0, 0)
        set_node = self.kernel(graph, deps, self.r.control_function(setter), 1, 1, [int(handle)] + pointers)
        p = driver.CUgraphNodeParams()
        p.type = driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
        p.conditional.handle = handle
        p.conditional.type = getattr(driver.CUgraphConditionalNodeType, f"CU_GRAPH_COND_TYPE_{kind}")
        p.conditional.size = n_bodies
        p.conditional.ctx = self.r.dev.ctx
        node = call("cuGraphAddNode", graph, [set_node], None, 1, p)
        bodies = list(p.conditional.phGraph_out)[:n_bodies]
        return node, bodies, handle

    def if_node(self, graph, deps, st: IfStep):
        node, (then_g, else_g), _ = self.conditional(graph, deps, "IF", 2, "grapec_if_cond", [self.ptr(st.cond)])
        for body, steps in ((then_g, st.then.steps), (else_g, st.else_.steps)):
            if not self.add_steps(body, steps, []):
                call("cuGraphAddEmptyNode", body, [], 0)
        return node

    def while_node(self, graph, deps, st: LoopStep):
        deps = self.add_steps(graph, st.enter, deps)
        node, (body,), handle = self.conditional(
            graph, deps, "WHILE", 1, "grapec_loop_enter",
            [self.ptr(st.counter), self.ptr(st.cond_in), self.ptr(st.trip), self.ptr(st.cond)])
        tail = self.add_steps(body, st.body.steps, [])
        self.kernel(body, tail, self.r.control_function("grapec_loop_next"), 1, 1,
                    [int(handle), self.ptr(st.counter), self.ptr(st.cond_in), self.ptr(st.cond_out), self.ptr(st.trip)])
        tail = self.add_steps(graph, st.exit, [node])
        assert len(tail) == 1, "a Loop's exit copies are one chain (passes/streams.py)"
        return tail[0]
