"""GridSample and AffineGrid against onnxruntime (CPU), on random data and grids that reach past
[-1, 1], so every padding mode is exercised."""
import itertools

import numpy as np
import pytest

from helpers import rel_err, run_both


@pytest.mark.parametrize("mode,padding,align", list(itertools.product(
    ("linear", "nearest", "cubic"), ("zeros", "border", "reflection"), (0, 1))))
def test_grid_sample_2d_matches_onnxruntime(mode, padding, align):
    rng = np.random.default_rng(hash((mode, padding, align)) % 2**32)
    x = rng.standard_normal((2, 3, 5, 7)).astype(np.float32)
    grid = rng.uniform(-1.3, 1.3, (2, 4, 6, 2)).astype(np.float32)
    (got,), (ref,) = run_both("GridSample", {"x_0": x, "grid_1": grid},
                              attrs={"mode": mode, "padding_mode": padding, "align_corners": align}, opset=20)
    assert got.shape == ref.shape == (2, 3, 4, 6)
    assert rel_err(got, ref) < 1e-5, (np.abs(got - ref).max())
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


def test_grid_sample_3d_linear_matches_onnxruntime():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 2, 4, 5, 6)).astype(np.float32)
    grid = rng.uniform(-1.1, 1.1, (1, 3, 2, 4, 3)).astype(np.float32)
    (got,), (ref,) = run_both("GridSample", {"x_0": x, "grid_1": grid}, attrs={"mode": "linear"}, opset=20)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("align", (0, 1))
def test_affine_grid_feeds_grid_sample(align):
    """A spatial transformer: AffineGrid(theta) -> GridSample; the identity theta returns X."""
    rng = np.random.default_rng(11 + align)
    theta = rng.standard_normal((2, 2, 3)).astype(np.float32)
    size = np.array([2, 3, 5, 7], np.int64)
    (got,), (ref,) = run_both("AffineGrid", {"theta_0": theta}, consts={"size_1": size},
                              attrs={"align_corners": align}, opset=20)
    assert got.shape == (2, 5, 7, 2)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="needs g++ to compile the generated C for the host")
def test_grid_sample_generated_c_matches_interpreter_on_host(tmp_path):
    """The CUDA C the GPU would run, compiled for the host: cubic reflection taps, runtime indices."""
    import grapec
    from onnx import TensorProto, helper
    from helpers import model, tinfo
    from test_codegen import HostCodegenRunner
    m = model([helper.make_node("GridSample", ["x", "grid"], ["y"], mode="cubic", padding_mode="reflection")],
              [tinfo("x", TensorProto.FLOAT, [1, 2, 6, 5]), tinfo("grid", TensorProto.FLOAT, [1, 3, 4, 2])],
              [tinfo("y")], opset=20)
    rng = np.random.default_rng(5)
    feeds = {"x": rng.standard_normal((1, 2, 6, 5)).astype(np.float32),
             "grid": rng.uniform(-1.5, 1.5, (1, 3, 4, 2)).astype(np.float32)}
    b = grapec.compile(m, shapes={k: v.shape for k, v in feeds.items()}, targets=[])
    runner = HostCodegenRunner(b, tmp_path)
    runner.run(0, feeds)
    assert runner.worst < 1e-5
