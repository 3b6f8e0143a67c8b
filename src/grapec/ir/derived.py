"""Constants derived from the model's weights (a transposed copy, siblings concatenated), made once per
compile and shared by every graph that derives them.

A compile derives the same arrays from the same weights more than once: a generation's prompt pass
and its decode step (a Loop body compiled on its own) each merge the Q/K/V and gate/up weights and
each lay them out [N, K]; so do the buckets of a range that one process compiles. The bundle stores
such bytes once (passes/build_plan.py WeightStore), but until the compile ends each copy is alive: a
1.2 B decoder's compile held 1.5 GB of transposes twice. Inside `sharing()` (compiler/pipeline.py),
`derived` returns the array made before from the same source arrays, which it keeps alive with it
(so that their ids are not taken by new arrays while it lives). Outside, it makes a new one.
"""
from __future__ import annotations

import contextvars
from contextlib import contextmanager

_MEMO = contextvars.ContextVar("grapec_derived_constants", default=None)


@contextmanager
def sharing():
    """Derived constants made inside are shared until it exits (then they are the graphs' alone)."""
    token = _MEMO.set({})
    try:
        yield
    finally:
        _MEMO.reset(token)


def derived(kind: str, sources: tuple, make):
    """make() -> an array derived from `sources` (the graph's constant arrays, by identity) by `kind`
    (a name with every parameter of the derivation in it); the array made before for the same kind
    and sources, where there is one."""
    memo = _MEMO.get()
    if memo is None:
        return make()
    key = (kind,) + tuple(id(s) for s in sources)
    hit = memo.get(key)
    if hit is not None and all(a is b for a, b in zip(hit[0], sources)):
        return hit[1]
    out = make()
    memo[key] = (sources, out)
    return out
