"""The committed tiny zoo models (models/tiny/*.onnx) load and run in onnxruntime, match the torch
modules they were exported from, and control_flow's Loop stops early for some inputs only.

Needs onnxruntime; the torch comparison also needs torch (and transformers for the transformer
models) and is skipped without them.  Rebuild the files with `python models/build.py --size tiny`.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

ort = pytest.importorskip("onnxruntime")

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "models" / "tiny"
MAX_BYTES = 2 * 1024 * 1024
RTOL = 1e-4  # max |onnx - torch| / max |torch|


def _load_zoo():
    spec = importlib.util.spec_from_file_location("grapec_model_zoo", ROOT / "models" / "zoo.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses need the module registered
    spec.loader.exec_module(mod)
    return mod


zoo = _load_zoo()
NAMES = list(zoo.MODELS)
TORCH_NAMES = list(zoo.TORCH_MODELS)
TRANSFORMERS = {"gpt2", "bert", "wav2vec2", "gpt2_generate"}

_sessions: dict[str, "ort.InferenceSession"] = {}
_torch_models: dict[str, object] = {}


def _path(name: str) -> Path:
    return TINY / f"{name}.onnx"


def _session(name: str):
    if name not in _sessions:
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        _sessions[name] = ort.InferenceSession(str(_path(name)), opts, providers=["CPUExecutionProvider"])
    return _sessions[name]


def _other_dims(sp) -> dict[str, int]:
    """A second set of dynamic-dim values, different from the example ones."""
    other = {}
    for k, v in sp.dynamic_dims.items():
        lo, hi = sp.dim_ranges[k]
        other[k] = 3 if k == "batch" else min(hi, v + 5)
    return other


def _metadata(name: str) -> dict[str, str]:
    return {p.key: p.value for p in onnx.load(str(_path(name)), load_external_data=False).metadata_props}


def test_every_zoo_model_is_committed():
    committed = sorted(p.stem for p in TINY.glob("*.onnx"))
    assert committed == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_tiny_file_is_small_valid_opset17(name):
    path = _path(name)
    assert path.stat().st_size <= MAX_BYTES, f"{path} is {path.stat().st_size} bytes (> 2 MB)"
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    assert not model.functions
    sp = zoo.spec(name, "tiny")
    assert [i.name for i in model.graph.input] == list(sp.input_dims)
    assert [o.name for o in model.graph.output] == list(sp.output_names)
    for inp in model.graph.input:
        dims = [d.dim_param or d.dim_value for d in inp.type.tensor_type.shape.dim]
        assert tuple(dims) == tuple(sp.input_dims[inp.name])
        np_dtype = onnx.helper.tensor_dtype_to_np_dtype(inp.type.tensor_type.elem_type)
        assert np.dtype(np_dtype) == np.dtype(sp.input_dtypes[inp.name])
    meta = _metadata(name)
    assert meta["grapec.zoo.name"] == name and meta["grapec.zoo.size"] == "tiny"


@pytest.mark.parametrize("name", NAMES)
def test_onnxruntime_runs_finite(name):
    sp = zoo.spec(name, "tiny")
    sess = _session(name)
    for seed, dims in ((11, {}), (12, _other_dims(sp))):
        feeds = sp.random_inputs(seed, **dims)
        for k, v in feeds.items():
            assert v.dtype == np.dtype(sp.input_dtypes[k])
            assert np.any(v != 0), f"{k} is all zeros"
        outs = sess.run(None, feeds)
        assert len(outs) == len(sp.output_names)
        for out_name, out in zip(sp.output_names, outs):
            assert np.all(np.isfinite(out)), f"{name}.{out_name} has non-finite values for dims {dims}"
        if "batch" in sp.dynamic_dims:
            batch = next(iter(feeds.values())).shape[0]
            assert all(o.shape[0] == batch for o in outs)


@pytest.mark.parametrize("name", TORCH_NAMES)
def test_onnx_matches_torch(name):
    pytest.importorskip("torch", reason="torch not installed: cannot compare with the torch module")
    if name in TRANSFORMERS:
        pytest.importorskip("transformers", reason="transformers not installed")
    if name not in _torch_models:
        _torch_models[name] = zoo.get(name, "tiny")
    zm = _torch_models[name]
    meta = _metadata(name)
    if zm.weights_digest() != meta["grapec.zoo.weights_sha256"]:
        pytest.skip(f"this torch/transformers build does not reproduce the seeded weights of {name}.onnx "
                    f"(built with torch {meta.get('grapec.zoo.torch')}, transformers "
                    f"{meta.get('grapec.zoo.transformers')}); rebuild with models/build.py to compare")
    sess = _session(name)
    for seed, dims in ((21, {}), (22, _other_dims(zm.spec))):
        feeds = zm.random_inputs(seed, **dims)
        got = sess.run(None, feeds)
        want = zm.run_torch(feeds)
        assert len(got) == len(want)
        for out_name, g, w in zip(zm.output_names, got, want):
            assert g.shape == w.shape, (out_name, g.shape, w.shape)
            rel = float(np.max(np.abs(g - w)) / max(float(np.max(np.abs(w))), 1e-30))
            assert rel <= RTOL, f"{name}.{out_name}: rel error {rel:.2e} > {RTOL} (dims {dims})"


# ---------------------------------------------------------------------------------------------
# control_flow
# ---------------------------------------------------------------------------------------------


def _cf():
    if "control_flow" not in _torch_models:
        _torch_models["control_flow"] = zoo.get("control_flow", "tiny")
    return _torch_models["control_flow"]


def test_control_flow_stops_early_for_some_inputs_and_runs_to_max_len_for_others():
    zm = _cf()
    cfg = zm.config
    M, eos = cfg["max_len"], cfg["eos"]
    sess = _session("control_flow")
    counts = []
    for seed in range(40):
        feeds = zm.random_inputs(seed)
        tokens, count, h_final = sess.run(None, feeds)
        want_tokens, want_count, want_h = zm.reference(feeds)
        n = int(count)
        assert count.shape == () and tokens.shape == (M,) and h_final.shape == (cfg["hidden"],)
        np.testing.assert_array_equal(tokens, want_tokens)
        assert n == int(want_count)
        np.testing.assert_allclose(h_final, want_h, rtol=1e-5, atol=1e-6)
        assert 1 <= n <= M
        assert np.all(tokens[n:] == -1) and np.all((tokens[:n] >= 0) & (tokens[:n] < cfg["vocab"]))
        if n < M:  # stopped early: the last generated token is the end token, and only that one
            assert tokens[n - 1] == eos
        assert np.all(tokens[: n - 1] != eos)
        counts.append(n)
    assert any(n < M for n in counts), f"no input stopped early: {counts}"
    assert any(n == M for n in counts), f"no input ran to max_len {M}: {counts}"
    assert len(set(counts)) >= 4, f"too few distinct trip counts: {counts}"


def test_control_flow_zero_iterations_when_starting_at_eos():
    zm = _cf()
    feeds = zm.random_inputs(0)
    feeds["start_token"] = np.array([zm.config["eos"]], dtype=np.int64)
    tokens, count, h_final = _session("control_flow").run(None, feeds)
    assert int(count) == 0
    assert np.all(tokens == -1)
    np.testing.assert_array_equal(h_final, feeds["h0"])


def test_control_flow_structure():
    model = onnx.load(str(_path("control_flow")))
    loops = [n for n in model.graph.node if n.op_type == "Loop"]
    assert len(loops) == 1
    body = onnx.helper.get_attribute_value(loops[0].attribute[0])
    assert any(n.op_type == "If" for n in body.node)
    ops = zoo.op_types(model)
    for op in ("Loop", "If", "Gather", "MatMul", "Tanh", "ArgMax", "Where"):
        assert op in ops


def test_control_flow_file_is_up_to_date(tmp_path):
    """control_flow is built from numpy alone: a fresh export must equal the committed file."""
    path = _cf().export(tmp_path / "control_flow.onnx")
    assert Path(path).read_bytes() == _path("control_flow").read_bytes()


def test_external_data_export(tmp_path, monkeypatch):
    """Above the threshold, export writes weights to <file>.data and the model still runs."""
    monkeypatch.setattr(sys.modules["zoo_core"], "EXTERNAL_DATA_THRESHOLD", 1024)   # read at export time
    zm = _cf()
    path = Path(zm.export(tmp_path / "cf.onnx"))
    assert (tmp_path / "cf.onnx.data").exists()
    assert path.stat().st_size < _path("control_flow").stat().st_size
    feeds = zm.random_inputs(5)
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    want = _session("control_flow").run(None, feeds)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
