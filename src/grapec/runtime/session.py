"""Session: a loaded bundle, ready to run. The API follows onnxruntime's InferenceSession.

    sess = grapec.load("model.grape", backend="cpu")
    sess.get_inputs()            # [IOInfo(name, dtype, shape)]
    sess.run({"x": array})       # -> {output name: numpy array}

Threads. `run`, `run_with_iobinding`, `get_inputs` and `get_outputs` may be called from any number
of threads at once. A session has `concurrency` runners (default 1), each with its own arena (on the
GPU also its own stream, cuBLASLt workspaces and CUDA graphs) over one copy of the weights and code:
a run takes an idle runner from inputs in to outputs out, so up to `concurrency` runs are in flight
at once and the others wait. Outputs returned with on_device=True live in a runner's arena and are
valid only until the next run (from any thread). An IOBinding belongs to the thread that fills it.
`close` must not race a run.
"""
from __future__ import annotations

import os
import queue
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from .. import dtypes
from ..bundle.families import member_io
from ..bundle.format import Bundle
from ..errors import BackendError, InputError
from ..ir.selection import checked_output, hidden_output, output_counts
from ..bundle.value_range import check_value_range, manifest_ranges
from .binding import contiguous_strides
from .watch import Watch


def _shape(a):
    cai = getattr(a, "__cuda_array_interface__", None)
    return cai["shape"] if cai is not None else a.shape


def _shapes_key(shapes: dict) -> tuple:
    return tuple((n, tuple(int(d) for d in shapes[n])) for n in sorted(shapes))


@dataclass
class IOInfo:
    """An input or output as onnxruntime's NodeArg shows it: .name, .shape (ints, dim names, None
    where the model names no dim) and .type ('tensor(int64)'); .dtype is numpy's name."""
    name: str
    dtype: str
    dims: list | None

    @property
    def shape(self) -> list | None:
        return None if self.dims is None else [None if d == "?" else d for d in self.dims]

    @property
    def type(self) -> str:
        return f"tensor({ORT_TYPE_NAMES.get(self.dtype, self.dtype)})"


ORT_TYPE_NAMES = {"float32": "float", "float64": "double"}   # the rest: onnxruntime writes numpy's name


def _count_dims(meta: dict, counts) -> list | None:
    """An output's dims, a data-dependent axis named by the output that holds its count."""
    dims = meta["dims"]
    if dims is None or not counts:
        return dims
    dims = list(dims)
    for axis, count in counts:
        dims[axis] = count
    return dims


def _run_args(args: tuple, output_names) -> tuple:
    """(feeds, output names or None, whether the answer is a list) from run's positional arguments."""
    if len(args) == 1 and isinstance(args[0], Mapping):
        return args[0], output_names, False
    if len(args) in (2, 3) and isinstance(args[1], Mapping):   # onnxruntime's (names, feeds[, run_options])
        names = args[0]
        if names is not None and (isinstance(names, str) or not all(isinstance(n, str) for n in names)):
            raise InputError(f"run(output_names, feeds): output_names must be a list of names or None, got {names!r}")
        return args[1], (list(names) if names is not None else None), True
    if len(args) == 2 and isinstance(args[0], Mapping):       # grapec's older (feeds, output_names)
        return args[0], args[1], False
    got = ", ".join(type(a).__name__ for a in args) or "nothing"
    raise InputError(f"run takes (feeds) or (output_names, feeds) as onnxruntime does; got ({got})")


class Session:
    def __init__(self, bundle: Bundle, backend: str = "cpu", device: int = 0, max_graphs: int | None = None,
                 graph_memory: int | None = None, concurrency: int = 1):
        self.bundle = bundle
        self.backend = backend
        m = bundle.manifest
        self._inputs = [IOInfo(i["name"], i["dtype"], i["dims"]) for i in m["inputs"]]
        # a data-dependent axis (ops/counted.py) comes with an output holding its count: run() trims
        # the output to it, and get_outputs() names the axis by that count output
        self._counts = output_counts(o["name"] for o in m["outputs"])   # output -> [(axis, its count output)]
        self._outputs = [IOInfo(o["name"], o["dtype"], _count_dims(o, self._counts.get(o["name"], ())))
                         for o in m["outputs"] if not hidden_output(o["name"])]
        # --bound NAME=N (passes/bounds.py): NAME's run-time value is an output, checked after each run
        self._bounds = {b["output"]: b for b in m.get("bounds", [])}
        self._ranges = manifest_ranges(m)
        self._bucket_of = None   # input shapes -> bucket, built on first use
        self._out_shapes: dict = {}   # bucket -> {output name: shape}
        self._buckets = None
        # inputs fixed at compile time (--value): feeding them is optional, and only the same value is accepted
        self._fixed = {f["name"]: np.array(f["value"], dtypes.np_dtype(f["dtype"])).reshape(f["shape"])
                       for f in m.get("fixed_inputs", [])}
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise InputError(f"concurrency must be a whole number of runs at once, 1 or more; got {concurrency!r}")
        self.concurrency = concurrency
        self._closed = False
        self._runners = self._make_runners(backend, device, max_graphs, graph_memory)
        self._runner = self._runners[0]   # the one a single thread uses (the pool is last in, first out)
        self._last_binding_runner = self._runner   # io_report's
        self._idle: queue.LifoQueue = queue.LifoQueue()
        for r in reversed(self._runners):
            self._idle.put(r)

    def _make_runners(self, backend, device, max_graphs, graph_memory) -> list:
        n = self.concurrency
        if backend == "cpu":
            from .cpu.runner import CpuPlanRunner
            first = CpuPlanRunner(self.bundle, arenas=n)
            return [first] + [CpuPlanRunner(self.bundle, kernels=first.kernels) for _ in range(n - 1)]
        if backend == "cuda":
            from .devices import require_cuda
            require_cuda(device)
            from .cuda.model import CudaModel
            from .cuda.runner import CudaPlanRunner
            model = CudaModel(self.bundle, device, tf32=self.bundle.manifest.get("precision") == "tf32", arenas=n)
            # the first runner gives the model back when it closes (it is closed last)
            return [CudaPlanRunner(self.bundle, max_graphs=max_graphs, graph_memory=graph_memory, model=model,
                                   owns_model=i == 0) for i in range(n)]
        raise BackendError(f"unknown backend '{backend}' (choose cpu or cuda)")

    @contextmanager
    def _lane(self):
        """An idle runner for one run (waiting for one when all are busy)."""
        if self._closed:
            raise BackendError("this session was closed; load the bundle again to run it")
        runner = self._idle.get()
        try:
            yield runner
        finally:
            self._idle.put(runner)

    def close(self):
        """Give back the session's memory (device memory, graphs) now rather than when it is collected."""
        self._closed = True
        for r in reversed(getattr(self, "_runners", [])):
            close = getattr(r, "close", None)
            if close is not None:
                close()

    @classmethod
    def load(cls, src, backend: str = "cpu", device: int = 0, **options) -> "Session":
        if isinstance(src, Bundle):
            b = src
        elif isinstance(src, (bytes, bytearray)):
            b = Bundle.from_bytes(bytes(src))
        else:
            b = Bundle.read(os.fspath(src))
        return cls(b, backend, device, **options)

    def get_inputs(self) -> list:
        return list(self._inputs)

    def get_outputs(self) -> list:
        return list(self._outputs)

    @property
    def buckets(self) -> list:
        if self._buckets is None:
            self._buckets = [b["shapes"] for b in self.bundle.manifest["buckets"]]
        return self._buckets

    def select_bucket(self, shapes: dict) -> int:
        if self._bucket_of is None:
            self._bucket_of = {_shapes_key(b): i for i, b in enumerate(self.buckets)}
        i = self._bucket_of.get(_shapes_key({n: shapes[n] for n in self.buckets[0]}) if self.buckets else ())
        if i is not None:
            return i
        got = ", ".join(f"{n}={'x'.join(map(str, s)) or 'scalar'}" for n, s in shapes.items())
        dynamic = self.bundle.manifest.get("dynamic") or {}
        for info in self.bundle.manifest["inputs"]:
            for axis, dim in enumerate(info["dims"] or []):
                if dim in dynamic and info["name"] in shapes and axis < len(shapes[info["name"]]):
                    v, (lo, hi) = shapes[info["name"]][axis], dynamic[dim]
                    if not lo <= v <= hi:
                        raise InputError(f"input '{info['name']}' dim {axis} ('{dim}') is {v}, outside the range this "
                                         f"bundle was compiled for: {dim}={lo}:{hi} (input shapes {got}; recompile "
                                         f"with a wider --dynamic {dim}=LO:HI)")
        if dynamic:
            have = ", ".join(f"{d}={lo}:{hi}" for d, (lo, hi) in dynamic.items())
            shapes_of = "; ".join(f"{i['name']}={'x'.join(map(str, i['dims'] or [])) or 'scalar'}"
                                  for i in self.bundle.manifest["inputs"])
            raise InputError(f"no bucket for input shapes {got}; this bundle was compiled for {shapes_of} with {have}")
        have = "; ".join(", ".join(f"{n}={'x'.join(map(str, s)) or 'scalar'}" for n, s in b.items()) for b in self.buckets)
        raise InputError(f"no bucket for input shapes {got}; this bundle was compiled for: {have}")

    def check_feeds(self, feeds: dict) -> dict:
        names = [i.name for i in self._inputs]
        feeds = self._without_fixed(feeds)
        unknown = [k for k in feeds if k not in names]
        missing = [n for n in names if n not in feeds]
        if unknown or missing:
            parts = []
            if unknown:
                parts.append(f"unknown input(s) {', '.join(repr(u) for u in unknown)}")
            if missing:
                parts.append(f"missing input(s) {', '.join(repr(m) for m in missing)}")
            raise InputError("; ".join(parts) + f" (the model's inputs: {', '.join(repr(n) for n in names)})")
        arrays = {}
        # a range may be bounded by another input's dim
        shapes = {n: tuple(_shape(a) if hasattr(a, "__cuda_array_interface__") else np.shape(a)) for n, a in feeds.items()}
        for info in self._inputs:
            a = feeds[info.name]
            cai = getattr(a, "__cuda_array_interface__", None)
            if cai is None:
                a = np.asarray(a)
                got = a.dtype
            else:
                if self.backend != "cuda":
                    raise InputError(f"input '{info.name}' is a GPU array; the {self.backend} backend takes host arrays")
                if cai.get("strides") not in (None, ()) and tuple(cai["strides"]) != \
                        contiguous_strides(cai["shape"], np.dtype(cai["typestr"]).itemsize):
                    raise InputError(f"input '{info.name}': GPU arrays must be contiguous")
                got = np.dtype(cai["typestr"])
            want = dtypes.np_dtype(info.dtype)
            if got != want:
                raise InputError(f"input '{info.name}': expected dtype {info.dtype}, got {got}")
            if cai is None and info.name in self._ranges:   # a device array is not read back to check it
                check_value_range(info.name, a, self._ranges[info.name].bounded(shapes))
            arrays[info.name] = a
        return arrays

    def _without_fixed(self, feeds: dict) -> dict:
        for name, want in self._fixed.items():
            if name not in feeds:
                continue
            a = feeds[name]
            if hasattr(a, "__cuda_array_interface__"):
                raise InputError(f"input '{name}' was fixed at compile time (--value); feed it as a host array or leave it out")
            got = np.asarray(a)
            if got.shape != want.shape or not np.array_equal(got, want):
                raise InputError(f"input '{name}' was fixed at compile time to {want.tolist()} (--value {name}=...); "
                                 f"got {got.tolist() if got.size <= 16 else f'an array of shape {list(got.shape)}'}. "
                                 "Recompile with the value you need.")
        return {k: v for k, v in feeds.items() if k not in self._fixed}

    @property
    def fixed_inputs(self) -> dict:
        """Inputs whose values were fixed at compile time: name -> value."""
        return {k: v.copy() for k, v in self._fixed.items()}

    def build_graphs(self, progress=None) -> int:
        """CUDA backend: build every bucket's graphs now, in every lane, instead of at each size's first
        run, and instantiate every launch structure's exec (runtime/cuda/shared_exec.py): a range
        bundle's first request of a size then costs a switch (one node updated, tens of us for GPT-2
        on an H200), not a graph build (about 5 ms). Buckets with an exec of their own beyond
        max_graphs give it back and their graphs stay parked on the host. It takes a while: GPT-2 fp16 at seq 1..512 took 53 s
        on an H200, most of it timing cuBLASLt candidates for each size's GEMM shapes. progress(done,
        total) is called per bucket.
        -> the buckets built per lane (0 on the CPU backend, which has no graphs)."""
        if self._closed:
            raise BackendError("this session was closed; load the bundle again to run it")
        lanes = [self._idle.get() for _ in self._runners]   # every lane idle: runs wait until the graphs are built
        try:
            return max([r.build_all(progress) for r in lanes if hasattr(r, "build_all")], default=0)
        finally:
            for r in reversed(lanes):
                self._idle.put(r)

    def run(self, *args, output_names: list | None = None, on_device: bool = False):
        """Two forms:
            run(feeds) -> {output name: array}                 (grapec's)
            run(output_names | None, feeds) -> [array, ...]    (onnxruntime's: in the order asked, all if None)
        Outputs are numpy arrays, or (on_device=True, CUDA backend) device arrays in the arena that
        stay valid until the next run."""
        feeds, names, as_list = _run_args(args, output_names)
        outs = self._run_dict(feeds, names, on_device)
        return [outs[n] for n in (names or [o.name for o in self._outputs])] if as_list else outs

    def run_watching(self, feeds: dict, watched, on_value) -> dict:
        """run(feeds), handing copies of one buffer of the plan to on_value(array) as the run goes:
        watched(plan) -> that buffer's index, one a top-level Loop rewrites each step (runtime/watch.py
        says when each backend makes its copies). on_value is called from this thread."""
        return self._run_dict(feeds, None, False, (watched, on_value))

    def _run_dict(self, feeds: dict, output_names, on_device: bool, watching: tuple | None = None) -> dict:
        arrays = self.check_feeds(feeds)
        bucket = self.select_bucket({n: tuple(_shape(a)) for n, a in arrays.items()})
        with self._lane() as runner:   # a runner's arena is the run's from inputs in to outputs out
            if watching is not None:
                watched, on_value = watching
                outs = runner.run(bucket, arrays, watch=Watch(watched(self.bundle.plans[bucket]), on_value))
            else:
                outs = runner.run(bucket, arrays, on_device=True) if on_device else runner.run(bucket, arrays)
            self._check_run_sizes(outs)
        if self._counts and not on_device:
            outs = self._trimmed(outs)
        if output_names:
            bad = [n for n in output_names if n not in outs]
            if bad:
                raise InputError(f"unknown output(s) {bad}; outputs are {list(outs)}")
            return {n: outs[n] for n in output_names}
        return outs

    def _check_run_sizes(self, outs: dict):
        """Take the --bound values and the checked sizes out of a run's outputs; refuse the run if a value
        went past its bound (its sizes were cut to the bound, so the outputs are not the model's) or a
        size is not the one its node needs (ONNX's rule: onnxruntime fails such a run too)."""
        for name in [n for n in outs if checked_output(n)]:
            node, want = checked_output(name)
            got = int(np.asarray(self.to_host(outs.pop(name))).reshape(-1)[0])
            if got != want:
                raise InputError(f"node '{node}': its input holds {got} elements in this run, where its target "
                                 f"shape needs {want} (the sizes came from the data)")
        for name, b in self._bounds.items():
            got = np.asarray(self.to_host(outs.pop(name)))
            if got.size and (got.max() > b["bound"] or got.min() < 0):
                worst = int(got.max()) if got.max() > b["bound"] else int(got.min())
                raise InputError(f"'{b['value']}' is {worst} in this run, outside its bound 0..{b['bound']} "
                                 f"(--bound {b['value']}={b['bound']}), read by {', '.join(b['read_by'][:4])}: "
                                 f"compile again with a larger bound, e.g. --bound {b['value']}={max(worst, 1) * 2}")

    def _trimmed(self, outs: dict) -> dict:
        """Each counted output cut to its counts, the count outputs dropped: onnxruntime's shapes. (On the
        device, and through an IOBinding, an output stays at its bound and its count is an output.)"""
        outs = dict(outs)
        for name, axes in self._counts.items():
            arr = outs[name]
            for axis, count in axes:
                n = int(np.asarray(outs.pop(count)))
                arr = arr[(slice(None),) * axis + (slice(0, n),)]
            outs[name] = np.ascontiguousarray(arr)
        return outs

    def _with_counts(self, results: dict, outs: dict) -> dict:
        """A bound output of data-dependent length comes back at its bound, with its count beside it
        (NAME::countAXIS, an int64 scalar on the binding's side: numpy, or a device array)."""
        for name in list(results):
            for _, count in self._counts.get(name, ()):
                results.setdefault(count, outs[count])
        return results

    def io_binding(self):
        """An IOBinding (runtime/binding.py): inputs and outputs bound to your own arrays, run with
        run_with_iobinding. On the CUDA backend bound device buffers are patched into the graph
        where that is cheaper than copying them (io_report says what happened)."""
        from .binding import IOBinding
        return IOBinding(self)

    def run_with_iobinding(self, binding) -> None:
        """Run with the binding's inputs; its outputs are written into the arrays bound to them (or
        kept in the session's buffers: binding.get_outputs()). Returns when they are ready."""
        from .binding import DeviceBuffer
        arrays = self.check_feeds(dict(binding.inputs))
        bucket = self.select_bucket({n: tuple(_shape(a)) for n, a in arrays.items()})
        outputs = self._check_bound_outputs(binding.outputs, bucket)
        if self.backend == "cpu":
            with self._lane() as runner:
                outs = runner.run(bucket, arrays)
            self._check_run_sizes(outs)
            for name, out in outputs.items():
                if out is not None:
                    np.copyto(out, outs[name])
                    outs[name] = out
            binding._results = self._with_counts({n: outs[n] for n in (outputs or outs)}, outs)
            return
        bound = {n: a.ptr for n, a in list(arrays.items()) + list(outputs.items()) if isinstance(a, DeviceBuffer)}
        host_out = {n: a for n, a in outputs.items() if isinstance(a, np.ndarray)}
        with self._lane() as runner:
            self._last_binding_runner = runner
            outs = runner.run(bucket, {n: a for n, a in arrays.items() if n not in bound}, bound=bound)
            self._check_run_sizes(outs)
            results = {}
            for name in (outputs or outs):
                got = outs[name]
                if name in host_out:
                    np.copyto(host_out[name], self.to_host(got))
                    got = host_out[name]
                elif name in bound:
                    got = outputs[name].obj   # the caller's own tensor
                results[name] = got
        binding._results = self._with_counts(results, outs)

    def _output_shapes(self, bucket: int) -> dict:
        """name -> the bucket's output shape, read from its plan once: a range bundle rebuilds a plan
        from its template when asked for one not among the last few (bundle/format.py StoredPlans),
        which costs milliseconds for GPT-2, too much for every request."""
        shapes = self._out_shapes.get(bucket)
        if shapes is None:
            at = getattr(getattr(self.bundle.plans, "docs", None), "at", None)   # a range's (bundle/families.py BucketDocs)
            where = at[bucket] if at is not None else ("stored", None)
            if where[0] != "stored":   # a family member's, from its formulas (bundle/families.py): no plan joined
                shapes = {n: bufs[0].shape for n, bufs in member_io(where[0], [where[1]])["outputs"]}
            else:   # the runner's plan where its graphs were built from one (no join from the template)
                plan = self._runner.plan(bucket) if hasattr(self._runner, "plan") else self.bundle.plans[bucket]
                shapes = {n: tuple(plan.buffers[b].shape) for n, b in plan.outputs}
            self._out_shapes[bucket] = shapes
        return shapes

    def _check_bound_outputs(self, outputs: dict, bucket: int) -> dict:
        """Bound output arrays against the bucket's output shapes and the model's dtypes."""
        from .binding import DeviceBuffer
        if all(a is None for a in outputs.values()):
            # outputs left in the session's buffers have no shape to check: reading it costs a stored
            # size of a range its plan joined from the template (milliseconds, on each length's first run)
            return outputs
        want = {o.name: o for o in self._outputs}
        shapes = self._output_shapes(bucket)
        for name, a in outputs.items():
            if a is None:
                continue
            if isinstance(a, DeviceBuffer) and self.backend != "cuda":
                raise InputError(f"output '{name}' is bound to a GPU array; the {self.backend} backend takes host arrays")
            dtype = a.dtype
            if dtype != dtypes.np_dtype(want[name].dtype):
                raise InputError(f"output '{name}': expected dtype {want[name].dtype}, got {dtype}")
            if name in shapes and tuple(a.shape) != shapes[name]:
                raise InputError(f"output '{name}': the bound array has shape {list(a.shape)}; this run's output "
                                 f"has shape {list(shapes[name])}")
        return outputs

    def to_host(self, array) -> np.ndarray:
        """A numpy copy of an output (a device array of this session's GPU, or a host array)."""
        if isinstance(array, np.ndarray):
            return array.copy()
        from .cuda.driver import call
        cai = array.__cuda_array_interface__
        out = np.empty(cai["shape"], np.dtype(cai["typestr"]))
        stream = getattr(array, "stream", None)
        self._runner.dev.make_current()
        if cai.get("strides") and tuple(cai["strides"]) != out.strides:
            if stream is None or len(out.shape) < 2:
                raise InputError(f"to_host takes this session's outputs or dense device arrays, not strides {cai['strides']}")
            if out.nbytes:   # our padded rows: the copy compacts them
                from .cuda.driver import copy_rows_async
                row = out.shape[-1] * out.itemsize
                copy_rows_async(out.ctypes.data, row, int(cai["data"][0]), cai["strides"][-2], row,
                                out.size // out.shape[-1], stream, dst_host=True)
                call("cuStreamSynchronize", stream)
            return out
        if stream is None:   # someone else's array: wait for the whole GPU
            self._runner.dev.synchronize()
            self._runner.dev.download(out.ctypes.data, int(cai["data"][0]), out.nbytes)
        else:   # behind the run that wrote it, on its runner's stream
            call("cuMemcpyDtoHAsync", out.ctypes.data, int(cai["data"][0]), out.nbytes, stream)
            call("cuStreamSynchronize", stream)
        return out

    def io_report(self) -> list:
        """For each input and output bound in the last run_with_iobinding (CUDA backend): whether the
        caller's buffer was patched into the graph or copied, the nodes moved, the bytes a copy moves
        (saved per run when patched), the host time of the patch, and why a copy was made."""
        zc = getattr(self._last_binding_runner, "zero_copy", None)
        return [c.to_json() for c in zc.choices.values()] if zc is not None else []

    def input_buffer(self, name: str, shapes: dict | None = None):
        """The graph-owned device buffer of input `name` (CUDA backend): write into it through
        __cuda_array_interface__ and run with it as the feed, and no copy is made."""
        if self.backend != "cuda":
            raise InputError("input_buffer() needs the cuda backend")
        if self.concurrency > 1:
            raise InputError(f"input_buffer() is one arena's buffer, and this session has {self.concurrency} "
                             "(concurrency); bind your own device arrays with io_binding() instead")
        bucket = self.select_bucket(shapes) if shapes else 0
        with self._lane() as runner:
            return runner.input_buffer(bucket, name)
