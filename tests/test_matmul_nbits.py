"""onnxruntime's MatMulNBits and GatherBlockQuantized (com.microsoft; ops/quant.py): weight-only
quantized MatMul as onnxruntime's own quantizer writes it, and block-quantized embedding tables,
against onnxruntime's CPU kernels. The codes stay packed in the bundle and are unpacked in the kernel."""
import copy
import re
import shutil

import numpy as np
import pytest
from onnx import TensorProto as TP, helper, numpy_helper

import grapec
from grapec.bundle.format import Bundle
from grapec.errors import UnsupportedError
from grapec.runtime.devices import gpu_count
from helpers import ort_run, rel_err, tinfo
from test_cli import assert_user_error, grapec as grapec_cli

MS = "com.microsoft"
K, N = 96, 40      # K is not a multiple of 64 or 128: the last block is padded


def float_matmul(seed: int = 0):
    w = np.random.default_rng(seed).standard_normal((K, N)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                          [tinfo("x", TP.FLOAT, ["b", 5, K])], [tinfo("y", TP.FLOAT, ["b", 5, N])],
                          [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    return m


def quantized(bits: int, block: int, symmetric: bool):
    """The float MatMul through onnxruntime's MatMulNBitsQuantizer (the format its model builder writes)."""
    nbits = pytest.importorskip("onnxruntime.quantization.matmul_nbits_quantizer")
    q = nbits.MatMulNBitsQuantizer(copy.deepcopy(float_matmul()), algo_config=nbits.DefaultWeightOnlyQuantConfig(
        block_size=block, is_symmetric=symmetric, bits=bits))
    q.process()
    m = q.model.model
    m.ir_version = 10   # onnxruntime 1.30 loads up to 13; the quantizer stamps the newest onnx's
    assert [n.op_type for n in m.graph.node] == ["MatMulNBits"]
    return m


def compile_and_reload(m, targets=(), **options):
    b = grapec.compile(m, dims={"b": 3}, targets=list(targets) if targets != "auto" else targets, **options)
    return Bundle.from_bytes(b.to_bytes())


@pytest.mark.parametrize("bits, block, symmetric", [(4, 32, False), (4, 32, True), (4, 128, False), (8, 32, False),
                                                    (8, 16, True), (2, 32, False)])
def test_the_quantizers_models_match_onnxruntime_and_stay_packed(bits, block, symmetric):
    m = quantized(bits, block, symmetric)
    b = compile_and_reload(m)
    x = np.random.default_rng(bits * block).standard_normal((3, 5, K)).astype(np.float32)
    got, want = grapec.load(b).run({"x": x})["y"], ort_run(m, {"x": x})["y"]
    assert rel_err(got, want) < 1e-5, rel_err(got, want)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-3)
    # the codes stay packed: under a byte a weight with their scales, where float32 takes four
    assert len(b.weights) < K * N * (bits / 8 + 0.5), len(b.weights)


def _hand_built(zero_points: str, bias: bool, dtype, bits: int = 4, block: int = 32, rows: int = 2, k: int = K,
                n: int = N):
    """A MatMulNBits node written by hand: zero points absent, uint8 (packed), or floats like scales."""
    rng = np.random.default_rng(7)
    blocks = -(-k // block)
    elem = TP.FLOAT if dtype == np.float32 else TP.FLOAT16
    inits = [numpy_helper.from_array(rng.integers(0, 256, (n, blocks, block * bits // 8), dtype=np.uint8), "B"),
             numpy_helper.from_array((rng.random((n, blocks)) * 0.1 + 0.01).astype(dtype), "scales")]
    ins = ["x", "B", "scales", ""]
    if zero_points == "uint8":
        inits.append(numpy_helper.from_array(rng.integers(0, 256, n * -(-blocks * bits // 8), dtype=np.uint8), "zp"))
        ins[3] = "zp"
    elif zero_points == "float":
        inits.append(numpy_helper.from_array((rng.random((n, blocks)) * (1 << bits)).astype(dtype), "zp"))
        ins[3] = "zp"
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(n).astype(dtype), "bias"))
        ins += ["", "bias"]
    node = helper.make_node("MatMulNBits", ins, ["y"], domain=MS, name="q", K=k, N=n, bits=bits, block_size=block)
    g = helper.make_graph([node], "g", [tinfo("x", elem, [rows, k])], [tinfo("y", elem, [rows, n])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    m.ir_version = 10
    return m


@pytest.mark.parametrize("zero_points", ["none", "uint8", "float"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("rows", [2, 9])   # the unpacking kernel; the weight unpacked once, then a GEMM
def test_zero_point_forms_bias_and_half_inputs_match_onnxruntime(zero_points, bias, dtype, rows):
    m = _hand_built(zero_points, bias, dtype, rows=rows)
    x = np.random.default_rng(3).standard_normal((rows, K)).astype(dtype)
    got = grapec.load(grapec.compile(m, targets=[])).run({"x": x})["y"].astype(np.float64)
    want = ort_run(m, {"x": x})["y"].astype(np.float64)
    # half: grapec sums in float32 and rounds once; onnxruntime rounds the product to half before
    # adding the bias, so the two may differ by one half ulp (3.9e-3 at these magnitudes)
    atol, limit = (1e-4, 1e-6) if dtype == np.float32 else (4e-3, 1e-3)
    assert rel_err(got, want) < limit, rel_err(got, want)
    np.testing.assert_allclose(got, want, atol=atol, rtol=1e-3)


@pytest.mark.parametrize("bits, block", [(2, 32), (4, 16), (4, 64), (8, 32)])
@pytest.mark.parametrize("zero_points", ["none", "uint8"])
def test_a_few_rows_unpack_each_byte_as_onnxruntime_does(bits, block, zero_points):
    """Up to 4 rows one kernel reduces over each column's bytes, unpacking a byte's codes together
    (K a multiple of the block); with the last block padded (block 64 of K 96) over the codes."""
    m = _hand_built(zero_points, False, np.float32, bits=bits, block=block, rows=3)
    x = np.random.default_rng(bits + block).standard_normal((3, K)).astype(np.float32)
    b = grapec.compile(m, targets=[])
    got = grapec.load(Bundle.from_bytes(b.to_bytes())).run({"x": x})["y"]
    want = ort_run(m, {"x": x})["y"]
    assert rel_err(got, want) < 1e-6, rel_err(got, want)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-3)


def test_unsupported_forms_are_named_with_their_node(tmp_path):
    m = _hand_built("none", False, np.float32, bits=3, block=32)
    with pytest.raises(UnsupportedError, match=r"'q'.*bits=3 is not supported \(supported: 2, 4, 8\)"):
        grapec.compile(m, targets=[])
    path = tmp_path / "q3.onnx"
    path.write_bytes(m.SerializeToString())
    assert_user_error(*grapec_cli("compile", path, "-o", tmp_path / "q3.grape"), "bits=3", "'q'")
    assert not (tmp_path / "q3.grape").exists()
    for block in (8, 24):   # below 16, or not a power of two
        m = _hand_built("none", False, np.float32, bits=4, block=block)
        with pytest.raises(UnsupportedError, match=rf"'q'.*block_size={block} is not supported: blocks are a power of two of at least 16"):
            grapec.compile(m, targets=[])
    path.write_bytes(m.SerializeToString())
    assert_user_error(*grapec_cli("compile", path, "-o", tmp_path / "q24.grape"), "block_size=24", "'q'")
    g_idx = _hand_built("none", False, np.float32)
    g_idx.graph.node[0].input.append("g_idx")
    g_idx.graph.initializer.append(numpy_helper.from_array(np.arange(K, dtype=np.int32) // 32, "g_idx"))
    with pytest.raises(UnsupportedError, match="g_idx"):
        grapec.compile(g_idx, targets=[])


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_count(), reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_the_cuda_backend_unpacks_the_codes_as_onnxruntime_does(precision):
    m = quantized(4, 32, False)
    b = compile_and_reload(m, targets="auto", precision=precision, strict=True)
    x = np.random.default_rng(11).standard_normal((3, 5, K)).astype(np.float32)
    got, want = grapec.load(b, backend="cuda").run({"x": x})["y"], ort_run(m, {"x": x})["y"]
    limit = 1e-5 if precision == "fp32" else 1e-2   # fp16: the half measure compile accepted it by
    assert rel_err(got, want) < limit, rel_err(got, want)


# a decode step's GEMV: K a multiple of 32 x 32, so a lane reads 32 codes a step (codegen/vectors.py), and
# enough outputs for a warp each (codegen/launch.py)
GEMV_K, GEMV_N = 2048, 4096


def test_a_decode_steps_int4_gemv_reads_16_bytes_of_codes_a_lane_and_converts_them_without_i2f():
    """One row against a 4-bit weight with float zero points: each lane's step is 32 halves of x (four
    16-byte reads) beside 16 bytes of packed codes; a code becomes a float by its bits (no int-to-float
    conversion), and the block's scale multiplies the step's sum once. The source compiles for sm_90."""
    m = _hand_built("float", False, np.float16, bits=4, block=32, rows=1, k=GEMV_K, n=GEMV_N)
    b = grapec.compile(m, targets=["sm_90"])
    src = b.extra_sections["cuda.source"]
    src = src.decode() if isinstance(src, bytes) else src
    (gemv,) = [part for part in src.split('extern "C"')[1:] if "unsigned char" in part]
    assert "G_WARP * 32) {" in gemv, gemv
    assert "const uint4 vec" in gemv and "[4] = {" in gemv, "x is read as four 16-byte vectors a step"
    assert "= *(const uint4*)(in1 " in gemv, "the codes are read 16 bytes a lane a step"
    assert "g_dot8_q4(" not in gemv, "a float zero point may be fractional: the codes are unpacked one at a time"
    ints = re.findall(r"const int (v\d+) =", gemv)
    assert "__int_as_float(0x4B000000 | " in gemv and ints
    assert not [v for v in ints if f"(float){v})" in gemv], "an int is converted to float by a cast"
    assert " * sv" in gemv, "the block scale multiplies the step's sum"


def numpy_matmul_nbits(m, x: np.ndarray) -> np.ndarray:
    """The MatMulNBits of _hand_built in float64, from its spec (onnxruntime's CPU kernel leaves out 8-bit
    codes with float zero points)."""
    (node,), inits = [n for n in m.graph.node if n.op_type == "MatMulNBits"], \
        {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    a = {at.name: helper.get_attribute_value(at) for at in node.attribute}
    bits, block, k, n = a["bits"], a["block_size"], a["K"], a["N"]
    blocks = -(-k // block)

    def unpack(packed, count):   # low bits first
        shifts = np.arange(8 // bits) * bits
        return ((packed[..., None] >> shifts) & ((1 << bits) - 1)).reshape(packed.shape[0], -1)[:, :count]
    codes = unpack(inits["B"].reshape(n, -1), k).astype(np.float64)
    scales = inits["scales"].astype(np.float64).reshape(n, blocks)
    zp = inits.get("zp")
    if zp is None:
        zero = np.full((n, blocks), 1 << (bits - 1), np.float64)
    elif zp.dtype == np.uint8:
        zero = unpack(zp.reshape(n, -1), blocks).astype(np.float64)
    else:
        zero = zp.astype(np.float64).reshape(n, blocks)
    per_k = np.arange(k) // block
    w = (codes - zero[:, per_k]) * scales[:, per_k]
    y = x.astype(np.float64) @ w.T
    return y + inits["bias"].astype(np.float64) if "bias" in inits else y


@pytest.mark.parametrize("bits, zero_points", [(4, "float"), (4, "uint8"), (2, "none"), (8, "uint8")])
def test_the_numpy_reference_matches_onnxruntime(bits, zero_points):
    m = _hand_built(zero_points, True, np.float32, bits=bits, block=32, rows=2)
    x = np.random.default_rng(5).standard_normal((2, K)).astype(np.float32)
    assert rel_err(numpy_matmul_nbits(m, x), ort_run(m, {"x": x})["y"]) < 1e-6


GEMV_FORMS = [(4, 16), (4, 32), (4, 64), (4, 128), (8, 32), (2, 32)]


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to compile generated code for the host")
@pytest.mark.parametrize("bits, block", GEMV_FORMS)
@pytest.mark.parametrize("zero_points", ["none", "uint8", "float"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_the_generated_gemv_computes_what_the_interpreter_does(bits, block, zero_points, dtype, tmp_path):
    """The GEMV's CUDA C (4-bit codes eight at a time where A is half and the zero point an integer:
    g_dot8_q4; the element form otherwise), compiled for the host and run beside the numpy interpreter on
    each step. A float32 A (a quantized float32 model) reads 32 of its elements a step beside 16 bytes of
    4-bit codes too."""
    from test_codegen import HostCodegenRunner
    m = _hand_built(zero_points, True, dtype, bits=bits, block=block, rows=1, k=GEMV_K, n=GEMV_N)
    b = grapec.compile(m, targets=[])
    runner = HostCodegenRunner(b, tmp_path)
    # a float16 model (compiled as it is, not with --precision) rounds to half: half rounding's tolerance
    runner.half = dtype == np.float16
    x = np.random.default_rng(bits + block).standard_normal((1, GEMV_K)).astype(dtype)
    got = runner.run(0, {"x": x})["y"].astype(np.float64)
    assert rel_err(got, numpy_matmul_nbits(m, x)) < 1e-3   # and each step matched the interpreter (the runner)
    source = "\n".join(runner.module.bodies)
    # a float zero point may be fractional (no exact half bias); a 16-code block changes scale within a lane's step
    eight_at_a_time = dtype == np.float16 and bits == 4 and zero_points != "float" and block % 32 == 0
    assert ("g_dot8_q4(((const uint4*)" in source) == eight_at_a_time
    if bits == 4:   # 32 codes a lane a step: 16 bytes of them
        assert "G_WARP * 32) {" in source


def _after_head_transpose(m, heads: int = 32):
    """The hand-built MatMulNBits reading attention heads [1, heads, 1, K / heads] through the transpose and
    reshape that merge them (GroupQueryAttention's output before o_proj)."""
    g = m.graph
    x = g.input[0]
    k = x.type.tensor_type.shape.dim[1].dim_value
    nodes = [helper.make_node("Transpose", ["heads"], ["merged"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["merged", "row"], ["x"])]
    g.initializer.append(numpy_helper.from_array(np.array([1, k], np.int64), "row"))
    heads_in = tinfo("heads", x.type.tensor_type.elem_type, [1, heads, 1, k // heads])
    old = list(g.node)
    del g.node[:]
    g.node.extend(nodes + old)
    g.input.pop()
    g.input.append(heads_in)
    return m


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to compile generated code for the host")
def test_a_gemv_reads_transposed_heads_as_one_row_of_vectors(tmp_path):
    """[1, 32, 1, 64] heads read as [1, 2048] through their transpose (indices r // 64, 0, r % 64): one
    contiguous row, so the GEMV reads it in vectors, a warp an output (it took a block an output, one
    element a thread: 7.9 us for Llama-1B's int4 o_proj on an H200), computing what the interpreter does."""
    from test_codegen import HostCodegenRunner
    m = _after_head_transpose(_hand_built("none", True, np.float16, bits=4, block=32, rows=1, k=GEMV_K, n=GEMV_N))
    b = grapec.compile(m, targets=[])
    runner = HostCodegenRunner(b, tmp_path)
    runner.half = True
    heads = np.random.default_rng(2).standard_normal((1, 32, 1, GEMV_K // 32)).astype(np.float16)
    got = runner.run(0, {"heads": heads})["y"].astype(np.float64)
    want = numpy_matmul_nbits(m, heads.reshape(1, GEMV_K))
    assert rel_err(got, want) < 1e-3
    gemv = "\n".join(runner.module.bodies)   # the one kernel (and any sized twin of it)
    assert len(b.plans[0].steps) == 1 and "g_row" in gemv and "g_dot8_q4(((const uint4*)" in gemv, "a warp an output, the heads read in vectors"


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_count(), reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("bits, block", GEMV_FORMS)
@pytest.mark.parametrize("zero_points", ["none", "uint8", "float"])
def test_the_cuda_gemv_of_one_to_four_rows_matches_onnxruntime(bits, block, zero_points):
    """The unpacking kernel as a decode step runs it (1 and 3 rows, K = 2048), every block size and
    zero-point form, against the spec in float64 (numpy_matmul_nbits: onnxruntime's CPU kernel takes no
    8-bit codes with float zero points)."""
    for rows in (1, 3):
        m = _hand_built(zero_points, True, np.float16, bits=bits, block=block, rows=rows, k=GEMV_K, n=GEMV_N)
        x = np.random.default_rng(rows).standard_normal((rows, GEMV_K)).astype(np.float16)
        got = grapec.load(grapec.compile(m, targets="auto"), backend="cuda").run({"x": x})["y"].astype(np.float64)
        want = numpy_matmul_nbits(m, x)
        # as the CPU backend's test above: float32 sums, one rounding to half at the end
        assert rel_err(got, want) < 1e-3, (rows, rel_err(got, want))
        np.testing.assert_allclose(got, want, atol=4e-3 * np.abs(want).max() / 4, rtol=1e-3, err_msg=f"{rows} rows")
    # one row read through the attention heads' transpose (test_a_gemv_reads_transposed_heads_as_one_row_of_vectors)
    m = _after_head_transpose(_hand_built(zero_points, True, np.float16, bits=bits, block=block, rows=1, k=GEMV_K, n=GEMV_N))
    heads = np.random.default_rng(4).standard_normal((1, 32, 1, GEMV_K // 32)).astype(np.float16)
    got = grapec.load(grapec.compile(m, targets="auto"), backend="cuda").run({"heads": heads})["y"].astype(np.float64)
    assert rel_err(got, numpy_matmul_nbits(m, heads.reshape(1, GEMV_K))) < 1e-3


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_count(), reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("bits, block, zero_points", [(4, 32, "none"), (4, 128, "uint8"), (2, 32, "float"), (8, 32, "none")])
def test_the_cuda_gemv_of_a_float32_a_matches_the_spec(bits, block, zero_points):
    """A quantized float32 model's GEMV: 32 floats of A a lane a step (eight 16-byte reads) beside the codes."""
    m = _hand_built(zero_points, True, np.float32, bits=bits, block=block, rows=1, k=GEMV_K, n=GEMV_N)
    x = np.random.default_rng(6).standard_normal((1, GEMV_K)).astype(np.float32)
    got = grapec.load(grapec.compile(m, targets="auto"), backend="cuda").run({"x": x})["y"].astype(np.float64)
    assert rel_err(got, numpy_matmul_nbits(m, x)) < 1e-5


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("zero_points", [False, True])
def test_gather_block_quantized_matches_onnxruntime(bits, zero_points):
    """onnxruntime-genai's int4 embedding table: rows gathered (a negative id counts from the end) and
    unpacked in blocks, with or without packed zero points."""
    rng = np.random.default_rng(bits)
    rows, k, block = 50, 64, 32
    blocks = k // block
    inits = [numpy_helper.from_array(rng.integers(0, 256, (rows, k * bits // 8), dtype=np.uint8), "data"),
             numpy_helper.from_array((rng.random((rows, blocks)) * 0.1 + 0.01).astype(np.float32), "scales")]
    ins = ["data", "ids", "scales"]
    if zero_points:
        inits.append(numpy_helper.from_array(rng.integers(0, 256, (rows, -(-blocks * bits // 8)), dtype=np.uint8), "zp"))
        ins.append("zp")
    node = helper.make_node("GatherBlockQuantized", ins, ["y"], domain=MS, bits=bits, block_size=block,
                            gather_axis=0, quantize_axis=1)
    g = helper.make_graph([node], "g", [tinfo("ids", TP.INT64, [2, 3])], [tinfo("y", TP.FLOAT, [2, 3, k])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    m.ir_version = 10
    ids = np.array([[0, 7, 49], [-1, 12, 3]], np.int64)
    got = grapec.load(grapec.compile(m, targets=[])).run({"ids": ids})["y"]
    want = ort_run(m, {"ids": ids})["y"]
    np.testing.assert_allclose(got, want, atol=1e-6, rtol=1e-6)
