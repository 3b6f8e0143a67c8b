"""Session: a loaded bundle, ready to run. The API follows onnxruntime's InferenceSession.

    sess = grapec.load("model.grape", backend="cpu")
    sess.get_inputs()            # [IOInfo(name, dtype, shape)]
    sess.run({"x": array})       # -> {output name: numpy array}
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from .. import dtypes
from ..bundle.format import Bundle
from ..errors import BackendError, InputError


@dataclass
class IOInfo:
    name: str
    dtype: str
    shape: list


class Session:
    def __init__(self, bundle: Bundle, backend: str = "cpu", device: int = 0):
        self.bundle = bundle
        self.backend = backend
        m = bundle.manifest
        self._inputs = [IOInfo(i["name"], i["dtype"], i["dims"]) for i in m["inputs"]]
        self._outputs = [IOInfo(o["name"], o["dtype"], o["dims"]) for o in m["outputs"]]
        if backend == "cpu":
            from .cpu_plan import CpuPlanRunner
            self._runner = CpuPlanRunner(bundle)
        elif backend == "cuda":
            raise BackendError("backend 'cuda' is not available in this build of grapec yet; use --backend cpu")
        else:
            raise BackendError(f"unknown backend '{backend}' (choose cpu or cuda)")

    @classmethod
    def load(cls, src, backend: str = "cpu", device: int = 0) -> "Session":
        if isinstance(src, Bundle):
            b = src
        elif isinstance(src, (bytes, bytearray)):
            b = Bundle.from_bytes(bytes(src))
        else:
            b = Bundle.read(os.fspath(src))
        return cls(b, backend, device)

    def get_inputs(self) -> list:
        return list(self._inputs)

    def get_outputs(self) -> list:
        return list(self._outputs)

    @property
    def buckets(self) -> list:
        return [b["shapes"] for b in self.bundle.manifest["buckets"]]

    def select_bucket(self, shapes: dict) -> int:
        for i, b in enumerate(self.buckets):
            if all(tuple(b[n]) == tuple(shapes[n]) for n in b):
                return i
        have = "; ".join(", ".join(f"{n}={'x'.join(map(str, s)) or 'scalar'}" for n, s in b.items()) for b in self.buckets)
        got = ", ".join(f"{n}={'x'.join(map(str, s)) or 'scalar'}" for n, s in shapes.items())
        raise InputError(f"no bucket for input shapes {got}; this bundle was compiled for: {have}")

    def check_feeds(self, feeds: dict) -> dict:
        names = [i.name for i in self._inputs]
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
        for info in self._inputs:
            a = np.asarray(feeds[info.name])
            want = dtypes.np_dtype(info.dtype)
            if a.dtype != want:
                raise InputError(f"input '{info.name}': expected dtype {info.dtype}, got {a.dtype}")
            arrays[info.name] = a
        return arrays

    def run(self, feeds: dict, output_names: list | None = None) -> dict:
        arrays = self.check_feeds(feeds)
        bucket = self.select_bucket({n: a.shape for n, a in arrays.items()})
        outs = self._runner.run(bucket, arrays)
        if output_names:
            bad = [n for n in output_names if n not in outs]
            if bad:
                raise InputError(f"unknown output(s) {bad}; outputs are {list(outs)}")
            return {n: outs[n] for n in output_names}
        return outs
