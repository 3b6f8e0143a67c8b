"""`grapec check`: compile, run on a backend, and compare with onnxruntime (CPU), as polygraphy does.

Per output: max-abs error, max-rel error (|out-ref| / |ref|) and ||out-ref|| / ||ref||. An output
passes when every element satisfies |out - ref| <= atol + rtol * |ref| (numpy's allclose), so an
output near zero is judged by atol rather than by a relative error that blows up.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .errors import GrapecError

# (atol, rtol) per precision. fp32: reductions summed in another order differ by a few ulp of the
# partial sums; tf32 keeps 10 mantissa bits in GEMM operands, fp16 rounds every activation.
TOLERANCES = {"fp32": (1e-4, 1e-3), "tf32": (1e-3, 1e-2), "fp16": (1e-2, 1e-2), "bf16": (3e-2, 3e-2)}
# Half precision is judged by one measure, in `grapec check` and in compile's calibration alike:
# ||out-ref||/||ref|| <= t per output, t the precision's tolerance (or --precision-tolerance).
# Not element by element: a half GEMM's output near zero (a sum that cancels) carries the rounding
# of its whole dot product, so allclose fails there on models that are right in every sense a user
# means (the cost-model calibration net: 1716 of 262144 elements, at rel-L2 3.6e-4). check still
# reports the elements outside allclose, and judges them too where --atol/--rtol are given.
# Compile accepts a half model only within HALF_MARGIN * t on every calibration draw, so that
# fresh inputs pass check at t.
HALF_TOLERANCE = {"fp16": 1e-2, "bf16": 3e-2}
HALF_MARGIN = 0.8


def check_limits(precision: str, precision_tolerance=None, atol=None, rtol=None) -> tuple:
    """(atol, rtol, rel-L2 limit) that `grapec check` judges by. In fp16/bf16 the rel-L2 limit
    judges, and atol/rtol only where given (else they are the precision's defaults, reported as a
    count of elements outside them, not judged); in fp32/tf32 allclose judges and the limit is None."""
    d_atol, d_rtol = TOLERANCES[precision]
    max_rel_l2 = half_limit(precision, precision_tolerance) if precision in HALF_TOLERANCE else None
    return d_atol if atol is None else atol, d_rtol if rtol is None else rtol, max_rel_l2


def half_limit(precision: str, tolerance: float | None = None, margin: float = 1.0) -> float:
    """The largest ||out-ref||/||ref|| the half-precision measure accepts, scaled by `margin`."""
    return (HALF_TOLERANCE[precision] if tolerance is None else tolerance) * margin


@dataclass
class OutputCheck:
    name: str
    shape: tuple
    max_abs: float
    max_rel: float      # max over elements of |out - ref| / |ref| (inf where ref is 0 and out is not)
    rel: float          # ||out - ref|| / ||ref||
    ok: bool
    bad: int = 0        # elements outside atol + rtol * |ref|
    note: str = ""


def compare(name, got: np.ndarray, ref: np.ndarray, atol: float, rtol: float,
            max_rel_l2: float | None = None, elementwise: bool = True) -> OutputCheck:
    """Passes on the same non-finite values, allclose(atol, rtol) on every element (where
    `elementwise`; else the elements outside it are only counted) and, where max_rel_l2 is given,
    ||got-ref||/||ref|| <= max_rel_l2."""
    if got.shape != ref.shape:
        return OutputCheck(name, got.shape, float("inf"), float("inf"), float("inf"), False, got.size,
                           f"shape {list(got.shape)} vs reference {list(ref.shape)}")
    g, r = got.astype(np.float64), ref.astype(np.float64)
    finite = np.isfinite(r) & np.isfinite(g)
    same_nonfinite = np.array_equal(np.isfinite(g), np.isfinite(r)) and np.array_equal(g[~finite], r[~finite])
    d = np.abs(np.where(finite, g - r, 0.0))
    r_abs = np.abs(np.where(finite, r, 0.0))
    mae = float(d.max()) if d.size else 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        rel_each = np.where(d == 0, 0.0, d / r_abs)
    max_rel = float(rel_each.max()) if d.size else 0.0
    den = float(np.linalg.norm(r_abs))
    rel = float(np.linalg.norm(d)) / den if den else (0.0 if mae == 0 else float("inf"))
    bad = int(np.count_nonzero(d > atol + rtol * r_abs))
    notes = []
    if bad:
        worst = np.unravel_index(int(np.argmax(d - rtol * r_abs)), d.shape)
        notes.append(f"{bad} of {d.size} elements outside atol+rtol*|ref|; worst at {list(map(int, worst))}: "
                     f"{g[worst]:.6g} vs {r[worst]:.6g}")
    if not same_nonfinite:
        notes.append("non-finite values differ")
    rel_ok = max_rel_l2 is None or rel <= max_rel_l2
    if not rel_ok:
        notes.append(f"||out-ref||/||ref|| {rel:.2e} above {max_rel_l2:g}")
    if bad and not elementwise:
        notes[0] += " (reported, not judged)"
    ok = (not bad or not elementwise) and same_nonfinite and rel_ok
    return OutputCheck(name, got.shape, mae, max_rel, rel, ok, bad, "; ".join(notes))


REFERENCES = ("onnxruntime", "onnx")


REFERENCES = {"onnxruntime": "onnxruntime CPU", "onnxruntime-cuda": "onnxruntime CUDA (no TF32)", "onnx": "onnx.reference"}


def reference_outputs(model_path, feeds: dict, reference: str = "onnxruntime") -> dict:
    """The model's outputs in fp32 from onnxruntime's CPU provider, its CUDA provider
    ("onnxruntime-cuda": onnxruntime-gpu, TF32 off, refused where the provider is missing or does
    not take the session), or onnx.reference (numpy, exact integer arithmetic; slow, but the
    arbiter where onnxruntime's x86 int8 kernels saturate)."""
    if reference == "onnx":
        return _onnx_reference(model_path, feeds)
    try:
        import onnxruntime as ort
    except ImportError:
        raise GrapecError("grapec check needs onnxruntime as the reference: pip install 'grapec[cpu]' (onnxruntime), or "
                          "'grapec[gpu]' (onnxruntime-gpu)") from None
    providers = ["CPUExecutionProvider"]
    if reference == "onnxruntime-cuda":
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise GrapecError("--reference onnxruntime-cuda: onnxruntime's CUDA provider is not installed here "
                              f"(providers: {', '.join(ort.get_available_providers())}); pip install 'grapec[gpu]' "
                              "(onnxruntime-gpu)")
        providers = [("CUDAExecutionProvider", {"use_tf32": "0"})]
    so = ort.SessionOptions()
    so.log_severity_level = 3
    try:
        s = ort.InferenceSession(str(model_path), so, providers=providers)
    except Exception as e:  # noqa: BLE001 - the reference failing is the user's model's problem
        raise GrapecError(f"onnxruntime could not load {model_path} as a reference: {str(e).splitlines()[0]}") from None
    if reference == "onnxruntime-cuda" and s.get_providers()[0] != "CUDAExecutionProvider":
        raise GrapecError(f"--reference onnxruntime-cuda: onnxruntime did not start its CUDA provider (it runs on "
                          f"{', '.join(s.get_providers())}); check its CUDA and cuDNN libraries")
    try:
        return dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds)))
    except Exception as e:  # noqa: BLE001 - the reference failing is the user's model's problem
        raise GrapecError(f"onnxruntime could not run {model_path} as a reference: {str(e).splitlines()[0]}") from None


def _onnx_reference(model_path, feeds: dict) -> dict:
    import onnx
    from onnx.reference import ReferenceEvaluator
    from onnx.reference.ops.op_dequantize_linear import DequantizeLinear_19

    class DequantizeLinear(DequantizeLinear_19):   # onnx.reference registers opset 19+ only;
        op_domain = ""                              # 10 and 13 are the same op with fewer types

        def _run(self, x, x_scale, x_zero_point=None, axis=1, block_size=0, output_dtype=None):
            return super()._run(x, x_scale, x_zero_point, axis)
    try:
        model = onnx.load(str(model_path))
        names = [o.name for o in model.graph.output]
        return dict(zip(names, ReferenceEvaluator(model, new_ops=[DequantizeLinear]).run(None, feeds)))
    except Exception as e:  # noqa: BLE001
        raise GrapecError(f"onnx.reference could not run {model_path}: {type(e).__name__}: {str(e).splitlines()[0][:200]}") from None


def check_model(model_path, shapes=None, dims=None, backend="cpu", rtol=None, seed=0, progress=None,
                precision="fp32", atol=None, inputs=None, values=None, calibration_inputs=None,
                precision_tolerance=None, reference="onnxruntime", calibration_dims=None, conv="auto"):
    """-> (list of OutputCheck, seconds grapec's run took). The reference runs the model in fp32:
    onnxruntime's CPU provider, its CUDA provider (reference="onnxruntime-cuda"), or onnx.reference
    (reference="onnx"). inputs: name -> array for inputs not drawn at random; values: inputs fixed at compile time."""
    import grapec
    from .bundle.format import Bundle
    from .inputs import bundle_inputs
    elementwise = precision not in HALF_TOLERANCE or atol is not None or rtol is not None
    atol, rtol, max_rel_l2 = check_limits(precision, precision_tolerance, atol, rtol)
    given = dict(inputs or {})
    shapes = {**{k: np.shape(v) for k, v in given.items()}, **(shapes or {})}
    bundle = grapec.compile(model_path, shapes=shapes, dims=dims, progress=progress, precision=precision,
                            targets=[] if backend == "cpu" else "auto", values=values,
                            calibration_inputs=calibration_inputs, precision_tolerance=precision_tolerance,
                            calibration_dims=calibration_dims, conv=conv)
    sess = grapec.load(Bundle.from_bytes(bundle.to_bytes()), backend=backend)
    feeds = {**bundle_inputs(bundle.manifest, 0, seed), **given}
    t0 = time.perf_counter()
    outs = sess.run(feeds)
    dt = time.perf_counter() - t0
    refs = reference_outputs(model_path, {**sess.fixed_inputs, **feeds}, reference)
    return [compare(n, outs[n], refs[n], atol, rtol, max_rel_l2, elementwise) for n in outs], dt
