"""Fitting a profile's coefficients to measured node times (what `grapec calibrate` does on the GPU).

The fit minimises the *relative* error (each sample's row is divided by its measured time), since a
1 us kernel matters as much to a plan's choices as a 30 us one; coefficients are kept non-negative,
so every feature costs time, as it does on the hardware.
"""
from __future__ import annotations

import numpy as np

from .model import FEATURES, features


def fit_coefficients(samples: list, sms: int) -> dict:
    """samples: [(Work, measured us)] -> {kind: {feature: us per unit}} for the kinds present."""
    out = {}
    for kind, names in FEATURES.items():
        rows = [(features(w, sms), us) for w, us in samples if w.kind == kind and us > 0]
        if not rows:
            continue
        x = np.array([[f[n] for n in names] for f, _ in rows], np.float64)
        y = np.array([us for _, us in rows], np.float64)
        coef = nonnegative_lstsq(x / y[:, None], np.ones_like(y))
        out[kind] = {n: float(c) for n, c in zip(names, coef)}
    return out


def nonnegative_lstsq(a: np.ndarray, b: np.ndarray, rounds: int = 50) -> np.ndarray:
    """min ||a x - b|| subject to x >= 0 (Lawson-Hanson active set, small problems only)."""
    n = a.shape[1]
    x = np.zeros(n)
    free = np.zeros(n, bool)
    for _ in range(rounds):
        grad = a.T @ (b - a @ x)
        candidates = np.where(~free & (grad > 1e-12))[0]
        if candidates.size == 0:
            break
        free[candidates[np.argmax(grad[candidates])]] = True
        while True:
            z = np.zeros(n)
            z[free] = np.linalg.lstsq(a[:, free], b, rcond=None)[0]
            if np.all(z[free] > 0):
                x = z
                break
            neg = free & (z <= 0)
            step = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + step * (z - x)
            free &= x > 1e-15
            x[~free] = 0.0
    return x


def relative_errors(samples: list, coefficients: dict, sms: int) -> list:
    """|estimate - measured| / measured per sample."""
    out = []
    for w, us in samples:
        f = features(w, sms)
        est = sum(coefficients.get(w.kind, {}).get(n, 0.0) * f[n] for n in FEATURES[w.kind])
        out.append(abs(est - us) / us)
    return out
