"""Page-locked output arrays (runtime/cuda/host_arrays.py): a block is lent to one array at a time and
comes back only when every view over it is gone; blocks are reused across nearby sizes; the pool
stays within its bytes. The pool's bookkeeping runs on the CPU over ctypes memory; the GPU test runs
a session whose outputs come through it."""
import ctypes
import gc

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from grapec.runtime.cuda import host_arrays
from grapec.runtime.devices import gpu_count


class _CtypesPool(host_arrays.HostArrays):
    """The pool over ordinary memory: what it lends, reuses and frees is the same."""

    def __init__(self, capacity=host_arrays.POOL_BYTES):
        super().__init__(device=None)
        self.capacity = capacity
        self.live = {}

    def _allocate(self, nbytes):
        buf = ctypes.create_string_buffer(nbytes)
        self.live[ctypes.addressof(buf)] = buf
        return ctypes.addressof(buf)

    def _release(self, ptr):
        del self.live[ptr]


MiB = 1 << 20


def test_a_block_comes_back_only_when_every_view_over_it_is_gone():
    pool = _CtypesPool()
    a = pool.empty((4, MiB // 4), np.float32)
    assert isinstance(a.base, host_arrays._Lease) and a.flags.writeable
    a[...] = 7.0
    view = a[2:]
    del a
    gc.collect()
    b = pool.empty((4, MiB // 4), np.float32)   # the view still holds the first block: a new one
    b[...] = -1.0
    assert pool.allocated == 2 and np.all(view == 7.0)
    del view
    gc.collect()
    c = pool.empty((4, MiB // 4), np.float32)   # now the first block is idle again
    assert pool.allocated == 2
    c[...] = 3.0
    assert np.all(b == -1.0)


def test_small_outputs_stay_plain_numpy_arrays():
    pool = _CtypesPool()
    small = pool.empty((host_arrays.PINNED_FROM // 8 - 1,), np.float64)
    assert small.base is None and pool.allocated == 0


def test_blocks_serve_nearby_sizes_and_each_array_reads_its_own_values():
    pool = _CtypesPool()
    rng = np.random.default_rng(0)
    held = []
    for _ in range(200):
        n = int(rng.integers(MiB // 4, MiB))   # float32: 1..4 MiB
        a = pool.empty((n,), np.float32)
        value = float(rng.integers(1, 1000))
        a[...] = value
        held.append((a, value))
        if len(held) > 3:   # a caller keeping its last few outputs
            held.pop(0)
        for arr, v in held:
            assert arr[0] == v and arr[-1] == v
    assert pool.allocated <= 12, pool.allocated   # within REUSE_WITHIN of each other: a few blocks serve all
    assert pool.held_bytes <= 12 * host_arrays._block_size(4 * MiB)


def test_the_pool_stays_within_its_bytes():
    pool = _CtypesPool(capacity=8 * MiB)
    lent = [pool.empty((MiB,), np.float32) for _ in range(3)]   # 4 MiB each: the third does not fit
    assert pool.held_bytes <= 8 * MiB
    assert pool.pageable == 1 and lent[2].base is None and lent[0].base is not None
    del lent
    gc.collect()
    small = [pool.empty((MiB // 2,), np.float32) for _ in range(2)]   # idle 4 MiB blocks serve 2 MiB arrays
    assert pool.allocated == 2 and pool.pageable == 1
    big = pool.empty((3 * MiB // 2,), np.float32)   # 6 MiB: too large for a block, and both are lent
    assert big.base is None and pool.pageable == 2
    del small
    gc.collect()
    big = pool.empty((3 * MiB // 2,), np.float32)   # idle blocks freed, least recently used first, to fit it
    assert big.base is not None and pool.held_bytes <= 8 * MiB and len(pool.live) == 1


def test_block_sizes_are_the_next_power_of_two():
    rng = np.random.default_rng(1)
    for n in list(rng.integers(host_arrays.PINNED_FROM, 1 << 31, 500)) + [MiB, 2 * MiB, 2 * MiB + 1]:
        size = host_arrays._block_size(int(n))
        assert n <= size < 2 * n and size & (size - 1) == 0


def _scale_model():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 1024])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 1024])
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    one = helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])
    nodes = [helper.make_node("Mul", ["x", "two"], ["t"]), helper.make_node("Add", ["t", "one"], ["y"])]
    g = helper.make_graph(nodes, "scale", [x], [y], initializer=[two, one])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_count(), reason="needs an NVIDIA GPU")
def test_a_sessions_large_outputs_are_page_locked_kept_and_reused_on_gpu():
    import grapec
    from grapec.compiler import compile_model
    from grapec.runtime.cuda.driver import call
    from cuda.bindings import driver
    sess = grapec.load(compile_model(_scale_model(), dynamic={"n": (1, 512)}), backend="cuda")
    rng = np.random.default_rng(2)
    first_x = rng.standard_normal((512, 1024)).astype(np.float32)
    first = sess.run({"x": first_x})["y"]   # 2 MiB
    is_locked = call("cuPointerGetAttribute", driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                     first.ctypes.data)
    assert int(is_locked) == int(driver.CUmemorytype.CU_MEMORYTYPE_HOST)
    pool = sess._runner.host_arrays
    allocated = pool.allocated
    for _ in range(30):   # the first output held throughout: no later run writes over it
        n = int(rng.integers(256, 513))
        x = rng.standard_normal((n, 1024)).astype(np.float32)
        y = sess.run({"x": x})["y"]
        np.testing.assert_array_equal(y, x * 2 + 1)
    np.testing.assert_array_equal(first, first_x * 2 + 1)
    assert pool.allocated - allocated <= 3, pool.allocated - allocated   # blocks came back and were reused
