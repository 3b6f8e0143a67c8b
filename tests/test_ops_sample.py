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


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("ctm", ["half_pixel", "output_half_pixel"])
def test_roi_align_matches_onnxruntime(mode, ctm):
    """Random rois, some reaching past the image, over two images of the batch."""
    from onnx import TensorProto, helper
    from helpers import compile_and_run, model, ort_run, tinfo
    rng = np.random.default_rng(len(mode) + len(ctm))
    x = rng.standard_normal((2, 3, 12, 10)).astype(np.float32)
    corners = rng.uniform(-3, 13, (6, 2, 2)).astype(np.float32)
    rois = np.concatenate([corners.min(1), corners.max(1)], axis=1)          # x1, y1, x2, y2
    batch = rng.integers(0, 2, 6).astype(np.int64)
    m = model([helper.make_node("RoiAlign", ["x", "rois", "b"], ["y"], mode=mode, coordinate_transformation_mode=ctm,
                                output_height=4, output_width=3, sampling_ratio=2, spatial_scale=0.8)],
              [tinfo("x", shape=[2, 3, 12, 10]), tinfo("rois", shape=[6, 4]), tinfo("b", TensorProto.INT64, [6])],
              [tinfo("y")], opset=16)
    feeds = {"x": x, "rois": rois, "b": batch}
    got, _ = compile_and_run(m, feeds)
    ref = ort_run(m, feeds)
    np.testing.assert_allclose(got["y"], ref["y"], rtol=1e-5, atol=1e-5)


def test_roi_align_with_adaptive_sampling_is_refused_by_name():
    from onnx import TensorProto, helper
    from grapec.errors import UnsupportedError
    from helpers import compile_and_run, model, tinfo
    m = model([helper.make_node("RoiAlign", ["x", "rois", "b"], ["y"], name="roi", sampling_ratio=0)],
              [tinfo("x", shape=[1, 1, 4, 4]), tinfo("rois", shape=[1, 4]), tinfo("b", TensorProto.INT64, [1])],
              [tinfo("y")], opset=16)
    feeds = {"x": np.ones((1, 1, 4, 4), np.float32), "rois": np.array([[0, 0, 2, 2]], np.float32), "b": np.zeros(1, np.int64)}
    with pytest.raises(UnsupportedError, match="'roi' .*sampling_ratio"):
        compile_and_run(m, feeds)


@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="needs g++ to compile the generated C for the host")
def test_roi_align_generated_c_matches_interpreter_on_host(tmp_path):
    import grapec
    from onnx import TensorProto, helper
    from helpers import model, tinfo
    from test_codegen import HostCodegenRunner
    m = model([helper.make_node("RoiAlign", ["x", "rois", "b"], ["y"], mode="max", output_height=3, output_width=3,
                                sampling_ratio=2)],
              [tinfo("x", shape=[1, 2, 8, 8]), tinfo("rois", shape=[2, 4]), tinfo("b", TensorProto.INT64, [2])],
              [tinfo("y")], opset=16)
    feeds = {"x": np.random.default_rng(6).standard_normal((1, 2, 8, 8)).astype(np.float32),
             "rois": np.array([[0.5, 1.0, 6.0, 7.5], [-2.0, 3.0, 9.0, 9.0]], np.float32), "b": np.zeros(2, np.int64)}
    runner = HostCodegenRunner(grapec.compile(m, shapes={k: v.shape for k, v in feeds.items()}, targets=[]), tmp_path)
    runner.run(0, feeds)
    assert runner.worst < 1e-5
