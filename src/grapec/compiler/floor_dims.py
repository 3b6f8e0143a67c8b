"""Sizes inside a model that are floors of a range's dims (issue 33: Wav2Vec2's `--dynamic samples`).

A strided convolution's output length is floor((L + pads - dilation * (kernel - 1) - 1) / stride) + 1,
and a stack of them gives floor((x + o) / p) + c, p the product of the strides (a floor of a floor by
an integer is one floor). No polynomial in x is such a number, so a range's formulas (formulas.py) would
fit none of the numbers that follow it: every size of the range compiled on its own. Each such floor is
instead a variable of the formulas beside the dims (bundle/formulas.py Rounded, ceil((x + o - p + 1) / p)),
found here before anything is compiled, by evaluating the model's shapes at a few sizes
(passes/specialize.py: milliseconds a size, not a compile's seconds):

    floor_dims(dims_at, ranges) -> [FloorDim]   dims_at(size) -> {(value, axis): length} at that size

A length that steps is bisected for two consecutive steps (its period p and phase o), then checked at
every size evaluated; one that is not such a floor (a sum of two with other periods) is left out, and its
numbers fit as before (or their sizes are compiled).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..bundle.formulas import Rounded

SPREAD = 9   # sizes spread over a dim's range that tell the lengths that follow it apart


@dataclass(frozen=True)
class FloorDim:
    """floor((x + o) / p) * a + c, x the range's dim `dim` (0 <= o < p)."""
    dim: int
    p: int
    o: int
    a: int = 1
    c: int = 0

    def at(self, x: int) -> int:
        return (x + self.o) // self.p * self.a + self.c

    def variable(self, ndims: int) -> Rounded:
        """floor((x + o) / p) as the formulas' variable (its scale and offset are the polynomials')."""
        unit = tuple(int(i == self.dim) for i in range(ndims))
        return Rounded([unit, tuple([0] * ndims)], np.array([1, self.o - self.p + 1], np.int64), self.p, True)


def floor_dims(dims_at: Callable[[tuple], dict], ranges: list) -> list:
    """The distinct floors (by dim, p and o) among the lengths dims_at gives, over `ranges` ([(lo, hi)]
    per dim; the other dims at their largest while one is searched)."""
    found: dict = {}
    for d, (lo, hi) in enumerate(ranges):
        if hi - lo < 2:
            continue
        cache: dict = {}

        def at(x: int, d=d, cache=cache) -> dict:
            if x not in cache:
                cache[x] = dims_at(tuple(x if i == d else h for i, (_, h) in enumerate(ranges)))
            return cache[x]
        xs = sorted({int(round(v)) for v in np.linspace(lo, hi, SPREAD)})
        signatures: dict = {}
        for key in at(xs[0]):
            sig = tuple(at(x).get(key) for x in xs)
            if None not in sig and len(set(sig)) > 1 and not _affine(xs, sig):
                signatures.setdefault(sig, key)
        for key in signatures.values():
            f = _floor_of(lambda x, key=key: at(x)[key], lo, hi, d)
            if f is not None and all(f.at(x) == got[key] for x, got in cache.items() if key in got):
                found.setdefault((f.dim, f.p, f.o), f)
    return list(found.values())


def _affine(xs: list, ys: tuple) -> bool:
    """ys = a * x + b with integers a, b (a polynomial already fits it)."""
    if (ys[-1] - ys[0]) % (xs[-1] - xs[0]):
        return False
    a = (ys[-1] - ys[0]) // (xs[-1] - xs[0])
    return all(y - a * x == ys[0] - a * xs[0] for x, y in zip(xs, ys))


def _floor_of(length: Callable[[int], int], lo: int, hi: int, dim: int) -> FloorDim | None:
    """The length as floor((x + o) / p) * a + c from two consecutive steps, or None (it falls, or
    steps once in the range only)."""
    first = _next_step(length, lo, hi)
    second = None if first is None else _next_step(length, first, hi)
    if second is None:
        return None
    a = length(first) - length(first - 1)
    if a <= 0 or length(second) - length(second - 1) != a:
        return None
    p = second - first
    o = -first % p
    return FloorDim(dim, p, o, a, length(first) - (first + o) // p * a)


def _next_step(length: Callable[[int], int], start: int, hi: int) -> int | None:
    """The least x in (start, hi] with length(x) != length(start) (bisection: a floor does not step
    back), or None."""
    base = length(start)
    if length(hi) == base:
        return None
    low, high = start, hi   # length(low) == base, length(high) != base
    while high - low > 1:
        mid = (low + high) // 2
        if length(mid) == base:
            low = mid
        else:
            high = mid
    return high
