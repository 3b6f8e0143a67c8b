"""A masked load's index under what its mask implies (ir/kernel.py load, _guarded): where the mask holds
x < n with x >= 0, x % n is x and x / n is 0. Checked by the expression built and, on every element,
by the numpy interpreter against numpy itself (including the elements where the mask is false)."""
import numpy as np

from grapec.ir import kernel as K
from grapec.ir.interpret import run_kernel

I64 = "int64"


def c(v):
    return K.const(v, I64)


def ops(e) -> set:
    return {node.op for node in K.walk(e)}


def run(body, shape, x):
    return run_kernel(K.Kernel(shape, "float32", body, ((x.shape, "float32"),)), [x])


def test_a_wrap_the_mask_excludes_is_read_as_the_plain_index():
    i, n = K.idx(0), c(7)
    wrapped = K.binary("add", K.binary("mul", K.binary("mod", i, n), c(3)), K.binary("div", i, n))
    body = K.load(0, (wrapped,), "float32", K.binary("lt", i, n), K.const(-1.0, "float32"))
    assert body.args[1] == (K.binary("mul", i, c(3)),)   # mod -> i, div -> 0
    x = np.random.default_rng(0).standard_normal(21).astype(np.float32)
    at = np.arange(12)
    want = np.where(at < 7, x[np.minimum(at % 7 * 3 + at // 7, 20)], -1.0)
    np.testing.assert_array_equal(run(body, (12,), x), want)


def test_an_index_that_may_be_negative_keeps_its_wrap_unless_the_mask_bounds_it_below():
    i, n = K.idx(0), c(9)
    x_minus = K.binary("sub", i, c(4))
    only_upper = K.load(0, (K.binary("mod", x_minus, n),), "float32", K.binary("lt", x_minus, n))
    assert "mod" in ops(only_upper.args[1][0])   # i - 4 < 9 allows i - 4 < 0, where C's % differs
    both = K.binary("and", K.binary("ge", x_minus, c(0)), K.binary("lt", x_minus, n))
    bounded = K.load(0, (K.binary("mod", x_minus, n),), "float32", both)
    assert bounded.args[1] == (x_minus,)
    x = np.random.default_rng(1).standard_normal(9).astype(np.float32)
    at = np.arange(16)
    inside = (at >= 4) & (at - 4 < 9)
    want = np.where(inside, x[np.clip(at - 4, 0, 8)], 0.0)
    np.testing.assert_array_equal(run(bounded, (16,), x), want)
    # C's remainder of a negative dividend is negative: unmasked there, so it must keep its mod
    rem = np.fmod(at - 4, 9)
    want_upper = np.where(at - 4 < 9, x[np.clip(rem, 0, 8)], 0.0)
    np.testing.assert_array_equal(run(only_upper, (16,), x), want_upper)


def test_a_conjunct_is_rewritten_under_another_and_the_mask_keeps_its_value():
    """(i % 5) * 2 < 6 and i < 5: the first conjunct becomes i * 2 < 6, which differs from it at i >= 5,
    where the second makes the mask false either way."""
    i, n = K.idx(0), c(5)
    first = K.binary("lt", K.binary("mul", K.binary("mod", i, n), c(2)), c(6))
    mask = K.binary("and", first, K.binary("lt", i, n))
    body = K.load(0, (K.binary("mod", i, n),), "float32", mask, K.const(7.0, "float32"))
    assert "mod" not in ops(body)
    x = np.arange(5, dtype=np.float32) + 1
    at = np.arange(14)
    want = np.where((at % 5 * 2 < 6) & (at < 5), x[at % 5], 7.0)
    np.testing.assert_array_equal(run(body, (14,), x), want)


def test_float_remainders_and_unmasked_selects_are_left_alone():
    i = K.idx(0)
    f = K.cast(i, "float32")
    fmod = K.binary("mod", f, K.const(3.0, "float32"))
    masked = K.load(0, (K.cast(fmod, I64),), "float32", K.binary("lt", f, K.const(3.0, "float32")))
    assert "mod" in ops(masked)   # only integers: float x < n says nothing of C's integer % here
    # a where's branches are both computed by the CUDA renderer (a load in one is read regardless),
    # so only a load's own mask licenses the rewrite
    n = c(4)
    plain = K.load(0, (K.binary("mod", i, n),), "float32")
    sel = K.where(K.binary("lt", i, n), plain, K.const(0.0, "float32"))
    assert "mod" in ops(sel)


def test_a_select_of_a_load_under_its_own_mask_and_other_is_the_load():
    i, n = K.idx(0), c(6)
    mask = K.binary("lt", i, n)
    read = K.load(0, (i,), "float32", mask, K.const(0.0, "float32"))
    assert K.where(mask, read, K.const(0.0, "float32")) is read
    assert K.where(mask, read, K.const(1.0, "float32")) is not read   # another value where the mask is false
    x = np.random.default_rng(2).standard_normal(6).astype(np.float32)
    body = K.where(mask, read, K.const(1.0, "float32"))
    np.testing.assert_array_equal(run(body, (9,), x), np.concatenate([x, np.ones(3, np.float32)]))
