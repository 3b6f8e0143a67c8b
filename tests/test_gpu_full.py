"""GPU tests at full size: GPT-2, BERT-base and ResNet-50 (models/full, built by models/build.py
when missing -- a minute) on the CUDA backend against onnxruntime (CPU, fp32), in fp32 and fp16;
and the tiny zoo in fp16. Run on the GPU machine with `make gpu-test`."""
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest

from grapec.compiler.accuracy import compare
from grapec.tools.check import check_model, reference_outputs
from grapec.bundle.inputs import random_inputs

pytestmark = pytest.mark.gpu
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from test_models import ZOO_DIMS  # noqa: E402

FULL = {"gpt2": {"batch": 1, "seq": 128}, "bert": {"batch": 1, "seq": 128}, "resnet50": {"batch": 1}}
TOL = {"fp32": 1e-4, "fp16": 1e-2}


def full_model(name):
    path = os.path.join(ROOT, "models", "full", f"{name}.onnx")
    if not os.path.exists(path):
        subprocess.run([sys.executable, os.path.join(ROOT, "models", "build.py"), "--size", "full",
                        "--out", os.path.dirname(path), name], check=True, capture_output=True)
    return path


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("name", sorted(FULL))
def test_full_size_model_on_gpu_matches_onnxruntime(name, precision):
    results, _ = check_model(full_model(name), dims=FULL[name], backend="cuda", rtol=TOL[precision], seed=2,
                             precision=precision)
    for r in results:
        print(f"{name} {precision} {r.name}: rel {r.rel:.3g} max-abs {r.max_abs:.3g}")
        assert r.ok, f"{name}/{r.name} ({precision}): rel {r.rel:.3g} max-abs {r.max_abs:.3g} {r.note}"


TINY_CNNS = ("resnet50", "googlenet", "inception_v3")


@pytest.mark.parametrize("name", sorted(n for n in ZOO_DIMS if n not in TINY_CNNS))
def test_tiny_zoo_in_fp16_on_gpu(name):
    results, _ = check_model(os.path.join(ROOT, "models", "tiny", f"{name}.onnx"), dims=ZOO_DIMS[name],
                             backend="cuda", rtol=1e-2, seed=11, precision="fp16")
    for r in results:
        assert r.ok, f"{name}/{r.name}: rel {r.rel:.3g} {r.note}"


@pytest.mark.parametrize("name", TINY_CNNS)
def test_tiny_cnns_in_fp16_on_gpu_match_as_well_as_pytorch_fp16(name):
    """The tiny random CNNs are ill-conditioned: rounding only their weights and input to fp16 and
    computing in fp32 moves the logits 1.9% (ResNet) and 2.4% (GoogLeNet), so no fp16 engine is
    within 1e-2 of the fp32 answer (the full-size ResNet-50 is, in the test above). So `--precision
    fp16` refuses them at its default tolerance, naming where the error grows. Accepted with
    --precision-tolerance 6.25e-2 (compile accepts within 0.8 of it on each of 4 draws: the 5e-2 bar
    this test had with one draw and no margin; tiny Inception-v3 is 4.6% off on one draw), the
    yardstick is PyTorch's own fp16 run of the same module: grapec's fp16 error against onnxruntime
    fp32 must be within 1e-2 or no more than 1.25x PyTorch's."""
    import torch
    from grapec.tools.bench import zoo_module
    from grapec.compiler.mixed_precision import PrecisionError
    path = os.path.join(ROOT, "models", "tiny", f"{name}.onnx")
    with pytest.raises(PrecisionError, match="grows most at"):
        check_model(path, dims=ZOO_DIMS[name], backend="cuda", rtol=1.0, seed=11, precision="fp16")
    results, _ = check_model(path, dims=ZOO_DIMS[name], backend="cuda", rtol=1.0, seed=11, precision="fp16",
                             precision_tolerance=6.25e-2)
    import grapec
    b = grapec.compile(path, dims=ZOO_DIMS[name])
    infos = b.manifest["inputs"]
    feeds = random_inputs({i["name"]: tuple(i["shapes"][0]) for i in infos}, {i["name"]: i["dtype"] for i in infos},
                          {}, 11)
    ref = reference_outputs(path, feeds)
    module = zoo_module(name, "tiny").cuda().eval().half()
    with torch.no_grad():
        out = module(*[torch.from_numpy(v).cuda().half() for v in feeds.values()])
    out = out[0] if isinstance(out, (tuple, list)) else getattr(out, "logits", out)
    torch_err = compare("logits", out.float().cpu().numpy(), next(iter(ref.values())), 1.0, 1.0).rel
    for r in results:
        print(f"{name} fp16: grapec rel {r.rel:.3g}, PyTorch fp16 rel {torch_err:.3g}")
        assert r.rel <= max(1e-2, 1.25 * torch_err), f"{name}: grapec {r.rel:.3g} vs PyTorch fp16 {torch_err:.3g}"
