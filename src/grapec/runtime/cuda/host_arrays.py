"""Page-locked host arrays for the outputs a run copies off the GPU, reused from run to run.

A copy into pageable memory goes through the driver's staging buffer, and a fresh numpy array of
many megabytes is fresh pages: each faulted in by the copy itself. GPT-2's float32 logits reach 103 MB
at 512 tokens; over uniform random lengths (51 MB on average) a request with numpy in and out took 5.9
and 18.2 ms on two H200 hosts for 0.66 ms of device work, and 1.71 ms with the copies into locked pages
(benchmarks/results/2026-11-28-h200-s51, -s52).

So an output of at least PINNED_FROM bytes is copied into a block of page-locked memory
(cuMemAllocHost) and handed out as a numpy array over it. The block goes back to the pool when the
last array or view over it is gone (its `_Lease`, the arrays' base, is collected); a later run takes
the smallest idle block that holds its output without wasting more than REUSE_WITHIN times its size.
The pool holds at most POOL_BYTES of locked memory per GPU; past it, idle blocks are freed least
recently used first, and where the blocks still in use fill it the output is a plain numpy array
(pageable, as before) until some come back.

Blocks are never freed while an array uses them. The primary context they belong to is retained for
the life of the process (driver.Device), so an output outlives its session safely.
"""
from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass

import numpy as np

from .driver import call

PINNED_FROM = 1 << 20    # smaller outputs: the driver's staging copy is as fast
POOL_BYTES = 1 << 30     # locked host memory the pool may hold per GPU (taken from the OS's pageable memory)
REUSE_WITHIN = 4         # a block serves an output of at least 1/REUSE_WITHIN of its size


@dataclass
class _Block:
    ptr: int
    nbytes: int
    used_at: int = 0   # the pool's clock when last handed out (eviction: the least recent idle block first)


class _Lease:
    """A block lent out as one array's memory: numpy keeps it as the array's (and every view's) base, so
    it is collected, and the block given back, when no array over it is left."""

    def __init__(self, pool: "HostArrays", block: _Block, shape: tuple, dtype: np.dtype):
        self.pool, self.block = pool, block
        self.__array_interface__ = {"data": (block.ptr, False), "shape": tuple(shape), "typestr": dtype.str,
                                    "version": 3}

    def __del__(self):
        pool = self.pool
        if pool is not None:
            self.pool = None
            pool._give_back(self.block)


def _block_size(nbytes: int) -> int:
    """nbytes rounded up to a power of two: a block then serves every output down to a quarter of it, and
    a traffic of many lengths allocates a few blocks per doubling (allocating locks pages, the pool's one
    slow step). With blocks rounded up by an eighth instead, GPT-2's traffic over 512 lengths allocated 52."""
    return 1 << max(nbytes - 1, 1).bit_length()


class HostArrays:
    """One GPU's pool of page-locked output arrays (`for_device` makes one per GPU)."""

    def __init__(self, device):
        self.device = device
        self.capacity = POOL_BYTES
        self._idle: list = []        # idle blocks, sorted by size
        self._returned: list = []    # blocks given back, not yet sorted in: a lease may be collected
        #                              inside _take (the collector runs anywhere), so giving back takes no lock
        self._held = 0               # bytes of every block, idle or lent
        self._clock = 0
        self._lock = threading.Lock()
        self.allocated = 0           # blocks allocated so far (a test's and a benchmark's view of the reuse)
        self.pageable = 0            # outputs handed out pageable because lent blocks filled the pool

    def empty(self, shape, dtype) -> np.ndarray:
        """An uninitialized array to copy an output into: page-locked where it is large enough."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if nbytes < PINNED_FROM:
            return np.empty(shape, dtype)
        block = self._take(nbytes)
        if block is None:
            return np.empty(shape, dtype)
        return np.asarray(_Lease(self, block, shape, dtype))

    def _take(self, nbytes: int) -> _Block | None:
        with self._lock:
            self._clock += 1
            while self._returned:
                bisect.insort(self._idle, self._returned.pop(), key=lambda b: b.nbytes)
            i = bisect.bisect_left([b.nbytes for b in self._idle], nbytes)
            if i < len(self._idle) and self._idle[i].nbytes <= REUSE_WITHIN * nbytes:
                block = self._idle.pop(i)
                block.used_at = self._clock
                return block
            size = _block_size(nbytes)
            for old in sorted(self._idle, key=lambda b: b.used_at):   # make room: least recently used first
                if self._held + size <= self.capacity:
                    break
                self._idle.remove(old)
                self._free(old)
            if self._held + size > self.capacity:
                self.pageable += 1
                return None
            block = _Block(self._allocate(size), size, self._clock)
            self._held += size
            self.allocated += 1
            return block

    def _give_back(self, block: _Block):
        self._returned.append(block)   # atomic in CPython; sorted in by the next _take

    def _free(self, block: _Block):
        self._release(block.ptr)
        self._held -= block.nbytes

    def _allocate(self, nbytes: int) -> int:
        self.device.make_current()
        return int(call("cuMemAllocHost", nbytes))

    def _release(self, ptr: int):
        self.device.make_current()
        call("cuMemFreeHost", ptr)

    @property
    def held_bytes(self) -> int:
        return self._held


_POOLS: dict = {}
_POOLS_LOCK = threading.Lock()


def for_device(device) -> HostArrays:
    """The process's pool for this GPU, shared by every session on it."""
    with _POOLS_LOCK:
        if device.ordinal not in _POOLS:
            _POOLS[device.ordinal] = HostArrays(device)
        return _POOLS[device.ordinal]
