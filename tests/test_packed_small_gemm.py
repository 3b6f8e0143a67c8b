"""MatMulNBits' 4-bit codes at 2-16 rows (a batch of decode steps) as one small GEMM that unpacks them as it
loads them (ir/small_gemm.py PackedWeight, codegen/small_gemm.py, codegen/prelude.py g_unpack8_q4), against
MatMulNBits' spec in float64 (test_matmul_nbits.py numpy_matmul_nbits) on both backends."""
import numpy as np
import pytest

import grapec
from grapec.bundle.format import Bundle
from grapec.ir.kinds import kernel_from_json
from grapec.ir.small_gemm import unpack_codes_in_order
from grapec.runtime.devices import gpu_count
from onnx import helper, numpy_helper
from helpers import rel_err
from test_matmul_nbits import GEMV_K, GEMV_N, K, _hand_built, numpy_matmul_nbits


def with_prologue(m):
    """The model with x scaled by a constant vector before the MatMulNBits: a kernel the small GEMM takes as
    its prologue (A staged in shared memory by every block: the one-tile form)."""
    k = m.graph.input[0].type.tensor_type.shape.dim[-1].dim_value
    scale = numpy_helper.from_array(np.random.default_rng(3).uniform(0.5, 1.5, k).astype(np.float16), "x_scale")
    m.graph.initializer.append(scale)
    m.graph.node.insert(0, helper.make_node("Mul", ["x", "x_scale"], ["x_scaled"], name="scale_x"))
    m.graph.node[1].input[0] = "x_scaled"
    return m


def steps_of(bundle) -> list:
    """(step kind, the kernel's PackedWeight or None) for every step of the first plan."""
    out = []
    for st in bundle.plans[0].steps:
        k = kernel_from_json(bundle.kernels[st.kernel]) if st.op == "kernel" else None
        out.append((st.op, getattr(k, "packed", None)))
    return out


def _half(bits16: int) -> np.float16:
    return np.array([bits16 & 0xFFFF], np.uint16).view(np.float16)[0]


def _prmt_twice(w: int, j: int) -> int:
    """prmt.b32 d, w, 0, 0x4040 | 0x0101 j: byte j of w in bytes 0 and 2, zeros in 1 and 3."""
    byte = (w >> (8 * j)) & 0xFF
    return byte | (byte << 16)


def test_the_unpacking_gives_the_code_pairs_in_order():
    """g_unpack8_q4's arithmetic, step by step in numpy on MatMulNBits' own word: byte j twice, masked by
    0x00F0000F over 0x6400 (1024 in half), is the pair (1024 + k_2j, 1024 + 16 k_2j+1); one fma by (1, 1/16) takes
    1024 + zero and 64 + zero off exactly; the scale multiplies once. That is (code - zero) * scale rounded to half
    once, as the spec's weight, in the pairs (k0, k1) .. (k6, k7) an mma fragment pairs with A's halves."""
    rng = np.random.default_rng(60)
    for _ in range(500):
        codes = rng.integers(0, 256, (1, 4)).astype(np.uint8)
        k = unpack_codes_in_order(codes, 8)[0].astype(np.float64)
        w = int.from_bytes(bytes(codes[0]), "little")
        zero, scale = int(rng.integers(0, 16)), np.float16(rng.standard_normal() * 0.05)
        got = []
        for j in range(4):
            word = (_prmt_twice(w, j) & 0x00F0000F) | 0x64006400
            lo, hi = np.float64(_half(word)), np.float64(_half(word >> 16))
            pair = (np.float16(lo * 1.0 + np.float64(np.float16(-1024 - zero))),
                    np.float16(hi * 0.0625 + np.float64(np.float16(-64 - zero))))   # fma: exact, then rounded
            got += [np.float16(np.float64(d) * np.float64(scale)) for d in pair]
        want = [np.float16((c - zero) * np.float64(scale)) for c in k]
        assert got == want, (k, zero, scale, got, want)


def test_the_codes_are_stored_once_for_the_gemv_and_the_small_gemm():
    """A bundle of one row (the unpacking GEMV) and four (the small GEMM) reads one copy of the codes: both
    kernels take MatMulNBits' bytes as they are (a reordered copy for the small GEMM doubled an int4 model's
    weights, 0.65 to 1.23 GiB for the Llama-1B-shaped export)."""
    k, n = 1024, 512
    m = _hand_built("uint8", False, np.float16, rows="rows", k=k, n=n)
    b = Bundle.from_bytes(grapec.compile(m, bucket_dims=[{"rows": 1}, {"rows": 4}], targets=[]).to_bytes())
    packed = [p for plan in b.plans for st in plan.steps if st.op == "kernel"
              for p in [getattr(kernel_from_json(b.kernels[st.kernel]), "packed", None)] if p is not None]
    assert len(b.plans) == 2 and len(packed) == 1, packed
    codes = n * k // 2
    assert codes <= len(b.weights) < codes * 1.25, (len(b.weights), codes)   # the scales and zero points besides


@pytest.mark.parametrize("rows", [2, 5, 16])
@pytest.mark.parametrize("block", [16, 32, 128])
@pytest.mark.parametrize("zero_points", ["none", "uint8"])
def test_a_few_rows_of_4bit_codes_are_one_small_gemm_that_unpacks_them(rows, block, zero_points):
    """No [N, K] half weight is made at a step (it was unpacked into memory, then multiplied by cuBLASLt, past 4
    rows): one small GEMM reads the codes; the bias after it stays a kernel. The bundle keeps the codes."""
    m = _hand_built(zero_points, True, np.float16, rows=rows, block=block)
    b = Bundle.from_bytes(grapec.compile(m, targets=["sm_90"]).to_bytes())
    kinds = steps_of(b)
    assert [op for op, _ in kinds] == ["kernel", "kernel"] and kinds[0][1] is not None, kinds
    assert kinds[0][1].zero_points == (zero_points == "uint8") and kinds[0][1].block == block
    assert len(b.weights) < K * 40, len(b.weights)   # codes (half a byte a weight) and scales, not halves
    x = np.random.default_rng(rows).standard_normal((rows, K)).astype(np.float16)
    got = grapec.load(b, backend="cpu").run({"x": x})["y"].astype(np.float64)
    want = numpy_matmul_nbits(m, x)
    # the weight rounded to half once (as the unpacked weight was), float32 sums, the output rounded to half
    assert rel_err(got, want) < 1e-3, rel_err(got, want)
    np.testing.assert_allclose(got, want, atol=4e-3 * np.abs(want).max(), rtol=1e-2)


@pytest.mark.parametrize("rows", [2, 16])
def test_the_form_is_the_split_one_where_a_is_read_as_it_lies(rows):
    """For sm_90 (thread-block clusters): A read from memory takes the split form (a block's 64 columns share
    A's steps in shared memory), and A made by a prologue the one-tile form; without clusters, the one-tile
    form. Both compute the spec's result on the CPU backend."""
    def kernel(m, targets):
        b = Bundle.from_bytes(grapec.compile(m, targets=targets).to_bytes())
        ks = [kernel_from_json(b.kernels[st.kernel]) for st in b.plans[0].steps if st.op == "kernel"]
        return b, [k for k in ks if getattr(k, "packed", None) is not None]
    depth = 1024   # 16 rows of it fit a prologue's shared memory (codegen/small_gemm.py SMEM_BYTES)
    plain = _hand_built("uint8", False, np.float16, rows=rows, k=depth, n=256)
    b, [k] = kernel(plain, ["sm_90"])
    assert k.split and k.prologue is None, k
    assert "__cluster_dims__" in b.extra_sections["cuda.source"].decode()
    _, [k] = kernel(plain, ["sm_80"])
    assert not k.split, k
    _, [k] = kernel(with_prologue(_hand_built("uint8", False, np.float16, rows=rows, k=depth, n=256)), ["sm_90"])
    assert not k.split and k.prologue is not None, k
    x = np.random.default_rng(rows).standard_normal((rows, depth)).astype(np.float16)
    got = grapec.load(b, backend="cpu").run({"x": x})["y"].astype(np.float64)
    assert rel_err(got, numpy_matmul_nbits(plain, x)) < 1e-3


@pytest.mark.parametrize("zero_points, rows, dtype, want", [
    ("float", 5, np.float16, ["kernel", "library", "kernel"]),   # float zero points: unpacked, then cuBLASLt
    ("none", 5, np.float32, ["kernel", "library"]),              # float32 A: unpacked, then cuBLASLt with the bias
    ("none", 1, np.float16, ["kernel"]),                          # one row: the unpacking GEMV
    ("uint8", 17, np.float16, ["kernel", "library", "kernel"]),  # past one mma tile of rows
])
def test_other_forms_keep_their_paths(zero_points, rows, dtype, want):
    m = _hand_built(zero_points, True, dtype, rows=rows)
    b = grapec.compile(m, targets=[])
    kinds = steps_of(b)
    assert [op for op, _ in kinds] == want and all(p is None for _, p in kinds), kinds


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_count(), reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("block, zero_points", [(32, "none"), (32, "uint8"), (128, "uint8"), (16, "none")])
def test_the_cuda_small_gemm_unpacks_4bit_codes_as_the_spec_says(block, zero_points):
    """2-16 rows against K = 2048 and K = 8192, the generated kernel against the spec in float64 and against the
    CPU backend's SmallGemmKernel.run: A as it lies (the split form), and A from a prologue (the one-tile form)."""
    for rows, k, n, prologue in ((2, GEMV_K, GEMV_N, False), (4, GEMV_K, GEMV_N, True), (9, GEMV_K, GEMV_N, False),
                                 (16, GEMV_K, GEMV_N, False), (4, 4 * GEMV_K, GEMV_N // 2, False),
                                 (16, 4 * GEMV_K, GEMV_N // 2, False), (8, 512, 200, True), (3, 512, 200, False),
                                 (5, 200, 72, False)):   # K past the last whole quad: partial loads, zeros
        m = _hand_built(zero_points, True, np.float16, block=block, rows=rows, k=k, n=n)
        if prologue:
            m = with_prologue(m)
        b = Bundle.from_bytes(grapec.compile(m, targets="auto").to_bytes())
        assert steps_of(b)[0][1] is not None
        x = np.random.default_rng(rows).standard_normal((rows, k)).astype(np.float16)
        got = grapec.load(b, backend="cuda").run({"x": x})["y"].astype(np.float64)
        cpu = grapec.load(b, backend="cpu").run({"x": x})["y"].astype(np.float64)
        xs = x * np.asarray(numpy_helper.to_array(m.graph.initializer[-1])) if prologue else x
        want = numpy_matmul_nbits(m, xs.astype(np.float16))
        assert rel_err(got, want) < 1e-3, (rows, k, rel_err(got, want))
        assert rel_err(got, cpu) < 1e-3, (rows, k, rel_err(got, cpu))
        np.testing.assert_allclose(got, want, atol=4e-3 * np.abs(want).max(), rtol=1e-2, err_msg=f"{rows} x {k}")


def test_a_prologue_is_left_out_where_the_one_tile_grid_would_walk_its_tiles():
    """An LM head's shape (many columns) with A made by a kernel before it: the one-tile form would take that
    kernel as its prologue and walk its column tiles in a grid loop, one tile's codes in flight at a time, so
    for sm_90 it is the split form and the producer stays its own kernel. Fewer columns keep the prologue.
    Both bundles compute the spec's result on the CPU backend."""
    depth, rows = 1024, 4
    wide = with_prologue(_hand_built("uint8", False, np.float16, rows=rows, k=depth, n=16384))
    narrow = with_prologue(_hand_built("uint8", False, np.float16, rows=rows, k=depth, n=4096))
    x = np.random.default_rng(11).standard_normal((rows, depth)).astype(np.float16)
    for m, split in ((wide, True), (narrow, False)):
        b = Bundle.from_bytes(grapec.compile(m, targets=["sm_90"]).to_bytes())
        ks = [kernel_from_json(b.kernels[st.kernel]) for st in b.plans[0].steps if st.op == "kernel"]
        [k] = [k for k in ks if getattr(k, "packed", None) is not None]
        assert k.split == split and (k.prologue is None) == split, k
        assert len(ks) == (2 if split else 1), ks
        got = grapec.load(b, backend="cpu").run({"x": x})["y"].astype(np.float64)
        xs = (x * numpy_helper.to_array(m.graph.initializer[-1])).astype(np.float16)
        assert rel_err(got, numpy_matmul_nbits(m, xs)) < 1e-3
