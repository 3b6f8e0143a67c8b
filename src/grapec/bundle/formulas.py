"""A launch structure's numbers as formulas of its sizes: the records a range bundle stores for each
family of sizes (bundle/families.py) and their evaluation. compiler/formulas.py fits them.

    NumberFit.numbers(sizes) -> every number at those sizes (an int64 matrix, a row per size)
    NumberFit.to_json() / NumberFit.from_json(doc)
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np


def monomials(nvars: int, degree: int) -> list:
    """Exponent tuples of total degree <= `degree`, each exponent <= 2, lowest degree first."""
    return list(_monomials(nvars, degree))


@functools.lru_cache(maxsize=256)
def _monomials(nvars: int, degree: int) -> tuple:
    # built exponent by exponent within the degree: the fits' variables include every round-up found,
    # and the 3 ** nvars tuples of all exponents were most of a 2-D range's fitting time
    def within(n: int, left: int):
        if n == 0:
            yield ()
            return
        for p in range(min(2, left) + 1):
            for rest in within(n - 1, left - p):
                yield (p,) + rest
    return tuple(sorted(within(nvars, degree), key=lambda e: (sum(e), [-x for x in e])))


def design(cols: np.ndarray, monos: list) -> np.ndarray:
    """cols: n x m int64 variable values -> n x len(monos) int64 monomial values."""
    out = np.ones((cols.shape[0], len(monos)), np.int64)
    for j, e in enumerate(monos):
        for v, p in enumerate(e):
            if p:
                out[:, j] *= cols[:, v] ** p
    return out


@dataclass
class Rounded:
    """A variable beside the dims: P's values rounded up to a multiple of `to` (or divided by it,
    rounding up), P a polynomial in the variables before it."""
    monos: list
    coefs: np.ndarray
    to: int
    divide: bool

    def values(self, cols: np.ndarray) -> np.ndarray:
        q = -(-(design(cols, self.monos) @ self.coefs) // self.to)
        return q if self.divide else q * self.to


@dataclass
class NumberFit:
    """Every int of one structure's documents as a function of its sizes: slots[j] is (monomials over
    the variables, integer coefficients), or None where no formula fits."""
    extra: list = field(default_factory=list)   # Rounded variables, each over the ones before it
    slots: list = field(default_factory=list)

    def columns(self, sizes: np.ndarray) -> np.ndarray:
        cols = np.asarray(sizes, np.int64)
        for r in self.extra:
            cols = np.column_stack([cols, r.values(cols)])
        return cols

    @property
    def complete(self) -> bool:
        return all(s is not None for s in self.slots)

    def numbers(self, sizes: np.ndarray, slots: list | None = None) -> np.ndarray:
        """len(sizes) x slots: the ints at each size (complete fits only); `slots`: only these, in order."""
        cols = self.columns(np.asarray(sizes, np.int64).reshape(len(sizes), -1))
        chosen = range(len(self.slots)) if slots is None else slots
        out = np.empty((len(cols), len(chosen)), np.int64)
        by_basis: dict = {}
        for i, j in enumerate(chosen):
            monos, coefs = self.slots[j]
            by_basis.setdefault(tuple(map(tuple, monos)), []).append((i, coefs))
        for monos, group in by_basis.items():
            out[:, [i for i, _ in group]] = design(cols, list(monos)) @ np.column_stack([c for _, c in group])
        return out

    def constant(self, j: int) -> int | None:
        """Slot j's value where its formula is a constant, else None."""
        monos, coefs = self.slots[j]
        return int(coefs[0]) if len(monos) == 1 and not any(monos[0]) else None

    def add_constant(self, j: int, value: int):
        """Slot j's formula plus a constant."""
        monos, coefs = self.slots[j]
        zero = tuple(0 for _ in monos[0]) if monos else None
        if monos and zero in [tuple(m) for m in monos]:
            coefs = coefs.copy()
            coefs[[tuple(m) for m in monos].index(zero)] += value
            self.slots[j] = (monos, coefs)
        else:
            self.slots[j] = ([zero] + list(monos), np.concatenate([[value], coefs]).astype(np.int64))

    def set_constant(self, j: int, value: int):
        monos, _ = self.slots[j]
        self.slots[j] = (monos, np.array([value], np.int64))

    # --- stored ------------------------------------------------------------------------------------
    def to_json(self) -> dict:
        """Each distinct monomial list once ("bases"); a slot is [basis, coefficients]."""
        bases: dict = {}
        slots = []
        for monos, coefs in self.slots:
            k = bases.setdefault(tuple(map(tuple, monos)), len(bases))
            slots.append([k, [int(c) for c in coefs]])
        return {"bases": [[list(e) for e in b] for b in bases],
                "extra": [{"monos": [list(e) for e in r.monos], "coefs": [int(c) for c in r.coefs], "to": int(r.to),
                           "divide": bool(r.divide)} for r in self.extra],
                "slots": slots}

    @staticmethod
    def from_json(d: dict) -> "NumberFit":
        """Raises KeyError/TypeError/ValueError/IndexError on a malformed record."""
        nvars_of = []   # each basis' exponent count, checked against the variables when evaluated
        bases = [[tuple(int(p) for p in e) for e in b] for b in d["bases"]]
        for b in bases:
            if len({len(e) for e in b}) > 1 or any(p < 0 or p > 3 for e in b for p in e):
                raise ValueError("malformed monomials")
            nvars_of.append(len(b[0]) if b else 0)
        extra = [Rounded([tuple(int(p) for p in e) for e in r["monos"]], np.array(r["coefs"], np.int64), int(r["to"]),
                         bool(r["divide"])) for r in d["extra"]]
        if any(r.to < 1 or len(r.monos) != len(r.coefs) for r in extra):
            raise ValueError("malformed round-up")
        slots = []
        for k, coefs in d["slots"]:
            if not isinstance(k, int) or not 0 <= k < len(bases) or len(coefs) != len(bases[k]):
                raise ValueError("malformed formula")
            slots.append((bases[k], np.array(coefs, np.int64)))
        return NumberFit(extra, slots)
