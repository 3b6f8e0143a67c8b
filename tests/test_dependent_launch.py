"""Programmatic dependent launch: each generated kernel waits for its predecessor in
G_AWAIT_PREDECESSOR (codegen/cuda.py) before it touches anything a kernel wrote, so the CUDA runtime
may join it to the kernel before by a programmatic edge (runtime/cuda/graph.py) and let it start early."""
import os
import re

import numpy as np
import pytest

import grapec
from grapec.codegen.module import build_module
from grapec.bundle.inputs import bundle_inputs
from grapec.plan import KernelStep
from grapec.ir.attention import AttentionKernel
from grapec.ir.kinds import kernel_from_json
from grapec.ir.small_gemm import SmallGemmKernel
from grapec.runtime.cuda import model as cuda_model
from helpers import needs_nvrtc, ort_run, rel_err
from test_small_gemm import profile_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPT2 = os.path.join(ROOT, "models", "tiny", "gpt2.onnx")
WAIT = "G_AWAIT_PREDECESSOR();"


def gpt2_bundle(tmp_path, targets=()):
    """Tiny GPT-2 in fp16 with every kind of kernel: plain, fused attention, small GEMM."""
    return grapec.compile(GPT2, dims={"batch": 1, "seq": 8}, precision="fp16", targets=list(targets),
                          device_profile=profile_file(tmp_path))


def test_every_kernel_waits_before_it_reads_an_activation_or_writes(tmp_path):
    b = gpt2_bundle(tmp_path)
    kernels = [kernel_from_json(k) for k in b.kernels]
    kinds = {type(k) for k in kernels}
    assert AttentionKernel in kinds and SmallGemmKernel in kinds and len(kinds) == 3, kinds
    module = build_module(kernels)
    for i, k in enumerate(kernels):
        body = next(text for text in module.bodies if f" {module.names[i]}(" in text)
        entry = body[body.index('extern "C" __global__'):]
        assert entry.count(WAIT) == 1, entry[:400]
        before = entry[entry.index(") {\n") + 4:entry.index(WAIT)]
        # before the wait a kernel may read its weight and nothing else: no other input, no output
        allowed = {f"in{k.a_slots}"} if isinstance(k, SmallGemmKernel) else set()
        touched = set(re.findall(r"\b(?:in\d+|out)\b", before))
        assert touched <= allowed, (type(k).__name__, touched, before)
        if isinstance(k, SmallGemmKernel):   # the weight loads are what overlaps the kernel before
            assert f"in{k.a_slots} +" in before


def test_the_bundle_says_its_kernels_wait_and_only_sm90_code_does(tmp_path):
    needs_nvrtc()
    b = gpt2_bundle(tmp_path, ["sm_80", "sm_90"])
    assert b.manifest["cuda"]["dependent_launch"] is True
    assert b"griddepcontrol" not in b.extra_sections["ptx.compute_80"]   # the wait is Hopper's; below it, nothing
    b90 = gpt2_bundle(tmp_path, ["sm_90"])
    ptx = b90.extra_sections["ptx.compute_90"].decode()
    assert ptx.count("griddepcontrol.wait") >= len(set(b90.manifest["cuda"]["kernels"]))
    assert ptx.count("griddepcontrol.launch_dependents") == ptx.count("griddepcontrol.wait")


class _Bundle:
    def __init__(self, flag):
        self.manifest = {"cuda": {"dependent_launch": True} if flag else {}}


@pytest.mark.parametrize("flag,code,cc,driver,env,expected", [
    (True, "cubin sm_90", (9, 0), 12080, None, True),
    (True, "ptx compute_90", (10, 0), 12080, None, True),
    (False, "cubin sm_90", (9, 0), 12080, None, False),   # an older bundle: its kernels do not wait
    (True, "ptx compute_80", (9, 0), 12080, None, False),  # PTX for sm_80: the wait compiled to nothing
    (True, "cubin sm_86", (8, 6), 12080, None, False),
    (True, "cubin sm_90", (9, 0), 12020, None, False),     # the driver has no programmatic edges
    (True, "cubin sm_90", (9, 0), 12080, "0", False),      # turned off by the user
])
def test_dependent_launch_only_where_the_code_waits(flag, code, cc, driver, env, expected, monkeypatch):
    monkeypatch.setattr(cuda_model, "call", lambda name, *a: driver if name == "cuDriverGetVersion" else None)
    if env is None:
        monkeypatch.delenv("GRAPEC_DEPENDENT_LAUNCH", raising=False)
    else:
        monkeypatch.setenv("GRAPEC_DEPENDENT_LAUNCH", env)
    assert cuda_model.uses_dependent_launch(_Bundle(flag), code, cc) is expected


@pytest.mark.gpu
def test_kernels_that_start_early_still_see_their_inputs(tmp_path, monkeypatch):
    """Every kernel after a kernel gets a programmatic edge; with fresh inputs on every replay the
    answers match onnxruntime and the same bundle run without the edges. A kernel that read its
    input before the wait would read the previous replay's values."""
    b = gpt2_bundle(tmp_path, ["sm_90"])
    monkeypatch.setenv("GRAPEC_DEPENDENT_LAUNCH", "1")
    early = grapec.load(b, backend="cuda")
    monkeypatch.setenv("GRAPEC_DEPENDENT_LAUNCH", "0")
    plain = grapec.load(b, backend="cuda")
    import onnx
    m = onnx.load(GPT2)
    for seed in range(20):
        feeds = bundle_inputs(b.manifest, 0, seed)
        ref = ort_run(m, feeds)
        got = {k: v.astype(np.float32) for k, v in early.run(feeds).items()}
        base = {k: v.astype(np.float32) for k, v in plain.run(feeds).items()}
        for out, r in ref.items():
            assert rel_err(got[out], r) < 1e-2, (out, rel_err(got[out], r))
            np.testing.assert_allclose(got[out], base[out], rtol=1e-3, atol=1e-3)
    steps = b.plans[0].steps
    after_kernel = sum(isinstance(a, KernelStep) and isinstance(st, KernelStep) for a, st in zip(steps, steps[1:]))
    edges = early._runner.edge_counts()
    assert edges["programmatic"] == after_kernel, (edges, after_kernel)   # generated kernels only
    assert after_kernel >= 10
    assert plain._runner.edge_counts()["programmatic"] == 0
