"""What the CUDA backend's shared execs plan for a range bundle, checked without a GPU: the launch
structures (runtime/cuda/shared_exec.py), the sized steps and their size records, the per-size
constants (runtime/cuda/size_record.py), and the sized twins and loader in the bundle's CUDA source.
The GPU runs them in tests/test_gpu_dynamic.py."""
import os

import numpy as np
import pytest

from grapec.bundle.format import Bundle
from grapec.compiler import compile_model
from grapec.plan import KernelStep
from grapec.runtime.cuda import shared_exec
from grapec.runtime.cuda.size_record import SizeRecords

pytest.importorskip("cuda.bindings.nvrtc", reason="needs NVRTC (pip install cuda-bindings nvidia-cuda-nvrtc)")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPT2 = os.path.join(ROOT, "models", "tiny", "gpt2.onnx")


class _Device:
    """Allocations as distinct fake addresses; uploads kept, to read back."""

    def __init__(self):
        self.next, self.data = 1 << 32, {}

    def alloc(self, nbytes, what):
        ptr, self.next = self.next, self.next + ((nbytes + 255) // 256 + 1) * 256
        return ptr

    def upload(self, dst, src, nbytes):
        import ctypes
        self.data[dst] = ctypes.string_at(src, nbytes)


class _Runner:
    """What SizeRecords reads of a CUDA runner, from the bundle alone."""

    def __init__(self, bundle):
        self.bundle, self.dev, self.weights = bundle, _Device(), 1 << 40
        cuda = bundle.manifest["cuda"]
        self.launches, self.scalars = cuda["launch"], cuda["scalars"]

    def graph_shape(self, bucket):
        return shared_exec.graph_shape(self.bundle.plans[bucket])

    def structure_of(self, bucket):
        return shared_exec.launch_structure(self.bundle, bucket, self.graph_shape(bucket))

    def function(self, name):
        return name


@pytest.fixture(scope="module")
def bundle():
    b = compile_model(GPT2, dims={"batch": 1}, dynamic={"seq": (1, 24)}, precision="fp16", targets=["sm_90"])
    return Bundle.from_bytes(b.to_bytes())   # as loaded: plans stored as templates


def test_sized_steps_take_every_number_from_their_size_record(bundle):
    runner = _Runner(bundle)
    records = SizeRecords(runner)
    names, source = bundle.manifest["cuda"]["kernels"], bundle.extra_sections["cuda.source"].decode()
    assert "grapec_load_sizes" in source and bundle.manifest["cuda"]["sized"]
    by_structure: dict = {}
    for b in range(len(bundle.plans)):
        by_structure.setdefault(runner.structure_of(b), []).append(b)
    shared = [members for members in by_structure.values() if len(members) > 1]
    # short lengths differ in their small-GEMM kernels (one structure each); longer ones share
    assert max(len(m) for m in shared) >= 4, [len(m) for m in by_structure.values()]
    sized_steps = 0
    for members in shared:
        g = records.group(members[0])
        plans = {b: bundle.plans[b] for b in members}
        assert g.slots, members
        table = np.frombuffer(runner.dev.data[g.table], np.int64).reshape(len(members), -1)
        for p, (offset, n, grid) in g.slots.items():
            steps = [plans[b].steps[p] for b in members]
            assert all(isinstance(st, KernelStep) for st in steps)
            name = names[steps[0].kernel]
            assert {names[st.kernel] for st in steps} == {name} and f"{name}_sized(" in source
            grids = [runner.launches[st.kernel][1] for st in steps]
            assert grid == max(grids)
            for b, st, own_grid in zip(members, steps, grids):   # the member's own numbers, then its grid
                row = table[g.rows[b], offset:offset + n]
                values = [v if t == "i64" else np.float64(v).view(np.int64) for t, v in runner.scalars[st.kernel]]
                assert list(row) == values + [own_grid], (b, p)
            sized_steps += 1
        for name, nbytes in g.constants.items():   # per-size constants: weights at another offset per size
            bufs = [next(x for x in plans[b].buffers if x.name == name) for b in members]
            assert all(x.space == "weight" for x in bufs) and len({x.offset for x in bufs}) == len(members)
            assert nbytes == max(x.nbytes for x in bufs)
        # the loader's copy list of each member: its record row, then its constants from the weights
        copies = np.frombuffer(runner.dev.data[g.copies], np.int64).reshape(len(members), -1, 3)
        for b in members:
            first = copies[g.rows[b], 0]
            assert first[0] == g.record and first[1] == g.table + g.rows[b] * first[2]
            assert g.count[b] == 1 + len(g.places[b])
    # `grapec inspect` tells the same: one exec per launch structure, and the sized steps
    from grapec.tools.show import shared_execs
    assert shared_execs(bundle) == {"execs": len(by_structure), "sized_steps": sized_steps}
    # most kernel steps of a shared structure are sized (the rest keep one launch, or differ in kernel)
    kernel_steps = sum(isinstance(st, KernelStep) for members in shared for st in bundle.plans[members[0]].steps)
    assert sized_steps >= kernel_steps // 3, (sized_steps, kernel_steps)


def test_a_size_record_is_off_where_asked(bundle, monkeypatch):
    monkeypatch.setenv("GRAPEC_SIZE_RECORDS", "0")
    records = SizeRecords(_Runner(bundle))
    assert not any(records.group(b).slots for b in range(len(bundle.plans)))
