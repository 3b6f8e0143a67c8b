"""grapec as an `onnx.backend.base.Backend`, and a runner for ONNX's backend node tests.

Each test model is compiled for the shapes of the inputs it is run with, written to bundle bytes,
read back (so the bundle format is exercised too) and run on the chosen backend.

    python -m grapec.onnx_backend [--backend cpu] [--filter REGEX] [--verbose] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
import warnings

import numpy as np
from onnx.backend.base import Backend, BackendRep

from ..errors import GrapecError


class GrapecRep(BackendRep):
    def __init__(self, model, backend: str = "cpu"):
        self.model = model
        self.backend = backend
        inits = {t.name for t in model.graph.initializer}
        self.input_names = [i.name for i in model.graph.input if i.name not in inits]
        self.output_names = [o.name for o in model.graph.output]
        self._sessions: dict = {}
        self.fixed_names: set = set()

    def session_for(self, feeds: dict):
        """A session for these feeds' shapes. Inputs that turn out to set shape parameters (a
        Reshape target given as an input) are fixed to the fed values, as `--value` does."""
        from .. import compile as grapec_compile
        from ..bundle.format import Bundle
        from ..errors import NeedsValueError
        from ..runtime.session import Session
        for _ in range(len(feeds) + 1):
            values = {n: feeds[n] for n in self.fixed_names}
            key = (tuple(sorted((k, tuple(v.shape)) for k, v in feeds.items())),
                   tuple(sorted((k, v.tobytes()) for k, v in values.items())))
            if key in self._sessions:
                return self._sessions[key]
            shapes = {k: v.shape for k, v in feeds.items() if k not in values}
            try:
                bundle = grapec_compile(self.model, shapes=shapes, values=values,
                                        targets=[] if self.backend == "cpu" else "auto")
            except NeedsValueError as e:
                if not e.graph_inputs or set(e.graph_inputs) <= self.fixed_names:
                    raise
                self.fixed_names |= set(e.graph_inputs)
                continue
            self._sessions[key] = Session(Bundle.from_bytes(bundle.to_bytes()), backend=self.backend)
            return self._sessions[key]
        raise AssertionError("unreachable: every retry fixes at least one more input")

    def run(self, inputs, **kwargs):
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        else:
            feeds = dict(zip(self.input_names, inputs))
        feeds = {k: np.asarray(v) for k, v in feeds.items()}
        outs = self.session_for(feeds).run(feeds)
        return tuple(outs[n] for n in self.output_names)


class GrapecBackend(Backend):
    backend = "cpu"

    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs):
        super().prepare(model, device, **kwargs)
        return GrapecRep(model, kwargs.get("backend", cls.backend))

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device in ("CPU", "CUDA")


# --- the node-test runner ------------------------------------------------------------------------

def node_testcases(pattern: str | None = None):
    from onnx.backend.test.case.node import collect_testcases
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with np.errstate(all="ignore"):
            cases = collect_testcases("")
    rx = re.compile(pattern) if pattern else None
    return [c for c in cases if rx is None or rx.search(c.name)]


def _as_array(x):
    """Test data comes as numpy arrays or, for types numpy lacks a name for, as TensorProtos."""
    from onnx import TensorProto, numpy_helper
    if isinstance(x, TensorProto):
        return numpy_helper.to_array(x)
    return np.asarray(x) if isinstance(x, np.generic) else x


def run_case(case, backend: str = "cpu") -> tuple:
    """-> (status, detail): status is 'pass', 'fail' (wrong answer or crash) or 'unsupported'."""
    try:
        rep = GrapecRep(case.model, backend)
        for inputs, outputs in case.data_sets:
            inputs = [_as_array(i) for i in inputs]
            outputs = [_as_array(o) for o in outputs]
            if any(not isinstance(i, np.ndarray) for i in inputs):
                return "unsupported", "sequence/optional inputs are not supported"
            got = rep.run(list(inputs))
            if len(got) != len(outputs):
                return "fail", f"{len(got)} outputs, expected {len(outputs)}"
            for g, ref in zip(got, outputs):
                ref = np.asarray(ref)
                if ref.dtype == object:
                    return "unsupported", "non-tensor output"
                if g.dtype != ref.dtype:
                    return "fail", f"dtype {g.dtype}, expected {ref.dtype}"
                if g.shape != ref.shape:
                    return "fail", f"shape {g.shape}, expected {ref.shape}"
                np.testing.assert_allclose(g, ref, rtol=case.rtol, atol=case.atol)
        return "pass", ""
    except GrapecError as e:
        return "unsupported", str(e).splitlines()[0][:200]
    except AssertionError as e:
        return "fail", " ".join(str(e).split())[:200]
    except Exception as e:  # noqa: BLE001 - a crash is a failure to report, not to hide
        return "fail", f"crash {type(e).__name__}: {str(e)[:150]}"


def run_suite(pattern=None, backend="cpu", verbose=False, out=sys.stdout) -> dict:
    cases = node_testcases(pattern)
    results = {}
    t0 = time.perf_counter()
    for c in cases:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with np.errstate(all="ignore"):
                status, detail = run_case(c, backend)
        results[c.name] = (status, detail)
        if verbose and status != "pass":
            print(f"{status:12s} {c.name}: {detail}", file=out)
    counts = {k: sum(1 for s, _ in results.values() if s == k) for k in ("pass", "fail", "unsupported")}
    print(f"ONNX node tests ({backend} backend): {counts['pass']} passed, {counts['fail']} failed, "
          f"{counts['unsupported']} skipped (unsupported) of {len(cases)} in {time.perf_counter() - t0:.0f}s", file=out)
    return results


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--filter", default=None, help="regex on test names, e.g. 'test_reduce'")
    ap.add_argument("--verbose", "-v", action="store_true", help="print every failure and skip with its reason")
    ap.add_argument("--json", default=None, help="write {test: [status, detail]} here")
    a = ap.parse_args(argv)
    res = run_suite(a.filter, a.backend, a.verbose)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=0, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
