"""External data (frontend/external_data.py): weights mapped from their files, checked before use."""
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import grapec
from grapec.errors import ModelError
from grapec.frontend.onnx_import import import_model, load_model
from helpers import init, model, tinfo


def _save(tmp_path, m, name="m.onnx", location="m.data"):
    path = tmp_path / name
    onnx.save(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=location,
              size_threshold=0)
    return path


def _mlp(rng):
    w1 = rng.standard_normal((64, 48)).astype(np.float32)
    w2 = rng.standard_normal((48, 16)).astype(np.float16)
    idx = np.array([3, 1, 0], np.int64)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Cast", ["h"], ["hh"], to=TensorProto.FLOAT16),
             helper.make_node("MatMul", ["hh", "w2"], ["y16"]),
             helper.make_node("Gather", ["y16", "idx"], ["g"], axis=1),
             helper.make_node("Cast", ["g"], ["y"], to=TensorProto.FLOAT)]
    return model(nodes, [tinfo("x", shape=[2, 64])], [tinfo("y")], [init("w1", w1), init("w2", w2), init("idx", idx)])


def test_external_weights_are_mapped_read_only_and_compute_as_onnxruntime(tmp_path):
    rng = np.random.default_rng(11)
    path = _save(tmp_path, _mlp(rng))
    g = import_model(load_model(str(path)))
    for name in ("w1", "w2", "idx"):
        arr = g.values[name].const
        assert not arr.flags.writeable, name   # a view of the file's bytes, not a copy
        base = arr
        while base.base is not None and not isinstance(base, np.memmap):
            base = base.base
        assert isinstance(base, np.memmap), name
    x = rng.standard_normal((2, 64)).astype(np.float32)
    got = grapec.load(grapec.compile(str(path), targets=[]), backend="cpu").run({"x": x})["y"]
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-3
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)   # fp16 products of 48 terms


def test_bfloat16_external_data_is_read_by_onnx_conversion(tmp_path):
    w = np.random.default_rng(2).standard_normal((8, 4)).astype(ml_dtypes.bfloat16)
    t = helper.make_tensor("w", TensorProto.BFLOAT16, w.shape, w.view(np.uint16).tobytes(), raw=True)
    m = model([helper.make_node("Cast", ["w"], ["y"], to=TensorProto.FLOAT)], [], [tinfo("y")], [t])
    g = import_model(load_model(str(_save(tmp_path, m))))
    np.testing.assert_array_equal(np.asarray(g.values["w"].const, np.float32), w.astype(np.float32))


def test_a_location_outside_the_models_folder_is_refused(tmp_path):
    inner = tmp_path / "inner"
    inner.mkdir()
    m = _mlp(np.random.default_rng(1))
    path = _save(tmp_path, m, "m.onnx", "m.data")
    moved = inner / "m.onnx"
    os.rename(path, moved)   # its data file now sits in the folder above
    bad = onnx.load(str(moved), load_external_data=False)
    for t in bad.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "../m.data"
    onnx.save(bad, str(moved))
    with pytest.raises(ModelError, match=r"tensor 'w1'.*outside the model's folder"):
        load_model(str(moved))


def test_a_missing_or_short_data_file_is_named(tmp_path):
    path = _save(tmp_path, _mlp(np.random.default_rng(1)))
    data = tmp_path / "m.data"
    data.write_bytes(data.read_bytes()[:100])
    with pytest.raises(ModelError, match=r"tensor '\w+'.*past the end of .*m\.data"):
        load_model(str(path))
    data.unlink()
    with pytest.raises(ModelError, match=r"external data file missing: .*m\.data \(tensor 'w1'\)"):
        load_model(str(path))
    r = subprocess.run([sys.executable, "-m", "grapec.tools.cli", "compile", str(path), "-o", str(tmp_path / "o.grape")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "external data file missing" in r.stderr and "Traceback" not in r.stderr
