"""Issue 31's fixes on the CUDA backend: batches of decode steps and swept shapes, and the models
onnxruntime's tools write, each compiled with GPU code, run on the GPU and compared with onnxruntime."""
import os

import pytest

from grapec.tools.check import check_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "models", "tiny")
ORT = os.path.join(ROOT, "models", "ort")
pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("name", ["gpt2", "bert"])
@pytest.mark.parametrize("batch,seq", [(1, 1), (5, 1), (8, 1), (17, 1), (33, 1), (64, 1), (3, 2), (12, 3), (7, 7),
                                       (2, 64), (31, 17)])
def test_swept_shapes_on_the_gpu(name, batch, seq):
    results, _ = check_model(os.path.join(TINY, f"{name}.onnx"), dims={"batch": batch, "seq": seq}, backend="cuda",
                             seed=batch + seq)
    assert all(r.ok for r in results), [(r.name, r.rel, r.note) for r in results]


@pytest.mark.parametrize("name", ["bert_optimized", "gpt2_optimized", "bert_fused"])
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_transformer_optimizer_output_on_the_gpu(name, precision):
    results, _ = check_model(os.path.join(ORT, f"{name}.onnx"), dims={"batch": 4, "seq": 16}, backend="cuda",
                             precision=precision)
    assert all(r.ok for r in results), [(r.name, r.rel, r.note) for r in results]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("case", ["mask_2d", "past_causal"])
def test_contrib_attention_on_the_gpu(case, precision, tmp_path):
    import onnx
    from test_contrib_ops import _attention_model
    kw = {"mask_2d": {"mask_shape": [2, 5]}, "past_causal": {"past": True, "unidirectional": 1}}[case]
    path = str(tmp_path / "attention.onnx")
    onnx.save(_attention_model(**kw), path)
    import numpy as np
    inputs = {"mask": np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], np.int32)} if case == "mask_2d" else {}
    results, _ = check_model(path, shapes={"x": (2, 5, 32), **({"past": (2, 2, 4, 3, 8)} if kw.get("past") else {})},
                             backend="cuda", inputs=inputs, precision=precision)
    assert all(r.ok for r in results), [(r.name, r.rel, r.note) for r in results]
