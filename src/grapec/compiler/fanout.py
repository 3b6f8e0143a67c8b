"""Compiling many buckets at once: one forked process per core, their new weights and kernels merged
back into the one WeightStore and KernelStore of the bundle.

A range (`--dynamic seq=1:512`) is hundreds of buckets, each compiled exactly (the passes take the
decisions that suit its sizes), so the work is spread over processes. Where the stores are empty, the
first bucket is compiled here, before the fork, so the workers inherit the model's weights in the
stores and send back only what they added: the constants that depend on the bucket's sizes and its
kernels, each once. A worker's plan names those by its own offsets and indices, which `merge_result`
rewrites into the bundle's.
"""
from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import time
from typing import Callable

import numpy as np

from ..plan import KernelStep, walk_steps

_WORK: dict = {}   # set before the fork; the workers read it (nothing is pickled but the results)
_FORKED: dict = {}   # map_forked's, likewise


def default_jobs(n_items: int) -> int:
    """Processes to use: one per core up to 16, none beyond the work; 1 where fork is unavailable."""
    if n_items < 4 or "fork" not in multiprocessing.get_all_start_methods():
        return 1
    return max(1, min(n_items, os.cpu_count() or 1, 16))


def map_buckets(fn: Callable, items: list, weights, kernels, jobs: int | None = None,
                say: Callable = lambda m: None, each: Callable = lambda i, result: None) -> list:
    """[fn(item, weights, kernels) for item in items], in order, over `jobs` processes. fn returns an
    object with a `plan` attribute whose weight offsets and kernel indices point into the stores.
    each(i, result) is called here as each result comes in (merged into the stores), while the workers
    go on with the rest."""
    if not items:
        return []
    jobs = default_jobs(len(items)) if jobs is None else jobs
    t0 = time.perf_counter()
    if jobs <= 1 or len(items) == 1:
        results = []
        for i, it in enumerate(items):
            results.append(_progress(fn(it, weights, kernels), i + 1, len(items), t0, say))
            each(i, results[-1])
        return results
    # the first compiled here where the stores are empty: the workers then inherit the model's weights
    # (else each would send them all back); later calls (a range's rounds) fork at once
    results = [fn(items[0], weights, kernels)] if weights.size == 0 else []
    if results:
        each(0, results[0])
    _WORK.update(fn=fn, items=items, weights=weights, kernels=kernels, base=(weights.size, len(kernels.kernels)))
    say(f"compiling {len(items) - len(results)} more buckets on {jobs} processes")
    seen: dict = {}
    try:
        with frozen_heap(), multiprocessing.get_context("fork").Pool(jobs) as pool:
            for packed in pool.imap(_worker, range(len(results), len(items)), chunksize=1):
                merged = merge_result(packed, weights, kernels, _WORK["base"], seen)
                results.append(_progress(merged, len(results) + 1, len(items), t0, say))
                each(len(results) - 1, merged)
    finally:
        _WORK.clear()
    return results


def map_forked(fn: Callable, items: list, jobs: int | None = None, chunk: int = 512) -> list:
    """[fn(x) for x in items], in order, over `jobs` forked processes that inherit fn and items (only
    the results are pickled), a chunk of items at a time: for many small independent pieces of work
    (rendering a range bundle's hundreds of thousands of kernels). In this process where there is
    less than two chunks' work or one job."""
    jobs = default_jobs(len(items) // chunk) if jobs is None else jobs
    if jobs <= 1 or len(items) < 2 * chunk or "fork" not in multiprocessing.get_all_start_methods():
        return list(map(fn, items))
    _FORKED.update(fn=fn, items=items, chunk=chunk)
    out: list = []
    try:
        with frozen_heap(), multiprocessing.get_context("fork").Pool(jobs) as pool:
            for part in pool.imap(_forked_chunk, range(0, len(items), chunk)):
                out.extend(part)
    finally:
        _FORKED.clear()
    return out


_FROZEN = [0]   # frozen_heap's depth: the outermost one thaws


@contextlib.contextmanager
def frozen_heap():
    """The objects alive now (and at each nested entry) kept out of the garbage collector's reach until the
    outermost exit. A forked worker's full collection would otherwise walk every object the parent holds
    (a range's compiled plans: millions of them), writing to each one's header and so copying every page
    it shares with the parent (fork's copy-on-write), in every worker of every round; and the parent's
    own, between rounds, walked them all again (compile_range holds one around its rounds)."""
    _FROZEN[0] += 1
    gc.freeze()
    try:
        yield
    finally:
        _FROZEN[0] -= 1
        if not _FROZEN[0]:
            gc.unfreeze()


def _forked_chunk(lo: int) -> list:
    fn, items = _FORKED["fn"], _FORKED["items"]
    return [fn(x) for x in items[lo:lo + _FORKED["chunk"]]]


def _progress(result, done: int, total: int, t0: float, say):
    step = max(1, total // 10)
    if total > 10 and (done % step == 0 or done == total):
        say(f"{done}/{total} buckets compiled, {time.perf_counter() - t0:.1f}s")
    return result


def _worker(i: int):
    weights, kernels = _WORK["weights"], _WORK["kernels"]
    # a worker compiles several buckets: it sends what it added since its last result (once each, not
    # again with every later one), and the parent keeps its indices per worker (merge_result)
    w_sent, k_sent = _WORK.setdefault("sent", _WORK["base"])
    result = _WORK["fn"](_WORK["items"][i], weights, kernels)
    new_weights = [(off, data) for off, data in weights.entries if off >= w_sent]
    _WORK["sent"] = (weights.size, len(kernels.kernels))
    return os.getpid(), result, new_weights, k_sent, kernels.kernels[k_sent:]


def merge_result(packed, weights, kernels, base: tuple, seen: dict):
    """A worker's result with its new weights and kernels added to this process's stores, and its
    plan's offsets and indices rewritten to match. base: the stores' sizes at the fork (below them,
    offsets and indices are the same in every process); seen: worker pid -> (its weight offsets,
    its kernel indices) -> this process's, for what it sent with earlier results."""
    pid, result, new_weights, k_sent, new_kernels = packed
    w0, k0 = base
    weight_at, kernel_at = seen.setdefault(pid, ({}, {}))
    weight_at.update((off, weights.add(np.frombuffer(data, np.uint8))) for off, data in new_weights)
    kernel_at.update((k_sent + j, kernels.add_json(k)) for j, k in enumerate(new_kernels))
    plan = result.plan
    for b in plan.buffers:
        if b.space == "weight" and b.offset >= w0:
            b.offset = weight_at[b.offset]
    for st in walk_steps(plan.steps):
        if isinstance(st, KernelStep) and st.kernel >= k0:
            st.kernel = kernel_at[st.kernel]
    return result
