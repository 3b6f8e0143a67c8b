"""`grapec check`: compile, run on a backend, and compare with onnxruntime (CPU) on random inputs."""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .errors import GrapecError


@dataclass
class OutputCheck:
    name: str
    shape: tuple
    max_abs: float
    rel: float          # ||out - ref|| / ||ref||
    ok: bool
    note: str = ""


def compare(name, got: np.ndarray, ref: np.ndarray, rtol: float) -> OutputCheck:
    if got.shape != ref.shape:
        return OutputCheck(name, got.shape, float("inf"), float("inf"), False,
                           f"shape {list(got.shape)} vs reference {list(ref.shape)}")
    g, r = got.astype(np.float64), ref.astype(np.float64)
    finite = np.isfinite(r) & np.isfinite(g)
    same_nonfinite = np.array_equal(np.isfinite(g), np.isfinite(r)) and np.array_equal(g[~finite], r[~finite])
    d = np.where(finite, g - r, 0.0)
    mae = float(np.abs(d).max()) if d.size else 0.0
    den = float(np.linalg.norm(np.where(finite, r, 0.0)))
    rel = float(np.linalg.norm(d)) / den if den else (0.0 if mae == 0 else float("inf"))
    return OutputCheck(name, got.shape, mae, rel, rel <= rtol and same_nonfinite,
                       "" if same_nonfinite else "non-finite values differ")


def reference_outputs(model_path, feeds: dict) -> dict:
    try:
        import onnxruntime as ort
    except ImportError:
        raise GrapecError("grapec check needs onnxruntime as the reference: pip install onnxruntime") from None
    so = ort.SessionOptions()
    so.log_severity_level = 3
    try:
        s = ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
        return dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds)))
    except Exception as e:  # noqa: BLE001 - the reference failing is the user's model's problem
        raise GrapecError(f"onnxruntime could not run {model_path} as a reference: {str(e).splitlines()[0]}") from None


def check_model(model_path, shapes=None, dims=None, backend="cpu", rtol=1e-4, seed=0, progress=None, precision="fp32"):
    """-> (list of OutputCheck, seconds grapec's run took). The reference is always fp32."""
    import grapec
    from .bundle.format import Bundle
    from .inputs import bundle_inputs
    bundle = grapec.compile(model_path, shapes=shapes, dims=dims, progress=progress, precision=precision,
                            targets=[] if backend == "cpu" else "auto")
    sess = grapec.load(Bundle.from_bytes(bundle.to_bytes()), backend=backend)
    feeds = bundle_inputs(bundle.manifest, 0, seed)
    t0 = time.perf_counter()
    outs = sess.run(feeds)
    dt = time.perf_counter() - t0
    refs = reference_outputs(model_path, feeds)
    return [compare(n, outs[n], refs[n], rtol) for n in outs], dt
