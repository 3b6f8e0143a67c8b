"""A launch structure's numbers as formulas of its sizes (compiler/structures.py, step 3): integer
polynomials in the dims and in round-ups of them, fitted exactly over the sizes compiled.

    fit_numbers(sizes, ints) -> NumberFit (bundle/formulas.py): per number, (monomials, integer
                               coefficients) or None
    spans(sizes, members) -> whether a fit over `sizes` is determined over `members`
"""
from __future__ import annotations

import numpy as np

from ..bundle.formulas import NumberFit, Rounded, design as _design, monomials as _monomials

ROUND_UPS = (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)   # 1024: element grids of 4 elements a thread
MAX_ROUNDED_CANDIDATES = 64   # polynomials tried as what a number rounds up
MAX_GIVEN_CANDIDATES = 4096   # and of the ones given (fit_numbers' `rounded`: a plan's numbers)
SPARE_SIZES = 1    # a polynomial is fitted over at least this many sizes more than it has terms


def fit_numbers(sizes: np.ndarray, ints: np.ndarray, extra: list = (), rounded: list = ()) -> NumberFit:
    """sizes: n x dims, ints: n x slots (the compiled sizes of one structure) -> their formulas.
    extra: variables beside the dims from the start (a model's floors of them: floor_dims.py).
    rounded: more polynomials over those variables whose round-ups a number may be (the plan's numbers,
    for its launch rows: a grid of ceil(bytes / 1024) blocks over a buffer whose bytes round up too)."""
    sizes = np.asarray(sizes, np.int64)
    n, slots = ints.shape
    fit = NumberFit(extra=list(extra), slots=[None] * slots)
    todo = list(range(slots))
    for _ in range(3):   # polynomials; round-ups of what failed; polynomials in those too
        cols = fit.columns(sizes)
        todo = _fit_polynomials(fit, cols, ints, todo, n)
        if not todo or not _fit_round_ups(fit, cols, ints, todo, rounded):
            break
    if todo:
        _fit_lines(fit, fit.columns(sizes), ints, todo, n)
    return fit


def _fit_lines(fit: NumberFit, cols: np.ndarray, ints: np.ndarray, todo: list, n: int):
    """What is left, in a constant and one variable, or one variable and a dim or an earlier variable with
    their product (a grid of ceil(s / 4) blocks, b * ceil(s / 16), frames x their padded row), or one variable and its square (a score matrix over a
    floor of the dims: Wav2Vec2's frames x frames): where many round-ups or floors were found, a
    polynomial in all the variables has more terms than there are sizes."""
    nvars, ndims = cols.shape[1], cols.shape[1] - len(fit.extra)
    zero = tuple([0] * nvars)
    unit = [tuple(int(i == v) for i in range(nvars)) for v in range(nvars)]
    bases = [[zero, unit[v]] for v in range(nvars)]
    bases += [[zero, unit[d], unit[v], tuple(a + b for a, b in zip(unit[d], unit[v]))]
              for v in range(ndims, nvars) for d in range(v)]
    bases += [[zero, unit[v], tuple(2 * a for a in unit[v])] for v in range(nvars)]
    for basis in bases:
        if not todo:
            return
        monos = _independent(cols, basis)
        if len(monos) + SPARE_SIZES > n:
            continue
        a = _design(cols, monos)
        y = ints[:, todo]
        coefs = np.rint(np.linalg.lstsq(a.astype(np.float64), y.astype(np.float64), rcond=None)[0]).astype(np.int64)
        exact = (a @ coefs == y).all(axis=0)
        for k, j in enumerate(todo):
            if exact[k]:
                fit.slots[j] = (monos, coefs[:, k])
        todo[:] = [j for k, j in enumerate(todo) if not exact[k]]


def _fit_polynomials(fit: NumberFit, cols: np.ndarray, ints: np.ndarray, todo: list, n: int) -> list:
    for degree in range(0, 4):
        if not todo:
            break
        monos = _independent(cols, _monomials(cols.shape[1], degree))
        if len(monos) + SPARE_SIZES > n and degree:   # as many terms as sizes: any numbers would fit
            break
        a = _design(cols, monos)
        y = ints[:, todo]
        coefs = np.rint(np.linalg.lstsq(a.astype(np.float64), y.astype(np.float64), rcond=None)[0]).astype(np.int64)
        exact = (a @ coefs == y).all(axis=0)
        rest = []
        for k, j in enumerate(todo):
            if exact[k]:
                fit.slots[j] = (monos, coefs[:, k])
            else:
                rest.append(j)
        todo = rest
    return todo


def _independent(cols: np.ndarray, monos: list) -> list:
    """The monomials, lowest first, that are not combinations of earlier ones over these sizes (a
    round-up of s is s plus one of a few offsets: its square adds nothing), so that an exact fit is
    the only one, and integer where the numbers are."""
    a = _design(cols, monos).astype(np.float64)
    a /= np.maximum(np.abs(a).max(axis=0), 1.0)
    kept: list = []
    for j in range(len(monos)):
        if np.linalg.matrix_rank(a[:, kept + [j]]) > len(kept):
            kept.append(j)
    return [monos[j] for j in kept]


def _fit_round_ups(fit: NumberFit, cols: np.ndarray, ints: np.ndarray, todo: list, rounded: list = ()) -> bool:
    """Each unfitted slot that is a round-up (or rounded-up division) of a monomial (b, s, b * s), of a
    fitted polynomial or of one of `rounded` makes that a new variable. -> whether any did."""
    candidates = [([e], np.array([1], np.int64)) for e in _monomials(cols.shape[1], 2) if sum(e)]
    seen = set()
    for slot in fit.slots:
        if slot is not None and any(sum(e) for e in slot[0]) and len(candidates) < MAX_ROUNDED_CANDIDATES:
            k = (tuple(slot[0]), tuple(slot[1].tolist()))
            if k not in seen:
                seen.add(k)
                candidates.append(slot)
    for slot in rounded:   # after the fit's own: those it found first keep their place
        k = (tuple(map(tuple, slot[0])), tuple(slot[1].tolist()))
        if any(sum(e) for e in slot[0]) and k not in seen and len(seen) < MAX_GIVEN_CANDIDATES:
            seen.add(k)
            candidates.append(slot)
    y = ints[:, todo]
    left = np.ones(len(todo), bool)
    found = False
    # what a round-up may be multiplied by: a dim or a variable found before (a floor of the dims)
    dims = [np.ones(len(cols), np.int64)] + [cols[:, d] for d in range(cols.shape[1])]
    for monos, coefs in candidates:
        p = _design(cols, monos) @ coefs
        if (p == p[0]).all():
            continue
        for to in ROUND_UPS:
            q = -(-p // to)
            for divide in (False, True):
                v = (q if divide else q * to)[:, None]
                # the round-up itself, or it times a dim (b * ceil(s / 16) blocks): a polynomial in it then fits
                hit = left & np.logical_or.reduce([(y == v * f[:, None]).all(axis=0) for f in dims])
                if hit.any():
                    fit.extra.append(Rounded(list(monos), coefs, to, divide))
                    left &= ~hit
                    found = True
        if not left.any():
            break
    return found


def spans(sizes: list, members: list, extra: list = ()) -> bool:
    """Whether a formula fitted over `sizes` is determined over `members`: the cubics in the dims
    (b * s * round_up(s, 4): a score matrix's bytes), and the `extra` variables (the model's floors of the
    dims, floor_dims.py), have the same rank over both. Sizes compiled along one line, as a bisection makes
    them, would take b * s for a multiple of s; sizes whose floor(x / 10) are all even would take it for
    2 * floor(x / 20), and derive the odd ones wrong."""
    monos = _monomials(len(members[0]), 3)
    ndims = len(members[0])

    def rank(points):
        pts = np.array(points, np.int64)
        a = _design(pts, monos)
        if extra:   # the floors, and each times a dim (batch x frames: a buffer's rows)
            floors = NumberFit(extra=list(extra)).columns(pts)[:, ndims:]
            a = np.column_stack([a, floors] + [floors * pts[:, d:d + 1] for d in range(ndims)])
        a = a.astype(np.float64)
        return np.linalg.matrix_rank(a / np.maximum(np.abs(a).max(axis=0), 1.0))
    return rank(sizes) == rank(members)
