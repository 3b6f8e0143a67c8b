"""Zero-copy I/O on the CUDA backend: a caller's device buffer bound to an input or output (IOBinding,
runtime/binding.py) is patched into the graph nodes that read or write those bytes, or copied in
before the launch (out after it), whichever costs less over the runs it is expected to serve.

The nodes come from the plan (runtime/zero_copy.py: the steps touching the I/O's storage and every
alias of it). A kernel node gets new arguments (cuGraphExecKernelNodeSetParams); a cuBLASLt node is
captured again with the new pointer, as a kernel node (the same kernel, or no patch) or a child graph
(cuGraphExecChildGraphNodeSetParams). The nodes keep the caller's pointer until another binding or
a plain run moves them again, so a buffer bound run after run costs nothing after its first patch.

Alias prediction: a pointer bound n runs in a row is expected to stay; a patch is made once it costs
less than the n copies it replaces. A caller handing over fresh tensors each run gets copies (a patch
per run would cost more); one that binds the same tensors (the usual serving loop) gets patches.
The costs are estimates in host microseconds (benchmarks/zero_copy.py measures what a run costs
either way). GRAPEC_ZERO_COPY=0 copies everything (a baseline).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

from ...plan import KernelStep, LibraryStep
from ..zero_copy import io_routes
from .driver import call
from .graph import GraphBuilder, is_kernel_node, single_kernel

KERNEL_PATCH_US = 2.0       # cuGraphExecKernelNodeSetParams, one node
LIBRARY_PATCH_US = 60.0     # a cuBLASLt call captured again, then set
COPY_LAUNCH_US = 3.0        # one cuMemcpyDtoDAsync more on the stream
COPY_BYTES_PER_US = 1.0e6   # device to device, read and write: about 1 TB/s
ALIGN = 256                 # what the arena gives every buffer, and the kernels' vector loads rely on


@dataclass
class Choice:
    """What the last run did with one bound input or output."""
    name: str
    kind: str         # "input" | "output"
    mode: str         # "patched" (the nodes use the caller's buffer) | "copied"
    nodes: int        # nodes pointing at the caller's buffer (patched)
    nbytes: int       # bytes a copy moves: saved per run when patched
    copy_us: float    # a copy's estimated cost
    patch_us: float   # host time of the last patch (measured), or its estimate before one was made
    runs: int         # runs in a row with this pointer, this one included
    reason: str = ""  # why it was copied

    def to_json(self) -> dict:
        return dict(self.__dict__)


class _Unpatchable(Exception):
    pass


class ZeroCopy:
    def __init__(self, runner):
        self.r = runner
        self._routes: dict = {}     # bucket -> {name: Route}
        self._streak: dict = {}     # (bucket, name) -> (pointer, runs in a row)
        self._refused: dict = {}    # (bucket, name) -> why its nodes cannot be patched
        self.choices: dict = {}     # name -> Choice, of the last run with bindings

    def routes(self, bucket: int) -> dict:
        """name -> (Route, estimated patch us, estimated copy us), worked out once per bucket."""
        if bucket not in self._routes:
            steps = self.r.plan(bucket).steps
            self._routes[bucket] = {
                name: (route, sum(LIBRARY_PATCH_US if isinstance(steps[i], LibraryStep) else KERNEL_PATCH_US
                                  for i in route.steps), COPY_LAUNCH_US + route.nbytes / COPY_BYTES_PER_US)
                for name, route in io_routes(self.r.plan(bucket)).items()}
        return self._routes[bucket]

    def plan_io(self, bucket: int, bound: dict) -> tuple:
        """bound: input/output name -> the caller's device pointer. Patches what pays and returns
        (copy_in, copy_out): name -> pointer for the rest. Nodes moved by an earlier binding that this
        run does not bind go back to the arena."""
        built = self.r._built[bucket]
        patches, copy_in, copy_out = {}, {}, {}
        choices = {}
        for name, (route, patch_us, copy_us) in self.routes(bucket).items():
            want, cur = bound.get(name), built.moved.get(route.buffer)
            if want is None:
                if cur is not None:
                    patches[route.buffer] = None
                self._streak.pop((bucket, name), None)
                continue
            last, runs = self._streak.get((bucket, name), (None, 0))
            runs = runs + 1 if last == want else 1
            self._streak[(bucket, name)] = (want, runs)
            reason = route.reason or self._refused.get((bucket, name), "") or \
                ("" if os.environ.get("GRAPEC_ZERO_COPY", "1") != "0" else "GRAPEC_ZERO_COPY=0")
            if not reason and want % ALIGN:
                reason = f"the caller's buffer is not {ALIGN}-byte aligned (the kernels' vector loads need it)"
            if not reason and want != cur and patch_us > copy_us * runs:
                reason = (f"a patch (~{patch_us:.0f} us) costs more than the {runs} copies (~{copy_us:.1f} us "
                          "each) this pointer has needed so far")
            if reason:
                if cur is not None:
                    patches[route.buffer] = None
                (copy_in if route.kind == "input" else copy_out)[name] = want
                choices[name] = Choice(name, route.kind, "copied", 0, route.nbytes, copy_us, patch_us, runs, reason)
            else:
                if want != cur:
                    patches[route.buffer] = want
                choices[name] = Choice(name, route.kind, "patched", len(route.steps), route.nbytes, copy_us,
                                       0.0 if want == cur else patch_us, runs)
        if patches:
            spent = self._apply(bucket, patches, choices, copy_in, copy_out, bound)
            for c in choices.values():
                if c.mode == "patched" and c.patch_us:
                    c.patch_us = spent
        self.choices = choices
        return copy_in, copy_out

    def _apply(self, bucket: int, patches: dict, choices: dict, copy_in: dict, copy_out: dict, bound: dict) -> float:
        """Move the nodes of the patched storages; a storage whose cuBLASLt node cannot follow (its
        call captured again picks another kernel) stays in the arena and is copied. -> host us."""
        t0 = time.perf_counter()
        built = self.r._built[bucket]
        by_storage = {r.buffer: r for r, _, _ in self.routes(bucket).values()}
        moved = dict(built.moved)
        for storage, ptr in patches.items():
            if ptr is None:
                moved.pop(storage, None)
            else:
                moved[storage] = ptr
        updates = []
        for storage in patches:
            route = by_storage[storage]
            builder = GraphBuilder(self.r, bucket, moved)
            try:
                updates += [self._update(builder, bucket, i) for i in route.steps]
            except _Unpatchable as e:   # this storage stays in the arena (or goes back there): copied
                self._refused[(bucket, route.name)] = str(e)
                moved.pop(storage, None)
                if storage in built.moved:
                    builder = GraphBuilder(self.r, bucket, moved)
                    updates += [self._update(builder, bucket, i) for i in route.steps]
                c = choices.get(route.name)
                if c is not None:
                    c.mode, c.nodes, c.reason = "copied", 0, str(e)
                    (copy_in if route.kind == "input" else copy_out)[route.name] = bound[route.name]
        for seg, node, setter in updates:
            setter(seg, node)
        built.moved = moved
        return (time.perf_counter() - t0) * 1e6

    def _update(self, builder: GraphBuilder, bucket: int, i: int) -> tuple:
        """(segment, node, setter) repointing top-level step i, checked before anything is set."""
        plan = self.r.plan(bucket)
        st = plan.steps[i]
        if any(run.first <= i < run.end for run in plan.stitches):   # passes/grid_stitch.py keeps I/O steps out
            raise _Unpatchable(f"step {i} runs inside a stitched kernel")
        seg = self.r.segment_of(bucket, i)
        self.r.own_exec(seg)
        node = seg.exec_nodes[i - seg.first]
        if isinstance(st, KernelStep):
            params = builder.kernel_params(*builder.kernel_step_launch(st))
            return seg, node, lambda s, n: call("cuGraphExecKernelNodeSetParams", s.exec, n, params)
        if isinstance(st, LibraryStep):
            child = builder.library_child(st)
            if not is_kernel_node(node):
                return seg, node, lambda s, n: call("cuGraphExecChildGraphNodeSetParams", s.exec, n, child)
            only = single_kernel(child)
            if only is None:
                raise _Unpatchable(f"the library ({st.attrs['op']}) captured more than one kernel for the caller's buffer")
            new, old = call("cuGraphKernelNodeGetParams", only), call("cuGraphKernelNodeGetParams", node)
            same = (int(new.func) == int(old.func) and (new.blockDimX, new.gridDimX, new.sharedMemBytes)
                    == (old.blockDimX, old.gridDimX, old.sharedMemBytes))
            if not same:
                raise _Unpatchable(f"the library ({st.attrs['op']}) picked another kernel for the caller's buffer")
            return seg, node, lambda s, n: call("cuGraphExecKernelNodeSetParams", s.exec, n, new)
        raise _Unpatchable(f"step {i} is not a kernel or library node")
