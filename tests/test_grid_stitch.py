"""Global-barrier stitching (passes/grid_stitch.py, codegen/grid_stitch.py): runs of short kernels as
one cooperative kernel, a grid barrier between its stages. The plan keeps its steps, so the CPU
backend runs a stitched bundle exactly as an unstitched one; the GPU runs each run as one node."""
import json
import os
import re

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

import grapec
from grapec.bundle.format import Bundle
from grapec.tools.cli import main
from grapec.bundle.inputs import bundle_inputs
from grapec.plan import KernelStep, Plan
from helpers import needs_nvrtc, ort_run, rel_err
from test_small_gemm import profile_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPT2 = os.path.join(ROOT, "models", "tiny", "gpt2.onnx")


def gpt2(tmp_path, mode, targets=(), dims=None):
    return grapec.compile(GPT2, dims=dims or {"batch": 1, "seq": 8}, precision="fp16", targets=list(targets),
                          device_profile=profile_file(tmp_path), grid_stitch=mode)


def io_storages(plan):
    root = plan.storage_of()
    return {root[b] for _, b in plan.inputs + plan.outputs}


def test_on_stitches_runs_of_kernels_and_keeps_io_steps_out(tmp_path):
    b = gpt2(tmp_path, "on")
    plan = b.plans[0]
    assert plan.stitches, "tiny GPT-2 at seq 8 is one chain of short kernels"
    io, root, end = io_storages(plan), plan.storage_of(), 0
    for s in plan.stitches:
        assert end <= s.first < s.end and s.end - s.first >= 2 and s.block >= 256
        for st in plan.steps[s.first:s.end]:
            assert isinstance(st, KernelStep)
            assert not any(root[x] in io for x in [st.out] + st.args)
        end = s.end
    stitched = sum(s.end - s.first for s in plan.stitches)
    assert stitched >= len(plan.steps) - 4   # all but the embedding, the LM head and the output cast
    report = b.manifest["buckets"][0]["stitches"]
    assert [r["steps"] for r in report] == [[s.first, s.end] for s in plan.stitches]


def test_auto_stitches_only_where_no_programmatic_edges_join_kernels(tmp_path):
    # sm_90: a barrier (1.6 us) costs more than a node joined by a programmatic edge (0.95 us)
    assert gpt2(tmp_path, "auto").plans[0].stitches == []
    assert gpt2(tmp_path, "off").plans[0].stitches == []
    # sm_80 has no programmatic edges: the profile's 2.6 us node gap is what a barrier saves
    assert gpt2(tmp_path, "auto", targets=["sm_80"] if _nvrtc() else ()).plans[0].stitches or not _nvrtc()


def _nvrtc() -> bool:
    try:
        needs_nvrtc()
        return True
    except pytest.skip.Exception:
        return False


def test_a_stitched_bundle_round_trips_and_runs_the_same_steps_on_the_cpu(tmp_path):
    on, off = gpt2(tmp_path, "on"), gpt2(tmp_path, "off")
    path = str(tmp_path / "on.grape")
    on.write(path)
    back = Bundle.read(path)
    assert [s.to_json() for s in back.plans[0].stitches] == [s.to_json() for s in on.plans[0].stitches]
    feeds = bundle_inputs(on.manifest, 0, seed=3)
    got = grapec.load(back, backend="cpu").run(feeds)
    want = grapec.load(off, backend="cpu").run(feeds)
    for name in want:
        assert np.array_equal(got[name], want[name]), name
    assert rel_err(got["logits"], ort_run(onnx.load(GPT2), feeds)["logits"]) < 1e-2


def test_the_stitched_kernels_compile_and_the_manifest_names_them(tmp_path):
    needs_nvrtc()
    b = gpt2(tmp_path, "on", targets=["sm_90"])
    rows = b.manifest["cuda"]["stitches"]
    assert [(bk, first) for bk, first, _, _ in rows] == [(0, s.first) for s in b.plans[0].stitches]
    source = b.extra_sections["cuda.source"].decode()
    stitched = source[source.index("g_dyn_smem[]"):]
    for _, _, name, smem in rows:
        assert f" {name}(" in stitched and 0 < smem <= 227 << 10
    # stage functions: shared arrays are slices of the dynamic buffer, no pointer is __restrict__
    assert "__restrict__" not in stitched and "__shared__ f16" not in stitched and "__shared__ float" not in stitched
    assert len(re.findall(r"g_grid_arrive\(g_bar\);", stitched)) == sum(s.end - s.first - 1 for s in b.plans[0].stitches)
    assert b.extra_sections["cubin.sm_90"]


def test_plan_refuses_a_stitch_that_is_not_a_run_of_kernel_steps(tmp_path):
    d = gpt2(tmp_path, "off").plans[0].to_json()
    n = len(d["steps"])
    for bad in ([0, n + 1, 256], [3, 3, 256], [0, 2, 16]):
        with pytest.raises(ValueError, match="stitch"):
            Plan.from_json(dict(d, stitches=[bad]))
    d["steps"][1] = {"op": "scan_store", "src": 0, "dst": 1, "counter": 2}
    with pytest.raises(ValueError, match="stitch"):
        Plan.from_json(dict(d, stitches=[[0, 3, 256]]))


def test_cli_grid_stitch_reports_the_runs(tmp_path):
    out = str(tmp_path / "g.grape")
    r = CliRunner().invoke(main, ["compile", GPT2, "-o", out, "--dim", "batch=1", "--dim", "seq=8", "--precision", "fp16",
                                  "--no-gpu", "--grid-stitch", "on", "--device-profile", profile_file(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "grid stitching:" in r.output and "cooperative kernel" in r.output
    shown = CliRunner().invoke(main, ["inspect", out, "--fusion"])
    assert shown.exit_code == 0 and "global-barrier stitching" in shown.output
    as_json = json.loads(CliRunner().invoke(main, ["inspect", out, "--fusion", "--json"]).output)
    assert as_json[0]["stitches"]
    bad = CliRunner().invoke(main, ["compile", GPT2, "-o", out, "--grid-stitch", "always"])
    assert bad.exit_code == 2 and "always" in bad.output


@pytest.mark.gpu
def test_gpu_stitched_kernels_match_the_unstitched_plan(tmp_path):
    from grapec.runtime.devices import gpu_count
    if not gpu_count():
        pytest.skip("no GPU")
    for dims in ({"batch": 1, "seq": 8}, {"batch": 2, "seq": 5}):
        on, off = gpt2(tmp_path, "on", ["sm_90"], dims), gpt2(tmp_path, "off", ["sm_90"], dims)
        path = str(tmp_path / "on.grape")
        on.write(path)
        on = Bundle.read(path)
        assert on.plans[0].stitches
        ref_sess = grapec.load(off, backend="cuda")
        sessions = [grapec.load(on, backend="cuda") for _ in range(2)]   # two runners, a counter each
        for seed in range(3):
            feeds = bundle_inputs(on.manifest, 0, seed=seed)
            want = ref_sess.run(feeds)["logits"]
            firsts = [s.run(feeds)["logits"] for s in sessions]
            for s, first in zip(sessions, firsts):
                assert rel_err(first, want) < 1e-3
                for _ in range(10):   # a barrier that let a stage run early would show as a change
                    assert np.array_equal(s.run(feeds)["logits"], first)
            assert rel_err(firsts[0], ort_run(onnx.load(GPT2), feeds)["logits"]) < 1e-2
