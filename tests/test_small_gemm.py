"""passes/small_gemm.py: a few-row GEMM against a weight becomes one kernel, with the LayerNorm that
feeds it as prologue and its bias / activation / residual as epilogue; answers unchanged."""
import json

import numpy as np
import pytest
from onnx import helper

import grapec
from grapec.ir.kinds import kernel_from_json
from grapec.ir.small_gemm import SmallGemmKernel
from helpers import compile_and_run, init, model, needs_nvrtc, ort_run, rel_err, tinfo


def gelu_tanh(x: str, out: str) -> list:
    """GELU as GPT-2's exporter spells it: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    n = helper.make_node
    return [n("Pow", [x, "three"], [f"{out}_c"]), n("Mul", [f"{out}_c", "k0"], [f"{out}_d"]),
            n("Add", [x, f"{out}_d"], [f"{out}_e"]), n("Mul", [f"{out}_e", "k1"], [f"{out}_f"]),
            n("Tanh", [f"{out}_f"], [f"{out}_g"]), n("Add", [f"{out}_g", "one"], [f"{out}_h"]),
            n("Mul", [x, f"{out}_h"], [f"{out}_i"]), n("Mul", [f"{out}_i", "half"], [out])]


def block(rows=8, depth=64, cols=48, ln_is_output=False, seed=0):
    """x -> LayerNorm -> MatMul + bias -> GELU -> MatMul + bias + x (a transformer MLP at batch 1).
    rows may be a name (a dim that --dynamic ranges over); the feeds then have 8 rows."""
    rng = np.random.default_rng(seed)
    w = lambda *s: (rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32)  # noqa: E731
    n = helper.make_node
    nodes = [n("LayerNormalization", ["x", "gamma", "beta"], ["h"], axis=-1, epsilon=1e-5),
             n("MatMul", ["h", "w1"], ["u0"]), n("Add", ["u0", "b1"], ["u"]), *gelu_tanh("u", "a"),
             n("MatMul", ["a", "w2"], ["v0"]), n("Add", ["v0", "b2"], ["v"]), n("Add", ["x", "v"], ["y"])]
    outs = [tinfo("y", shape=[1, rows, depth])] + ([tinfo("h", shape=[1, rows, depth])] if ln_is_output else [])
    consts = [init("gamma", 1 + rng.standard_normal(depth).astype(np.float32) / 4),
              init("beta", rng.standard_normal(depth).astype(np.float32) / 4),
              init("w1", w(depth, cols)), init("b1", rng.standard_normal(cols).astype(np.float32) / 4),
              init("w2", w(cols, depth)), init("b2", rng.standard_normal(depth).astype(np.float32) / 4),
              init("three", np.float32(3)), init("k0", np.float32(0.044715)),
              init("k1", np.float32(np.sqrt(2 / np.pi))), init("one", np.float32(1)), init("half", np.float32(0.5))]
    m = model(nodes, [tinfo("x", shape=[1, rows, depth])], outs, consts)
    return m, {"x": rng.standard_normal((1, rows if isinstance(rows, int) else 8, depth)).astype(np.float32)}


def small_gemms(bundle) -> list:
    return [k for k in map(kernel_from_json, bundle.kernels) if isinstance(k, SmallGemmKernel)]


def profile_file(tmp_path, small_gemm_scale=None) -> str:
    """The shipped H100 profile without small_gemm coefficients (so every candidate becomes one,
    prologue and all: these tests are about the kernel, not the choice), or with them scaled."""
    from grapec.cost.device import load_profile
    d = load_profile("h100").to_json()
    if small_gemm_scale is None:
        del d["coefficients"]["small_gemm"]
    else:
        d["coefficients"]["small_gemm"] = {f: c * small_gemm_scale for f, c in d["coefficients"]["small_gemm"].items()}
    path = tmp_path / "profile.json"
    path.write_text(__import__("json").dumps(d))
    return str(path)


@pytest.mark.parametrize("rows,depth,cols,precision", [
    (8, 64, 48, "fp16"),      # GPT-2 at seq 8, in small
    (12, 40, 20, "fp16"),     # rows past 8 (the mma's second row half), K not a multiple of 32, N of 8
    (16, 256, 1000, "fp16"),  # 16 rows; N over many tiles: the grid walks them
    (8, 64, 48, "bf16"),
])
def test_layernorm_and_gemms_are_two_kernels(rows, depth, cols, precision, tmp_path):
    m, feeds = block(rows, depth, cols)
    got, b = compile_and_run(m, feeds, precision=precision, device_profile=profile_file(tmp_path))
    steps = b.plans[0].steps
    # x cast to half (read by the prologue and, as the residual, by the second GEMM's epilogue),
    # LayerNorm + GEMM + bias + GELU, GEMM + bias + residual, then the cast back to fp32; the second
    # GEMM's K (= cols) must be a multiple of 8 (16-byte rows), else it stays with cuBLASLt
    second_op = "kernel" if cols % 8 == 0 else "library"
    assert [st.op for st in steps] == ["kernel", "kernel", second_op, "kernel"], [(st.op, st.origin) for st in steps]
    assert "LayerNormalization_1" in steps[1].origin and "MatMul_2" in steps[1].origin
    assert "Add_14" in steps[2].origin   # the residual, folded behind the bias
    first, *second = small_gemms(b)
    assert first.prologue is not None and all(k.prologue is None for k in second)
    assert first.depth == depth and first.cols == cols and first.rows == rows
    ref = ort_run(m, feeds)["y"]
    unfused, ub = compile_and_run(m, feeds, precision=precision, fusion="rules")
    assert not small_gemms(ub)
    limit = 1e-2 if precision == "fp16" else 3e-2
    assert rel_err(got["y"], ref) < limit, rel_err(got["y"], ref)
    # the same roundings as the unfused plan: only the summation order differs
    assert rel_err(got["y"], unfused["y"]) < limit / 5, rel_err(got["y"], unfused["y"])
    assert np.allclose(got["y"].astype(np.float32), ref, rtol=5e-2, atol=5e-2)


def test_a_layernorm_someone_else_reads_stays_a_kernel(tmp_path):
    m, feeds = block(ln_is_output=True)
    got, b = compile_and_run(m, feeds, precision="fp16", device_profile=profile_file(tmp_path))
    assert all(k.prologue is None for k in small_gemms(b)) and len(small_gemms(b)) == 2
    steps = b.plans[0].steps
    assert all(st.op == "kernel" for st in steps)
    assert any("LayerNormalization_1" in st.origin and "MatMul_2" not in st.origin for st in steps)
    ref = ort_run(m, feeds)
    for name in ref:
        assert rel_err(got[name], ref[name]) < 1e-2


def test_many_rows_and_fp32_stay_with_cublaslt():
    for rows, precision in ((32, "fp16"), (8, "fp32")):
        m, feeds = block(rows=rows)
        got, b = compile_and_run(m, feeds, precision=precision)
        assert not small_gemms(b)
        assert sum(st.op == "library" for st in b.plans[0].steps) == 2
        assert rel_err(got["y"], ort_run(m, feeds)["y"]) < 1e-2


def test_the_cost_model_chooses_between_prologue_kernel_and_cublaslt(tmp_path):
    """GPT-2's shapes at seq 8 (the shipped H100 profile): the LayerNorm becomes the prologue. When
    the profile makes small GEMM kernels expensive, cuBLASLt keeps the GEMMs; `inspect --fusion`
    (the plan report) lists the plans that lost with their estimates."""
    from grapec.cost.device import load_profile
    from grapec.cost.report import plan_report
    m, feeds = block(8, 768, 2304)
    b = grapec.compile(m, shapes={"x": feeds["x"].shape}, targets=[], precision="fp16")
    first = small_gemms(b)[0]
    assert first.prologue is not None and first.cols == 2304
    rows = [r for r in plan_report(b.kernels, b.plans[0], load_profile("h100")) if r["kind"] == "small_gemm"]
    assert rows and all(r["alternatives"] for r in rows)
    assert any("cuBLASLt" in a["scheme"] and a["us"] > rows[0]["us"] for a in rows[0]["alternatives"])
    costly = grapec.compile(m, shapes={"x": feeds["x"].shape}, targets=[], precision="fp16",
                            device_profile=profile_file(tmp_path, small_gemm_scale=10.0))
    assert not small_gemms(costly) and sum(st.op == "library" for st in costly.plans[0].steps) == 2


def test_the_weight_is_stored_once():
    """A [K, N] weight is transposed into the kernel's [N, K]: the original is not kept too."""
    m, feeds = block(depth=256, cols=512)
    fused = grapec.compile(m, shapes={"x": feeds["x"].shape}, targets=[], precision="fp16")
    plain = grapec.compile(m, shapes={"x": feeds["x"].shape}, targets=[], precision="fp16", fusion="rules")
    assert small_gemms(fused)
    assert len(fused.weights) <= len(plain.weights) + 4096, (len(fused.weights), len(plain.weights))


@pytest.mark.parametrize("rows,depth,cols,resident", [(12, 40, 20, False), (8, 256, 64, True)])
def test_cuda_source_compiles_for_sm90(rows, depth, cols, resident, tmp_path):
    """resident: the prologue's LayerNorm holds its row in registers (codegen/resident.py)."""
    needs_nvrtc()
    m, feeds = block(rows, depth, cols)
    b = grapec.compile(m, shapes={"x": feeds["x"].shape}, targets=["sm_90"], precision="fp16",
                       device_profile=profile_file(tmp_path))
    src = b.extra_sections["cuda.source"].decode()
    assert "_prologue(" in src and "mma.sync.aligned.m16n8k16" in src
    assert ("g_rv0[" in src) == resident
    assert "cubin.sm_90" in b.extra_sections


def test_more_rows_take_the_split_form_only_for_sm90(tmp_path):
    """17..128 rows: the split small GEMM (a cluster of blocks dividing K), which needs sm_90's
    thread-block clusters; for an older target the matmuls stay cuBLASLt's. The answers are the same."""
    needs_nvrtc()
    m, feeds = block(64, 256, 512)
    profile = profile_file(tmp_path, small_gemm_scale=0.01)   # priced under cuBLASLt (the pass takes it only priced)
    hopper = grapec.compile(m, shapes={"x": feeds["x"].shape}, targets=["sm_90"], precision="fp16", device_profile=profile)
    ampere = grapec.compile(m, shapes={"x": feeds["x"].shape}, targets=["sm_80"], precision="fp16", device_profile=profile)
    assert len(small_gemms(hopper)) == 2 and not small_gemms(ampere)
    unpriced = grapec.compile(m, shapes={"x": feeds["x"].shape}, targets=["sm_90"], precision="fp16",
                              device_profile=profile_file(tmp_path))
    assert not small_gemms(unpriced)   # a profile that cannot weigh it against cuBLASLt never takes it
    assert all(k.prologue is None for k in small_gemms(hopper))   # A is read as it lies: the LayerNorm stays a kernel
    src = hopper.extra_sections["cuda.source"].decode()
    assert "__cluster_dims__(" in src and "mapa.shared::cluster" in src
    got = grapec.load(hopper, backend="cpu").run(feeds)["y"].astype(np.float32)
    ref = ort_run(m, feeds)["y"]
    assert rel_err(got, ref) < 1e-2, rel_err(got, ref)


@pytest.mark.parametrize("rows", [2, 16])
def test_a_large_weight_with_a_read_as_it_lies_takes_the_staged_split_form(rows, tmp_path):
    """2-16 rows for sm_90: a GEMM whose A comes from memory and whose weight is at least STAGED_SPLIT_MIN_BYTES
    takes the staged split form (a block's 64 columns share A's rows in shared memory); the one with a
    prologue (the LayerNorm) keeps the one-tile form, and so does every GEMM for sm_80. Same answers."""
    needs_nvrtc()
    m, feeds = block(rows, 768, 2304)   # the second weight: 2304 x 768 halves, 3.4 MiB
    shapes = {"x": feeds["x"].shape}
    hopper = grapec.compile(m, shapes=shapes, targets=["sm_90"], precision="fp16", device_profile=profile_file(tmp_path))
    ampere = grapec.compile(m, shapes=shapes, targets=["sm_80"], precision="fp16", device_profile=profile_file(tmp_path))
    assert [(k.prologue is not None, k.split) for k in small_gemms(hopper)] == [(True, False), (False, True)]
    assert not any(k.split for k in small_gemms(ampere))
    assert "__cluster_dims__(" in hopper.extra_sections["cuda.source"].decode()
    got = grapec.load(hopper, backend="cpu").run(feeds)["y"].astype(np.float32)
    ref = ort_run(m, feeds)["y"]
    assert rel_err(got, ref) < 1e-2, rel_err(got, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("rows,depth,cols,precision", [(8, 768, 2304, "fp16"), (12, 40, 20, "fp16"),
                                                       # the staged split form at 2-16 rows (A as it lies)
                                                       (16, 2048, 1024, "fp16"), (3, 8192, 512, "bf16"),
                                                       (16, 256, 1000, "bf16"), (5, 3072, 768, "fp16"),
                                                       # the split form: 8 row tiles, K over clusters of 8
                                                       (128, 768, 3072, "fp16"), (49, 512, 2048, "bf16"),
                                                       (33, 64, 40, "fp16"), (128, 4608, 512, "fp16"),
                                                       # a decode step's rows (passes/gemv.py leaves them here)
                                                       (1, 768, 2304, "fp16"), (2, 768, 3072, "bf16"), (4, 64, 48, "fp16")])
def test_small_gemm_kernels_on_the_gpu_match_the_cpu_backend(rows, depth, cols, precision, tmp_path):
    m, feeds = block(rows, depth, cols, seed=3)
    b = grapec.compile(m, shapes={"x": feeds["x"].shape}, targets=["sm_90"], precision=precision,
                       device_profile=profile_file(tmp_path, small_gemm_scale=0.01 if rows > 16 else None))
    assert len(small_gemms(b)) == (2 if cols % 8 == 0 else 1)
    gpu = grapec.load(b, backend="cuda").run(feeds)["y"].astype(np.float32)
    cpu = grapec.load(b, backend="cpu").run(feeds)["y"].astype(np.float32)
    ref = ort_run(m, feeds)["y"]
    limit = 1e-2 if precision == "fp16" else 3e-2
    assert rel_err(gpu, ref) < limit, rel_err(gpu, ref)
    # the GPU sums in another order than numpy; a handful of values round to the neighbouring fp16
    assert rel_err(gpu, cpu) < limit / 5 and np.abs(gpu - cpu).max() < 0.05 * np.abs(cpu).max(), \
        (rel_err(gpu, cpu), np.abs(gpu - cpu).max())


def _range_of_rows(tmp_path, lo=1, hi=16, depth=256, cols=512):
    """The block over rows lo..hi as one range bundle, every GEMM a one-tile small GEMM."""
    from grapec.compiler import compile_model
    m, _ = block("rows", depth, cols)
    path = tmp_path / "block.onnx"
    __import__("onnx").save(m, str(path))
    b = compile_model(str(path), dynamic={"rows": (lo, hi)}, targets=["sm_90"], precision="fp16",
                      device_profile=profile_file(tmp_path), jobs=1)
    return m, b


def test_small_gemms_of_a_range_share_a_function_with_the_rows_as_argument(tmp_path):
    """codegen/small_gemm.py one_tile_group: the one-tile form of sizes 1..16 rows renders alike but for
    its row count, so each GEMM of the block is one function over the whole range (not one per size),
    its rows the one argument; put back, each kernel's rows give exactly its own text. Fewer functions
    make fewer launch structures (one function per size made every size a structure of its own). Kernels
    whose text differs otherwise stay apart: at 1 row the row index drops out of the prologue and
    epilogue. (Before the few-rows rule of passes/fuse.py compared a row's width, this block's LayerNorm
    stayed unstitched at 5-7 rows, and one GEMM's function covered 12 sizes.)"""
    needs_nvrtc()
    import re
    from grapec.codegen.module import _NUMBER
    from grapec.codegen.small_gemm import render_small_gemm
    m, b = _range_of_rows(tmp_path)
    cuda = b.manifest["cuda"]
    kernels = [(i, kernel_from_json(k)) for i, k in enumerate(b.kernels) if k.get("kind") == "small_gemm"]
    assert {k.rows for _, k in kernels} == set(range(1, 17))
    users = {}
    for i, k in kernels:
        users.setdefault(cuda["kernels"][i], set()).add(k.rows)
    assert len(users) <= 6, users   # 32 kernels, one per GEMM and size
    assert sorted(map(len, users.values()))[-2:] == [15, 15], users   # rows 2..16 of each GEMM
    src = b.extra_sections["cuda.source"].decode()
    for i, k in kernels:
        name = cuda["kernels"][i]
        if len(users[name]) == 1:   # a function of one size keeps its literals
            assert cuda["scalars"][i] == []
            continue
        assert cuda["scalars"][i] == [["i64", k.rows]], cuda["scalars"][i]
        body = re.search(rf'extern "C" __global__ void[^\n]* {name}\(.*?\n}}\n', src, re.S).group(0)
        body = body.replace(", const i64 s0", "").replace("= s0;", f"= {k.rows};")
        own = render_small_gemm(k, name)
        assert body.strip() == own[own.index('extern "C"'):].strip()
    functions = {json.dumps([cuda["kernels"][st.kernel] for st in p.steps if hasattr(st, "kernel")]) for p in b.plans}
    assert len(functions) <= 3, functions


@pytest.mark.gpu
def test_a_range_of_small_gemm_rows_runs_one_function_on_the_gpu(tmp_path):
    """The merged small GEMMs (rows as an argument, read from the size record in a shared exec) give every
    size's answer: 16 sizes in random order, twice, against onnxruntime and the CPU backend."""
    m, b = _range_of_rows(tmp_path)
    gpu, cpu = grapec.load(b, backend="cuda"), grapec.load(b, backend="cpu")
    rng = np.random.default_rng(7)
    for rows in list(rng.permutation(np.arange(1, 17))) * 2:
        x = rng.standard_normal((1, int(rows), 256)).astype(np.float32)
        got = gpu.run({"x": x})["y"].astype(np.float32)
        ref = ort_run(m, {"x": x})["y"]
        mine = cpu.run({"x": x})["y"].astype(np.float32)
        assert rel_err(got, ref) < 1e-2, (rows, rel_err(got, ref))   # the fp16 compile's own bound
        assert np.allclose(got, ref, rtol=5e-2, atol=5e-2), rows
        assert rel_err(got, mine) < 2e-3, (rows, rel_err(got, mine))
    gpu._runner.close()


def test_a_view_that_is_not_its_buffer_in_row_major_order_is_refused():
    from grapec.passes.small_gemm import plain_view
    assert plain_view([0, 0, 64, [1, 1, 64]], 1, 64)
    assert plain_view([0, 128, 64, [2, 2, 64]], 4, 64)          # batches one after another
    assert not plain_view([16, 0, 64, [1, 1, 64]], 1, 64)       # starts past the buffer's start
    assert not plain_view([0, 0, 80, [1, 2, 64]], 2, 64)        # rows 80 apart: padded, not packed
    assert not plain_view([0, 256, 64, [2, 2, 64]], 4, 64)      # a gap between batches
    assert not plain_view([0, 0, 64, [1, 1, 32]], 1, 64)        # another depth



def normed_projection(depth, cols, norm_read_elsewhere=False, seed=0):
    """x [1, 1, depth] -> LayerNorm -> MatMul W [depth, cols]: a decode step's QKV projection; the norm's
    output also a graph output where norm_read_elsewhere (then it cannot be a prologue)."""
    rng = np.random.default_rng(seed)
    n = helper.make_node
    nodes = [n("LayerNormalization", ["x", "gamma", "beta"], ["h"], axis=-1, epsilon=1e-5),
             n("MatMul", ["h", "w"], ["y"])]
    consts = [init("gamma", 1 + rng.standard_normal(depth).astype(np.float32) / 4),
              init("beta", rng.standard_normal(depth).astype(np.float32) / 4),
              init("w", (rng.standard_normal((depth, cols)) / np.sqrt(depth)).astype(np.float32))]
    outs = [tinfo("y", shape=[1, 1, cols])] + ([tinfo("h", shape=[1, 1, depth])] if norm_read_elsewhere else [])
    m = model(nodes, [tinfo("x", shape=[1, 1, depth])], outs, consts)
    return m, {"x": rng.standard_normal((1, 1, depth)).astype(np.float32)}


@pytest.mark.parametrize("cols, read_elsewhere, priced, want", [
    (3072, False, False, "small_gemm"),   # 12 MiB in fp16: the norm as the small GEMM's prologue, one kernel
    (3072, True, False, "gemv"),          # the norm is read elsewhere, no prologue: the gemv reads it faster
    (8192, False, False, "gemv"),         # 32 MiB: the gemv's lead is larger than the norm's own kernel
    (3072, False, True, "gemv"),          # the cost model prices the small GEMM out: the gemv after fusion
])
def test_a_one_row_projection_after_a_norm_takes_it_as_prologue_up_to_a_weight_size(cols, read_elsewhere, priced,
                                                                                    want, tmp_path):
    from grapec.ir.kernel import walk
    m, feeds = normed_projection(2048, cols, read_elsewhere)
    profile = profile_file(tmp_path, small_gemm_scale=100.0 if priced else None)
    got, b = compile_and_run(m, feeds, precision="fp16", device_profile=profile)
    gemms = small_gemms(b)
    steps = [st for st in b.plans[0].steps if "MatMul_2" in st.origin]
    assert len(steps) == 1 and steps[0].op == "kernel", [(st.op, st.origin) for st in b.plans[0].steps]
    if want == "small_gemm":
        assert len(gemms) == 1 and gemms[0].prologue is not None and "LayerNormalization_1" in steps[0].origin
    else:
        assert not gemms and "LayerNormalization_1" not in steps[0].origin   # the norm a kernel before it
        assert any(e.op == "reduce" for e in walk(kernel_from_json(b.kernels[steps[0].kernel]).body))   # the gemv
    ref = ort_run(m, feeds)
    for name in ref:
        assert rel_err(got[name], ref[name]) < 1e-2, (name, rel_err(got[name], ref[name]))
        assert np.allclose(got[name].astype(np.float32), ref[name], rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("depth", [200, 768, 1024, 2304, 5632, 8192, 10240])
def test_the_staged_split_form_multiplies_every_k_once(packed, depth):
    """codegen/small_gemm.py render_staged_split: lane t multiplies k = k0 + STAGED_K at step s (the same text for
    A and the weights). Over a cluster's splits, steps and lanes that covers 0..K-1 once each, every k inside its
    block's staged share of A, with whole quads of steps and the share in static shared memory: in quad s / 4
    lane t holds 32 consecutive k (a packed weight's 16-byte load of codes starts at k0 + 128 q + 32 t). (A
    tiling with 18 steps a split, not whole quads, once left k unmultiplied and read past the share.)"""
    from collections import Counter
    from grapec.codegen.small_gemm import MAX_ROWS, STAGED_K, fits_staged_split, small_gemm_tiling
    from grapec.ir.small_gemm import PackedWeight
    if not fits_staged_split(16, depth, packed):
        pytest.skip(f"K = {depth} is past the staged split form")
    k = SmallGemmKernel((16, 512), "float16", (), 16, 512, depth, None, None,
                        PackedWeight(4, 32, True) if packed else None, split=True)
    t = small_gemm_tiling(k)
    share = t.steps * 32
    assert t.steps % 4 == 0 and MAX_ROWS * (share + 16) * 2 + 16 * 64 * 4 <= 48 * 1024, t
    seen = Counter()
    for s in range(t.steps):
        for lane_t in range(4):
            ka = eval(STAGED_K, {}, {"s": s, "t": lane_t})
            assert 0 <= ka and ka + 8 <= share and ka == (s // 4) * 128 + 32 * lane_t + 8 * (s % 4), (s, lane_t, ka)
            for split in range(t.splits):
                seen.update(range(split * share + ka, split * share + ka + 8))
    assert all(seen[i] == 1 for i in range(depth)), [i for i in range(depth) if seen[i] != 1][:8]
