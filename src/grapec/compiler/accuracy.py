"""How an output is judged against a reference: `grapec check` reports with it, and compile's
half-precision calibration accepts or refuses a model with the same measure.

Per output: max-abs error, max-rel error (|out-ref| / |ref|) and ||out-ref|| / ||ref||. An output
passes when every element satisfies |out - ref| <= atol + rtol * |ref| (numpy's allclose), so an
output near zero is judged by atol rather than by a relative error that blows up.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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
