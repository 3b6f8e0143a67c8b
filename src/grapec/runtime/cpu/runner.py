"""Run a plan on the CPU: one numpy arena laid out exactly as the plan says, steps in order.

Because every value is a view into the same arena at the planned offset, a memory-planning bug
(two live values sharing bytes) shows up here as a wrong answer, on any machine. With `order_seed`,
each step list runs in a random order its edges allow (hazards.random_order), as the GPU's parallel
branches may: a missing edge between steps that share bytes shows up as a changed answer. Regions run
through the walker both backends share (runtime/walker.py).
"""
from __future__ import annotations

import numpy as np

from ... import dtypes
from ...bundle.format import decode_kernel
from ..devices import check_fits, host_memory_available
from ...passes.hazards import random_order
from ...ir.interpret import run_kernel
from ...ir.library import run_library_into
from ...plan import KernelStep, LibraryStep, ScanStoreStep
from ..walker import run_region


class DecodedKernels:
    """The bundle's kernels decoded (checked) at load, where it has up to EAGER_KERNELS; the others (a
    range's: 200k kernels, most of which a run never meets) each decoded when first run. A sequence
    as long as the bundle's kernels (a range's joined sizes add theirs: bundle/families.py)."""
    EAGER_KERNELS = 4096

    def __init__(self, bundle):
        self.bundle, self._decoded = bundle, {}
        if len(bundle.kernels) <= self.EAGER_KERNELS:
            for k in range(len(bundle.kernels)):
                self[k]

    def __len__(self) -> int:
        return len(self.bundle.kernels)

    def __getitem__(self, k: int):
        if k < 0 or k >= len(self):
            raise IndexError(f"kernel {k} of {len(self)}")
        got = self._decoded.get(k)
        if got is None:
            got = self._decoded[k] = decode_kernel(self.bundle, k)
        return got

    def __iter__(self):
        return (self[k] for k in range(len(self)))


class CpuPlanRunner:
    """kernels: another runner's decoded kernels, shared (the runners of one session); arenas: how
    many runners' arenas to check against the host's memory (the first of them checks all)."""

    def __init__(self, bundle, order_seed: int | None = None, kernels: list | None = None, arenas: int = 1):
        self.bundle = bundle
        self.rng = None if order_seed is None else np.random.default_rng(order_seed)
        self.kernels = kernels if kernels is not None else DecodedKernels(bundle)
        self.weights = np.frombuffer(bundle.weights, np.uint8)
        arena_bytes = bundle.largest_arena()
        if kernels is None:
            what = "activation arena" if arenas == 1 else f"{arenas} activation arenas"
            check_fits({what: arenas * arena_bytes}, host_memory_available(), "host memory")
        self.arena = np.zeros(arena_bytes, np.uint8)   # one arena shared by all buckets
        self._views = {}
        self._plans: dict = {}

    def views(self, bucket: int) -> list:
        if bucket not in self._views:
            out = []
            # the plan is kept with its views: a range bundle rebuilds a plan from its template when
            # asked for one not among the last few (bundle/format.py StoredPlans)
            self._plans[bucket] = self.bundle.plans[bucket]
            for b in self._plans[bucket].buffers:
                mem = self.arena if b.space == "arena" else self.weights
                flat = mem[b.offset:b.offset + b.nbytes].view(dtypes.np_dtype(b.dtype))
                out.append(np.lib.stride_tricks.as_strided(flat, b.shape, [s * flat.itemsize for s in b.strides])
                           if b.pitch else flat.reshape(b.shape))
            self._views[bucket] = out
        return self._views[bucket]

    def run(self, bucket: int, feeds: dict, watch=None) -> dict:
        """watch (runtime/watch.py): a buffer handed to watch.on_value as top-level Loops go."""
        v = self.views(bucket)
        plan = self._plans[bucket]
        for name, b in plan.inputs:
            v[b][...] = feeds[name]
        progress = None
        if watch is not None:
            v[watch.buffer].view(np.uint8)[...] = watch.fill
            progress = lambda: watch.on_value(v[watch.buffer].copy())  # noqa: E731
        self.exec_steps(plan.steps, v, progress)
        return {name: v[b].copy() for name, b in plan.outputs}

    def exec_steps(self, steps, v, progress=None):
        """progress: the top level's Loops call it (runtime/walker.py); nested steps run without."""
        order = range(len(steps)) if self.rng is None else random_order(steps, self.rng)
        for st in (steps[i] for i in order):
            if isinstance(st, KernelStep):
                run_kernel(self.kernels[st.kernel], [v[a] for a in st.args], out=v[st.out])
            elif isinstance(st, LibraryStep):
                run_library_into(st.attrs, [None if a < 0 else v[a] for a in st.args], v[st.out])
            elif isinstance(st, ScanStoreStep):
                v[st.dst][int(v[st.counter].reshape(-1)[0])] = v[st.src]
            else:
                run_region(st, _ArenaViews(v), lambda steps: self.exec_steps(steps, v), progress)


class _ArenaViews:
    """The walker's view of the plan's buffers (runtime/walker.py) over the arena's numpy views."""

    def __init__(self, v):
        self.v = v

    def scalar(self, b):
        return self.v[b].reshape(-1)[0]

    def set(self, b, value):
        self.v[b][...] = value
