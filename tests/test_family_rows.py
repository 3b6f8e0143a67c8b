"""compiler/families.py fit_cuda_rows: a family's CUDA launch rows as formulas of its sizes, fitted over its compiled
sizes and checked at its spot members. The rows here are tiny Wav2Vec2's first im2col kernel over 2600..3874 samples
(session 54): ceil(L / 8) blocks of 256 threads, L = ceil((samples - 4) / 5) - 1 frames."""
from types import SimpleNamespace

import numpy as np

from grapec.bundle.formulas import Rounded
from grapec.compiler import families

FRAMES = Rounded(monos=[(1,), (0,)], coefs=np.array([1, -4]), to=5, divide=True)   # ceil((samples - 4) / 5)
# the compiled sizes the range compile drew for that family: none has L = 0 mod 8
EVIDENCE = [2600, 2601, 2639, 2674, 2743, 2744, 2852, 3240, 3346, 3351, 3474, 3533, 3547, 3702, 3722, 3785]


def _frames(s: int) -> int:
    return -(-(s - 4) // 5) - 1


def _rows(s: int) -> list:
    n = _frames(s)
    return [["k_im2col", ["element", -(-n // 8), 256, 0], [["i64", 32 * n], ["i64", n]]]]


def _family(spots: list) -> SimpleNamespace:
    plan_fit = SimpleNamespace(extra=[FRAMES], slots=[])
    return SimpleNamespace(evidence=[(s,) for s in EVIDENCE], spots=[(s,) for s in spots], floors=[FRAMES],
                           fit=[plan_fit])


def _fit(spots, monkeypatch):
    # a "plan" here is its CUDA rows already: the function reads them through these two
    monkeypatch.setattr(families, "kernel_order", lambda plan: plan)
    monkeypatch.setattr(families, "cuda_rows", lambda entry, kernels: kernels)
    plan_of = {(s,): _rows(s) for s in EVIDENCE + spots}
    return families.fit_cuda_rows(_family(spots), {}, plan_of)


def test_a_spot_the_compiled_sizes_cannot_tell_apart_joins_them_and_the_rest_check_the_new_fit(monkeypatch):
    assert not [s for s in EVIDENCE if _frames(s) % 8 == 0]   # ceil((L + 1) / 8) fits them as well as ceil(L / 8)
    spots = [2602, 3000, 3500, 3769, 3874]
    assert [s for s in spots if _frames(s) % 8 == 0] == [3769]
    fit = _fit(spots, monkeypatch)
    assert not isinstance(fit, str), fit
    sizes = np.arange(2600, 3875)
    for s, rows in zip(sizes, fit.join(sizes.reshape(-1, 1))):
        assert rows == _rows(int(s)), (int(s), rows, _rows(int(s)))


def test_a_refit_is_refused_where_too_few_spots_would_be_left_to_check_it(monkeypatch):
    # three of the five spots tell the formulas apart: past REFIT_SPOTS, the family is stored plan by plan
    spots = sorted(s for s in range(2603, 3874) if _frames(s) % 8 == 0)[:3] + [2602, 3874]
    why = _fit(spots, monkeypatch)
    assert isinstance(why, str) and "launches otherwise than its formulas say" in why, why
