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
        return shared_exec.exec_key(self.bundle, bucket, self.graph_shape(bucket))

    def function(self, name):
        return name

    def members_of(self, key):
        return shared_exec.members_of(self, key)


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
    told = shared_execs(bundle)
    assert (told["execs"], told["sized_steps"]) == (len(by_structure), sized_steps)
    # most kernel steps of a shared structure are sized (the rest keep one launch, or differ in kernel)
    kernel_steps = sum(isinstance(st, KernelStep) for members in shared for st in bundle.plans[members[0]].steps)
    assert sized_steps >= kernel_steps // 3, (sized_steps, kernel_steps)


def test_a_size_record_is_off_where_asked(bundle, monkeypatch):
    monkeypatch.setenv("GRAPEC_SIZE_RECORDS", "0")
    records = SizeRecords(_Runner(bundle))
    assert not any(records.group(b).slots for b in range(len(bundle.plans)))


def test_inspect_tells_which_nodes_a_switch_sets(bundle, monkeypatch):
    """switch_sets works out from the bundle alone what the runner sets at a switch: nothing but the
    loader where every step is sized or a GEMM at the structure's widest rows. Without size records
    the kernels' launches differ by size, and without widest rows the GEMMs' do, and it says so."""
    from grapec.plan import LibraryStep
    from grapec.tools.show import switch_report
    records = SizeRecords(_Runner(bundle))
    default = dict((tuple(m), set(p)) for m, p in shared_exec.switch_sets(bundle))
    assert default
    for members, positions in default.items():
        assert not positions & set(records.group(members[0]).slots), members   # a sized step never is set
    monkeypatch.setenv("GRAPEC_SIZE_RECORDS", "0")
    unsized = dict((tuple(m), set(p)) for m, p in shared_exec.switch_sets(bundle))
    monkeypatch.setenv("GRAPEC_SIZE_RECORDS", "1")
    monkeypatch.setenv("GRAPEC_WIDEST_GEMMS", "0")
    narrow = dict((tuple(m), set(p)) for m, p in shared_exec.switch_sets(bundle))
    assert unsized.keys() == default.keys() == narrow.keys()
    for members, positions in default.items():
        assert positions <= unsized[members] and positions <= narrow[members]
        plan = bundle.plans[members[0]]
        gemms = {p for p in narrow[members] - positions if isinstance(plan.steps[p], LibraryStep)}
        assert all(plan.steps[p].attrs.get("op") == "matmul" for p in gemms)
    assert sum(map(len, unsized.values())) > sum(map(len, default.values()))
    assert any(narrow[m] - default[m] for m in default)   # some GEMM differs in rows only
    report = switch_report(bundle)   # what inspect prints: the structures that set more than the loader
    assert [(tuple(r["buckets"]), r["steps"]) for r in report] == [(m, sorted(p)) for m, p in narrow.items() if p]


def test_inspect_prints_the_nodes_a_switch_sets(bundle, tmp_path):
    import subprocess
    import sys
    from grapec.tools.show import switch_report
    path = tmp_path / "range.grape"
    bundle.write(str(path))
    out = subprocess.run([sys.executable, "-m", "grapec.tools.cli", "inspect", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stdout.splitlines() if "node(s) besides the loader" in ln]
    report = switch_report(bundle)
    assert len(lines) == len(report) >= 1
    for line, r in zip(lines, report):
        assert f"between its {len(r['buckets'])} sizes from bucket {r['buckets'][0]} sets {len(r['steps'])} node(s)" in line

