"""passes/gemv.py and codegen's warp mode: a matmul of a few rows against a weight is one kernel with
its bias, activation and residual fused, checked against onnxruntime and, as generated C, against the
interpreter; larger or shared-weight matmuls stay with the library."""
import os
import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import grapec
from grapec.codegen.launch import plan_launch
from grapec.ir.kernel import Kernel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def dense_model(path, rows, k, n, seed=0, share_weight=False, dtype=np.float32):
    """y = Relu(x @ W + b) + r: the decode-step MLP shape. share_weight: rows of W, picked by the
    input `i`, are also an output (as a tied embedding reads its table)."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(dtype)
    b = rng.standard_normal(n).astype(dtype)
    et = TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT
    nodes = [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["h"]),
             helper.make_node("Relu", ["h"], ["a"]), helper.make_node("Add", ["a", "r"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", et, [rows, n])]
    if share_weight:
        nodes.append(helper.make_node("Gather", ["W", "i"], ["wrows"], axis=0))
        outputs.append(helper.make_tensor_value_info("wrows", et, [2, n]))
    inputs = [helper.make_tensor_value_info("x", et, [rows, k]), helper.make_tensor_value_info("r", et, [rows, n])]
    if share_weight:
        inputs.append(helper.make_tensor_value_info("i", TensorProto.INT64, [2]))
    graph = helper.make_graph(nodes, "dense", inputs,
                              outputs, [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)
    return path


def feeds(rows, k, n, seed=1, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((rows, k)).astype(dtype), "r": rng.standard_normal((rows, n)).astype(dtype)}


def ort_run(path, f):
    import onnxruntime as ort
    return ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, f)


def kinds(b):
    return [st.op for st in b.plans[0].steps]


def test_one_row_matmul_is_one_warp_kernel_with_its_epilogue(tmp_path):
    path = dense_model(str(tmp_path / "d.onnx"), 1, 96, 320)
    b = grapec.compile(path, targets=[])
    assert kinds(b) == ["kernel"], kinds(b)          # matmul, bias, relu and residual in one kernel
    k = Kernel.from_json(b.kernels[b.plans[0].steps[0].kernel])
    assert plan_launch(k).mode == "warp"              # 320 outputs, a warp each
    f = feeds(1, 96, 320)
    out = grapec.load(b, backend="cpu").run(f)["y"]
    ref = ort_run(path, f)[0]
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-6
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_weight_stored_k_contiguous_once(tmp_path):
    """The [K, N] weight is transposed at compile time: the bundle holds it once, as [N, K]."""
    path = dense_model(str(tmp_path / "d.onnx"), 1, 96, 320)
    b = grapec.compile(path, targets=[])
    weights = [buf for buf in b.plans[0].buffers if buf.space == "weight" and buf.nbytes == 96 * 320 * 4]
    assert [tuple(w.shape) for w in weights] == [(320, 96)]


def test_fp16_gemv_accumulates_in_fp32(tmp_path):
    path = dense_model(str(tmp_path / "d.onnx"), 2, 768, 288, seed=3)
    b = grapec.compile(path, targets=[], precision="fp16")
    assert "library" not in kinds(b)
    f = feeds(2, 768, 288, seed=4)
    out = grapec.load(b, backend="cpu").run(f)["y"].astype(np.float32)
    ref = ort_run(path, f)[0]
    # fp16 weights, inputs and output (rounding ~5e-4 relative each); a sum of 768 products
    # accumulated in fp16 would be off by ~1e-2
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 2e-3


def test_more_rows_or_a_shared_weight_stay_with_the_library(tmp_path):
    many = grapec.compile(dense_model(str(tmp_path / "m.onnx"), 16, 96, 320), targets=[])
    assert "library" in kinds(many)
    shared_path = dense_model(str(tmp_path / "s.onnx"), 1, 96, 320, share_weight=True)
    shared = grapec.compile(shared_path, targets=[])
    assert "library" in kinds(shared)   # another reader wants W as stored: no second, transposed copy
    f = dict(feeds(1, 96, 320), i=np.array([5, 90], np.int64))
    out = grapec.load(shared, backend="cpu").run(f)
    ref = ort_run(shared_path, f)
    np.testing.assert_allclose(out["y"], ref[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out["wrows"], ref[1])


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to compile generated code for the host")
def test_warp_mode_cuda_c_matches_interpreter_on_host(tmp_path):
    from test_codegen import HostCodegenRunner
    path = dense_model(str(tmp_path / "d.onnx"), 1, 96, 320)
    b = grapec.compile(path, targets=[])
    runner = HostCodegenRunner(b, tmp_path)
    out = runner.run(0, feeds(1, 96, 320, seed=5))
    assert runner.worst < 1e-5
    ref = ort_run(path, feeds(1, 96, 320, seed=5))[0]
    np.testing.assert_allclose(out["y"], ref, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to compile generated code for the host")
def test_decode_step_cuda_c_matches_interpreter_on_host(tmp_path):
    """GPT-2 at seq 1: gemv projections (the lm_head in warp mode), the head split read in place."""
    from test_codegen import HostCodegenRunner, bucket_feeds
    b = grapec.compile(os.path.join(ROOT, "models", "tiny", "gpt2.onnx"), dims={"batch": 1, "seq": 1})
    matmuls = [st for st in b.plans[0].steps if st.op == "library"]
    assert all(st.attrs.get("views") for st in matmuls), [st.origin for st in matmuls]   # QK^T, PV only
    runner = HostCodegenRunner(b, tmp_path)
    runner.run(0, bucket_feeds(b, 0, 3))
    assert runner.worst < 1e-4


def test_a_weight_too_large_for_l2_takes_the_gemv_up_to_two_rows(tmp_path):
    """Each row of A reads the weight again: from L2 for a small weight, from DRAM for one past
    LARGE_WEIGHT_BYTES (measured: Llama-1B's MLP at batch 4)."""
    from grapec.passes.gemv import LARGE_WEIGHT_BYTES
    k, n = 1024, LARGE_WEIGHT_BYTES // (4 * 1024) + 64      # float32: just past the bound
    for rows, want in ((2, "kernel"), (4, "library")):
        path = dense_model(str(tmp_path / f"big{rows}.onnx"), rows, k, n)
        b = grapec.compile(path, targets=[])
        assert (want == "library") == ("library" in kinds(b)), (rows, kinds(b))
        f = feeds(rows, k, n)
        np.testing.assert_allclose(grapec.load(b).run(f)["y"], ort_run(path, f)[0], rtol=1e-4, atol=1e-4)
    small = grapec.compile(dense_model(str(tmp_path / "small4.onnx"), 4, 96, 320), targets=[])
    assert kinds(small) == ["kernel"], kinds(small)   # a small weight keeps the gemv at 4 rows


def test_fp16_takes_the_small_gemm_but_at_one_row_against_a_large_weight(tmp_path):
    """In fp16 the gemv wins only at one row against a weight of GEMV_OVER_SMALL_GEMM_BYTES or more
    (benchmarks/gemv_vs_small_gemm.py); every other few-row matmul is a SmallGemmKernel."""
    from grapec.passes.gemv import GEMV_OVER_SMALL_GEMM_BYTES
    big_n = GEMV_OVER_SMALL_GEMM_BYTES // (2 * 256) + 64     # float16, K = 256: just past the bound
    for rows, n, want in ((1, 320, "small_gemm"), (1, big_n, "kernel"), (2, big_n, "small_gemm"), (4, 320, "small_gemm")):
        path = dense_model(str(tmp_path / f"h{rows}_{n}.onnx"), rows, 256, n, dtype=np.float16)
        b = grapec.compile(path, targets=[])
        first = b.plans[0].steps[0]
        assert b.kernels[first.kernel].get("kind", "kernel") == want, (rows, n)
        f = feeds(rows, 256, n, dtype=np.float16)
        out = grapec.load(b, backend="cpu").run(f)["y"].astype(np.float32)
        ref = ort_run(path, f)[0].astype(np.float32)
        assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 2e-3, (rows, n)


def rmsnorm_gemv_model(path, k, n, dtype=np.float16):
    """y = RMSNorm(x) @ W: Llama's post-attention norm before its MLP, as torch.onnx writes RMSNorm
    (Pow, ReduceMean, Add eps, Sqrt, Reciprocal, Mul, Mul by the weight)."""
    rng = np.random.default_rng(3)
    et = TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT
    inits = [numpy_helper.from_array((rng.standard_normal((k, n)) / np.sqrt(k)).astype(dtype), "W"),
             numpy_helper.from_array((1 + 0.1 * rng.standard_normal(k)).astype(dtype), "g"),
             numpy_helper.from_array(np.array(2.0, dtype), "two"), numpy_helper.from_array(np.array(1e-5, dtype), "eps")]
    nodes = [helper.make_node("Pow", ["x", "two"], ["sq"]), helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1]),
             helper.make_node("Add", ["ms", "eps"], ["mse"]), helper.make_node("Sqrt", ["mse"], ["rms"]),
             helper.make_node("Reciprocal", ["rms"], ["inv"]), helper.make_node("Mul", ["x", "inv"], ["xn"]),
             helper.make_node("Mul", ["xn", "g"], ["xg"]), helper.make_node("MatMul", ["xg", "W"], ["y"])]
    graph = helper.make_graph(nodes, "norm_gemv", [helper.make_tensor_value_info("x", et, [1, k])],
                              [helper.make_tensor_value_info("y", et, [1, n])], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)
    return path


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to compile generated code for the host")
def test_a_norm_before_a_float32_gemv_is_computed_by_each_warp_of_it(tmp_path):
    """One row against a float32 weight: the RMSNorm is no kernel of its own; each warp computes the row's
    statistic once, before its dot product (passes/fuse.py _statistics_into_gemv), and the generated C
    computes what the interpreter does. With half weights the norm stays a kernel (measured slower)."""
    from test_codegen import HostCodegenRunner
    k, n = 2048, 8192
    half = rmsnorm_gemv_model(str(tmp_path / "h.onnx"), k, n)
    assert kinds(grapec.compile(half, targets=[])) == ["kernel", "kernel"]
    path = rmsnorm_gemv_model(str(tmp_path / "n.onnx"), k, n, np.float32)
    b = grapec.compile(path, targets=[])
    assert kinds(b) == ["kernel"], [st.origin for st in b.plans[0].steps]
    runner = HostCodegenRunner(b, tmp_path)
    x = np.random.default_rng(4).standard_normal((1, k)).astype(np.float32)
    out = runner.run(0, {"x": x})["y"]
    ref = ort_run(path, {"x": x})[0]
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-5
    source = "\n".join(runner.module.bodies)
    assert source.count("g_warp_reduce") == 2 and source.index("sqrtf") < source.rindex("for (i64 f"), \
        "the statistic's reduction and then the dot product's, the statistic before the dot product's loop"


def test_a_norm_before_a_gemv_of_packed_codes_stays_a_kernel():
    """A 4-bit GEMV is bound by its instructions (codegen/vectors.py): the norm before it stays a kernel of
    its own, and the GEMV reads its output as a vector, eight codes at a time."""
    from test_matmul_nbits import GEMV_K, GEMV_N, _hand_built
    m = _hand_built("none", False, np.float16, bits=4, block=32, rows=1, k=GEMV_K, n=GEMV_N)
    g = m.graph
    rng = np.random.default_rng(5)
    g.initializer.extend([numpy_helper.from_array((1 + 0.1 * rng.standard_normal(GEMV_K)).astype(np.float16), "g")])
    g.node.insert(0, helper.make_node("SimplifiedLayerNormalization", ["raw", "g"], ["x"], axis=-1, epsilon=1e-5))
    raw = helper.make_tensor_value_info("raw", TensorProto.FLOAT16, [1, GEMV_K])
    del g.input[:]
    g.input.append(raw)
    b = grapec.compile(m, targets=[])
    assert kinds(b) == ["kernel", "kernel"], [st.origin for st in b.plans[0].steps]
