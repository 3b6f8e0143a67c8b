"""DFT, STFT and the window functions against numpy's FFT (float64) and torch.stft, on random
signals; lengths that pad and truncate, odd and even sizes."""
import shutil

import numpy as np
import pytest
from onnx import TensorProto, helper

import grapec
from helpers import compile_and_run, init, model, tinfo


def _dft_model(shape, attrs, dft_length=None, opset=20, axis=-2):
    inputs = ["x", "n" if dft_length is not None else "", "axis"]
    inits = [init("axis", np.array(axis, np.int64))] + ([init("n", np.array(dft_length, np.int64))] if dft_length else [])
    return model([helper.make_node("DFT", inputs, ["y"], **attrs)], [tinfo("x", shape=list(shape))], [tinfo("y")], inits, opset=opset)


def _complex(a):
    return a[..., 0] + 1j * a[..., 1] if a.shape[-1] == 2 else a[..., 0]


@pytest.mark.parametrize("length,n,axis", [(12, None, 2), (9, None, 1), (12, 16, 2), (12, 7, 1)])
@pytest.mark.parametrize("complex_in", [False, True])
def test_dft_forward_matches_numpy(length, n, axis, complex_in):
    rng = np.random.default_rng(length * 10 + (n or 0))
    shape = [2, 3, 3, 2 if complex_in else 1]
    shape[axis] = length
    x = rng.standard_normal(shape).astype(np.float32)
    out, _ = compile_and_run(_dft_model(x.shape, {}, n, axis=axis), {"x": x})
    ref = np.fft.fft(_complex(x.astype(np.float64)), n=n, axis=axis)
    np.testing.assert_allclose(_complex(out["y"]), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [8, 9])
def test_rfft_and_irfft_round_trip_match_numpy(n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal((3, n, 1)).astype(np.float32)
    out, _ = compile_and_run(_dft_model(x.shape, {"onesided": 1}, axis=1), {"x": x})
    spec = out["y"]
    np.testing.assert_allclose(_complex(spec), np.fft.rfft(x[..., 0].astype(np.float64), axis=1), rtol=1e-5, atol=1e-5)
    back, _ = compile_and_run(_dft_model(spec.shape, {"inverse": 1, "onesided": 1}, n, axis=1), {"x": spec})
    np.testing.assert_allclose(back["y"][..., 0], np.fft.irfft(_complex(spec.astype(np.float64)), n=n, axis=1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(back["y"], x, rtol=1e-4, atol=1e-5)


def test_stft_with_hann_window_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    signal = rng.standard_normal((2, 400, 1)).astype(np.float32)
    n_fft, hop = 64, 16
    nodes = [helper.make_node("HannWindow", ["size"], ["w"]),
             helper.make_node("STFT", ["x", "step", "w", "size"], ["y"])]
    m = model(nodes, [tinfo("x", shape=[2, 400, 1])], [tinfo("y")],
              [init("size", np.array(n_fft, np.int64)), init("step", np.array(hop, np.int64))], opset=17)
    out, _ = compile_and_run(m, {"x": signal})
    ref = torch.stft(torch.from_numpy(signal[..., 0]).double(), n_fft, hop, window=torch.hann_window(n_fft, dtype=torch.float64),
                     center=False, onesided=True, return_complex=True).numpy().transpose(0, 2, 1)
    assert out["y"].shape == (2, (400 - n_fft) // hop + 1, n_fft // 2 + 1, 2)
    np.testing.assert_allclose(_complex(out["y"]), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op,fn", [("HannWindow", "hann_window"), ("HammingWindow", "hamming_window"),
                                   ("BlackmanWindow", "blackman_window")])
@pytest.mark.parametrize("periodic", [0, 1])
def test_windows_match_torch(op, fn, periodic):
    torch = pytest.importorskip("torch")
    m = model([helper.make_node(op, ["size"], ["y"], periodic=periodic)], [tinfo("size", TensorProto.INT64, [])],
              [tinfo("y")], opset=17)
    b = grapec.compile(m, shapes={"size": ()}, values={"size": np.array(20, np.int64)}, targets=[])
    out = grapec.load(b, backend="cpu").run({})
    kw = {"alpha": 25 / 46, "beta": 21 / 46} if op == "HammingWindow" else {}
    ref = getattr(torch, fn)(20, periodic=bool(periodic), dtype=torch.float64, **kw).numpy()
    np.testing.assert_allclose(out["y"], ref, rtol=1e-6, atol=1e-7)


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to compile the generated C for the host")
def test_stft_generated_c_matches_interpreter_on_host(tmp_path):
    from test_codegen import HostCodegenRunner
    m = model([helper.make_node("STFT", ["x", "step", "", "size"], ["y"])], [tinfo("x", shape=[1, 100, 1])], [tinfo("y")],
              [init("size", np.array(32, np.int64)), init("step", np.array(8, np.int64))], opset=17)
    feeds = {"x": np.random.default_rng(2).standard_normal((1, 100, 1)).astype(np.float32)}
    runner = HostCodegenRunner(grapec.compile(m, shapes={"x": (1, 100, 1)}, targets=[]), tmp_path)
    runner.run(0, feeds)
    assert runner.worst < 1e-5
