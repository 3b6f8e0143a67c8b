"""The cost model (cost/), the thread-mapping planner (passes/mappings.py), its report, and
`grapec calibrate`'s fit: on the CPU here; every mapping's GPU code against the CPU backend (gpu)."""
from dataclasses import replace

import numpy as np
import pytest
from onnx import TensorProto, helper

import grapec
from grapec.codegen.launch import candidate_mappings, default_launch, mapped_launch, plan_launch
from grapec.cost.device import DeviceProfile, load_profile
from grapec.cost.fit import fit_coefficients, nonnegative_lstsq, relative_errors
from grapec.cost.model import estimate
from grapec.cost.work import gemm_work, kernel_work
from grapec.errors import InputError
from grapec.ir.kernel import Kernel
from grapec.cost.model import price_mappings
from grapec.plan import KernelStep
from helpers import init, model, rel_err, tinfo


def row_model(rows, cols):
    """LayerNorm, softmax, an argmax and a sum over each row: kernels that stitch row reductions."""
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["ln"], axis=-1),
             helper.make_node("Softmax", ["x"], ["sm"], axis=-1),
             helper.make_node("ArgMax", ["x"], ["am"], axis=-1, keepdims=0),
             helper.make_node("ReduceSum", ["x", "ax"], ["rs"], keepdims=1)]
    rng = np.random.default_rng(1)
    inits = [init("g", rng.standard_normal(cols).astype(np.float32)),
             init("b", rng.standard_normal(cols).astype(np.float32)), init("ax", np.array([-1], np.int64))]
    return model(nodes, [tinfo("x", TensorProto.FLOAT, [rows, cols])],
                 [tinfo(n) for n in ("ln", "sm")] + [tinfo("am", TensorProto.INT64), tinfo("rs")], inits)


def row_kernels(bundle) -> list:
    return [(st, Kernel.from_json(bundle.kernels[st.kernel])) for st in bundle.plans[0].steps
            if isinstance(st, KernelStep) and len(candidate_mappings(Kernel.from_json(bundle.kernels[st.kernel]))) > 1]


def test_mapped_launches_cover_the_rows():
    b = grapec.compile(row_model(24, 300), targets=[])
    ks = row_kernels(b)
    assert len(ks) == 4
    for _, k in ks:
        ms = candidate_mappings(k)
        assert {m[0] for m in ms} >= {"row", "warp"}
        for mode, n in ms:
            launch = mapped_launch(k, mode, n)
            if mode == "row":
                assert (launch.grid, launch.block, launch.rows) == (24, n, 24)
            if mode == "warp":
                assert launch.grid * n >= 24 > (launch.grid - 1) * n and launch.block == 32 * n
        with pytest.raises(ValueError):
            mapped_launch(k, "warp", 3)
        assert plan_launch(replace(k, mapping=("warp", 2))) == mapped_launch(k, "warp", 2)
        assert plan_launch(replace(k, mapping=())) == default_launch(k)


def test_kernel_json_keeps_the_mapping():
    b = grapec.compile(row_model(8, 64), targets=[])
    _, k = row_kernels(b)[0]
    k2 = replace(k, mapping=("row", 512))
    assert Kernel.from_json(k2.to_json()).to_json() == k2.to_json() and Kernel.from_json(k2.to_json()).mapping == ("row", 512)
    assert "mapping" not in replace(k, mapping=()).to_json()


def test_work_counts_what_a_layernorm_reads_and_waits_for():
    b = grapec.compile(row_model(16, 1024), targets=[])
    ln = next(k for st, k in row_kernels(b) if any("LayerNorm" in o or "ln" in o for o in st.origin))
    row = kernel_work(ln, mapped_launch(ln, "row", 256))
    warp = kernel_work(ln, mapped_launch(ln, "warp", 4))
    # x (16 x 1024 float32) read once from DRAM, scale and bias once, the output written once
    assert row.dram_mb == pytest.approx((16 * 1024 * 4 * 2 + 2 * 1024 * 4) / 1e6)
    assert row.cache_mb > 0                       # the mean, variance and normalisation passes re-read x
    assert row.phases == 3 and row.block_syncs == 2 and row.warp_syncs == 0   # mean, then variance
    assert warp.block_syncs == 0 and warp.warp_syncs == 2
    assert warp.serial > row.serial               # 32 lanes stride a row that 256 threads share
    assert row.blocks == 16 and warp.blocks == 4


def test_gemm_work_flags_unaligned_rows():
    assert gemm_work(8, 768, 3072, 1, "float16", lds=(3072, 768, 768)).aligned
    w = gemm_work(512, 399, 1536, 1, "float16", lds=(1536, 399, 399))
    assert not w.aligned and w.gflop == pytest.approx(2 * 512 * 399 * 1536 / 1e9)


def test_fit_recovers_known_coefficients():
    """Times made from known coefficients (plus 2% noise) are fitted back within a few percent."""
    rng = np.random.default_rng(0)
    truth = {"node": 1.3, "phase": 0.5, "block_sync": 0.4, "warp_sync": 0.1, "serial": 0.02,
             "dram_mb": 0.33, "cache_mb": 0.05, "gflop": 15.0}
    prof = DeviceProfile("t", "test", 132, {"kernel": truth})
    samples = []
    for _ in range(300):
        w = kernel_work_like(rng)
        samples.append((w, estimate(w, prof).us * (1 + 0.02 * rng.standard_normal())))
    fitted = fit_coefficients(samples, 132)["kernel"]
    for f in ("node", "phase", "dram_mb", "serial"):
        assert fitted[f] == pytest.approx(truth[f], rel=0.15), f
    assert np.median(relative_errors(samples, {"kernel": fitted}, 132)) < 0.03


def kernel_work_like(rng):
    from grapec.cost.work import Work
    blocks = int(rng.integers(1, 5000))
    return Work("kernel", float(rng.uniform(0, 50)), float(rng.uniform(0, 5)), float(rng.uniform(0, 0.05)),
                float(rng.integers(1, 64)), int(rng.integers(1, 4)), int(rng.integers(0, 3)), int(rng.integers(0, 3)),
                blocks, 256)


def test_nonnegative_lstsq_clamps_what_least_squares_would_make_negative():
    a = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    b = np.array([3.0, 2.0, 1.0])         # unconstrained: slope -1
    x = nonnegative_lstsq(a, b)
    assert x[1] == 0 and x[0] == pytest.approx(2.0)


def test_planner_records_the_cheapest_mapping_and_the_report_shows_the_losers():
    b = grapec.compile(row_model(24, 300), targets=[], device_profile="h100")
    prof = load_profile("h100")
    for _, k in row_kernels(b):
        assert k.mapping, "fusion full: every row kernel's mapping is the planner's"
        best = price_mappings(replace(k, mapping=()), prof)[0]
        assert mapped_launch(k, *k.mapping) == mapped_launch(k, *best[0])
    report = b.manifest["buckets"][0]["fusion_report"]
    priced = [r for r in report if r["alternatives"]]
    assert len(priced) == 4
    for r in priced:
        assert all(a["us"] >= r["us"] for a in r["alternatives"])
        assert r["scheme"] in ("shared memory (block reductions)", "warp shuffle")
    assert b.manifest["buckets"][0]["estimated_us"] == pytest.approx(sum(r["us"] for r in report), abs=0.2)
    rules = grapec.compile(row_model(24, 300), targets=[], fusion="rules")
    assert all(not k.mapping for _, k in row_kernels(rules))


def test_unknown_profile_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        load_profile("a100-nope")
    bad = tmp_path / "p.json"
    bad.write_text("{}")
    with pytest.raises(InputError, match="not a profile"):
        load_profile(str(bad))


def one_sample(m) -> dict:
    """One calibration sample for the calibration model's float inputs: these tests are about its plan,
    and four CPU runs of it in each precision (the default calibration) took most of a minute."""
    from onnx.helper import tensor_dtype_to_np_dtype
    from grapec.bundle.inputs import random_inputs
    shapes = {i.name: tuple(d.dim_value for d in i.type.tensor_type.shape.dim) for i in m.graph.input}
    dtypes = {i.name: tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type).name for i in m.graph.input}
    return random_inputs(shapes, dtypes, {}, seed=0)


@pytest.fixture(scope="module")
def calibration_bundle() -> bytes:
    """`grapec calibrate`'s model compiled as it compiles it (fp16, small_gemm unpriced): two tests read
    it, each from its own copy (the compile's fp16 calibration is 20 s of this suite)."""
    from grapec.tools.calibrate import unpriced_profile
    from grapec.cost.suite import calibration_model
    return grapec.compile(calibration_model(), precision="fp16", targets=[], device_profile=unpriced_profile(),
                          calibration_inputs=[one_sample(calibration_model())]).to_bytes()


def test_calibration_model_compiles_and_every_step_is_priced(calibration_bundle):
    from grapec.bundle.format import Bundle
    from grapec.tools.calibrate import add_mapping_variants, fit_profile
    from grapec.cost.suite import sdpa_calibration_model
    from grapec.cost.work import step_work
    b = Bundle.from_bytes(calibration_bundle)
    before = len(b.plans[0].steps)
    added = add_mapping_variants(b)
    plan = b.plans[0]
    works = [step_work(b.kernels, plan, st) for st in plan.steps]
    kinds = {w.kind for w in works if w}
    assert kinds == {"kernel", "gemm", "attention", "small_gemm"} and all(works)
    sdpa = grapec.compile(sdpa_calibration_model(), precision="fp16", targets=[], attention="cudnn",
                          calibration_inputs=[one_sample(sdpa_calibration_model())])
    sdpa_works = [step_work(sdpa.kernels, sdpa.plans[0], st) for st in sdpa.plans[0].steps]
    assert [w.kind for w in sdpa_works].count("sdpa") == 7, "every attention of the SDPA suite is cuDNN's"
    works += [w for w in sdpa_works if w.kind == "sdpa"]   # the rest are input casts
    kinds.add("sdpa")
    assert added > 50 and len(plan.steps) == before + added
    assert any(not w.aligned for w in works if w.kind == "gemm")
    # a fit to times the provisional profile predicts, perturbed, comes back close
    prof = load_profile("h100")
    rng = np.random.default_rng(3)
    samples = [(w, estimate(w, prof).us * (1 + 0.05 * rng.standard_normal())) for w in works]
    fitted = fit_profile("NVIDIA H100 80GB HBM3", 132, samples)
    assert fitted.name == "h100" and set(fitted.measured["fit"]) == kinds
    assert all(v["median_error"] < 0.1 for v in fitted.measured["fit"].values())


def test_inspect_fusion_shows_groups_and_alternatives(tmp_path):
    from click.testing import CliRunner
    from grapec.tools.cli import main
    path = tmp_path / "m.onnx"
    import onnx
    onnx.save(row_model(24, 300), path)
    r = CliRunner().invoke(main, ["compile", str(path), "-o", str(tmp_path / "m.grape"), "--no-gpu", "-q"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["inspect", str(tmp_path / "m.grape"), "--fusion"])
    assert r.exit_code == 0, r.output
    assert "estimated" in r.output and "lost:" in r.output and "warp" in r.output
    r = CliRunner().invoke(main, ["compile", str(path), "-o", str(tmp_path / "x.grape"), "--no-gpu", "-q",
                                  "--device-profile", "nope"])
    assert r.exit_code == 2 and "device profile 'nope'" in r.output


@pytest.mark.gpu
def test_every_mapping_computes_the_same_on_the_gpu():
    """Each candidate mapping of each row kernel, built for the GPU, against the CPU backend."""
    from grapec.codegen.build import build_gpu_code
    rng = np.random.default_rng(7)
    for rows, cols in ((1, 4000), (24, 300), (700, 96)):
        base = grapec.compile(row_model(rows, cols))
        x = {"x": rng.standard_normal((rows, cols)).astype(np.float32)}
        ref = grapec.load(base, backend="cpu").run(x)
        mappings = {m for _, k in row_kernels(base) for m in candidate_mappings(replace(k, mapping=()))}
        for m in sorted(mappings):
            b = grapec.compile(row_model(rows, cols))
            for st in b.plans[0].steps:
                if isinstance(st, KernelStep):
                    k = Kernel.from_json(b.kernels[st.kernel])
                    if m in candidate_mappings(replace(k, mapping=())):
                        b.kernels[st.kernel] = replace(k, mapping=m).to_json()
            sections, entry = build_gpu_code(b.kernels, b.plans, b.manifest["targets"])
            b.extra_sections.update(sections)
            b.manifest["cuda"] = entry
            got = grapec.load(b, backend="cuda").run(x)
            for name in ref:
                if ref[name].dtype == np.int64:
                    assert np.array_equal(got[name], ref[name]), (rows, cols, m, name)
                else:
                    assert rel_err(got[name], ref[name]) < 1e-5, (rows, cols, m, name)


def test_bench_takes_a_device_profile_and_refuses_without_a_gpu(tmp_path):
    """Every option reaches the command (a signature mismatch is an internal error, exit 1)."""
    from click.testing import CliRunner
    from grapec.tools.cli import main
    from grapec.runtime.devices import gpu_count
    if gpu_count():
        pytest.skip("this checks the no-GPU message")
    import onnx
    onnx.save(row_model(4, 64), tmp_path / "m.onnx")
    r = CliRunner().invoke(main, ["bench", str(tmp_path / "m.onnx"), "--device-profile", "h100"])
    assert r.exit_code == 2 and "needs an NVIDIA GPU" in r.output, r.output


@pytest.mark.no_round_trip("the calibration model again, as in test_calibration_model_compiles_and_every_step_is_priced, "
                            "whose bundle the round trip runs (13 s on the CPU interpreter)")
def test_calibration_builds_every_small_gemm_candidate(calibration_bundle):
    """`grapec calibrate` compiles its model with small_gemm left unpriced, so both sides of that
    choice are sampled whatever the shipped profile would choose (calibrate.py)."""
    from grapec.bundle.format import Bundle
    from grapec.cost.suite import GEMMS, LN_GEMMS, SMALL_M_LIBRARY
    b = Bundle.from_bytes(calibration_bundle)
    kinds = [b.kernels[st.kernel].get("kind") for st in b.plans[0].steps if st.op == "kernel"]
    from grapec.passes.gemv import GEMV_OVER_SMALL_GEMM_BYTES
    # every GEMM of up to 16 rows against a weight, but one row against a large weight (a gemv kernel)
    against_weights = [g for g in GEMMS if g[0] <= 16 and not (g[0] == 1 and 2 * g[1] * g[2] >= GEMV_OVER_SMALL_GEMM_BYTES)]
    assert len(against_weights) < len([g for g in GEMMS if g[0] <= 16])
    assert kinds.count("small_gemm") == len(against_weights) + len(LN_GEMMS)
    assert sum(st.op == "library" and b.plans[0].buffers[st.out].shape[0] <= 16 for st in b.plans[0].steps) \
        >= len(SMALL_M_LIBRARY)
