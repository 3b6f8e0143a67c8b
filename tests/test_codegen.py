"""CUDA C generation, checked without a GPU: the generated source compiles for sm_90 where nvcc is
present, and the same source compiled for the host runs every zoo model's plan to the same
answer as the numpy interpreter."""
import os
import shutil
import subprocess

import numpy as np
import pytest

import grapec
from grapec.codegen.module import build_module, kernel_users
from grapec.ir.kernel import Kernel
from grapec.bundle.inputs import bundle_inputs
from grapec.ir.interpret import run_kernel
from grapec.runtime.cpu.runner import CpuPlanRunner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ZOO = {"gpt2": {"batch": 1, "seq": 8}, "bert": {"batch": 2, "seq": 8}, "googlenet": {"batch": 1},
       "resnet50": {"batch": 1}, "wav2vec2": {"batch": 1, "samples": 1600}}


class HostCodegenRunner(CpuPlanRunner):
    """The CPU plan runner, with every kernel step run by host-compiled generated CUDA C, and each
    result also checked against the numpy interpreter on the same inputs."""

    def __init__(self, bundle, tmpdir, sized_extra_blocks=None):
        super().__init__(bundle)
        from grapec.codegen.host import HostModule
        # the bundle's own module: kernels of different buckets share functions with size arguments
        self.module = build_module(self.kernels, kernel_users(bundle.plans, len(self.kernels)))
        self.host = HostModule(self.kernels, str(tmpdir), self.module, sized_extra_blocks)
        self.guarded = sized_extra_blocks is not None
        self.half = bundle.manifest.get("precision") in ("fp16", "bf16")
        self.worst = 0.0

    def exec_steps(self, steps, v, progress=None):
        for st in steps:
            if st.op != "kernel":
                super().exec_steps([st], v, progress)
                continue
            k = self.kernels[st.kernel]
            ins = [v[a] for a in st.args]
            ref = run_kernel(k, ins)
            out = v[st.out]
            if self.guarded:   # the output followed by guard bytes that no block may touch
                flat = np.full(out.size + 4096, 0x5A, np.uint8).view(np.uint8) if out.dtype.itemsize == 1 else \
                    np.frombuffer(np.full((out.size + 4096) * out.dtype.itemsize, 0x5A, np.uint8), out.dtype).copy()
                view = flat[:out.size].reshape(out.shape)
                self.host.call(st.kernel, view, ins)
                assert (flat[out.size:].view(np.uint8) == 0x5A).all(), ("a block wrote past its output", st.origin)
                out[...] = view
            else:
                self.host.call(st.kernel, out, ins)
            if ref.dtype.kind in "fV" and ref.dtype != np.float64:   # 8- and 4-bit floats compare as float32
                out, ref = out.astype(np.float32), ref.astype(np.float32)
            if ref.dtype.kind == "f":
                finite = np.isfinite(ref)   # NaN and inf must come out where they do in the reference
                np.testing.assert_array_equal(out[~finite], ref[~finite], err_msg=str(st.origin))
                out, ref = out[finite], ref[finite]
                err = float(np.max(np.abs(out.astype(np.float64) - ref), initial=0) / (np.max(np.abs(ref), initial=0) + 1e-6))
                self.worst = max(self.worst, err)
                # a value rounded to half (stored so, or cast on the way) moves to its neighbour where the
                # sums' order moves it across a rounding boundary: one ulp, 2^-11 of it, at most 2^-10 of the largest
                assert err < (2 ** -10 if self.half else 1e-4), (st.origin, err)
            else:
                np.testing.assert_array_equal(out, ref, err_msg=str(st.origin))


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to compile generated code for the host")
@pytest.mark.parametrize("name", sorted(ZOO))
def test_generated_cuda_c_matches_interpreter_on_host(name, tmp_path):
    b = grapec.compile(os.path.join(ROOT, "models", "tiny", f"{name}.onnx"), dims=ZOO[name])
    runner = HostCodegenRunner(b, tmp_path)
    runner.run(0, bucket_feeds(b, 0, 3))


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to compile generated code for the host")
def test_elements_per_thread_match_the_interpreter_on_host(tmp_path, monkeypatch):
    """Every element kernel at 4 elements a thread (off by default; when on, only kernels of a
    million elements or more): the unrolled loop covers each element once, tails included."""
    from grapec.codegen import launch
    monkeypatch.setattr(launch, "ELEMENTS_PER_THREAD_FROM", 1)
    monkeypatch.setattr(launch, "ELEMENTS_PER_THREAD", 4)
    b = grapec.compile(os.path.join(ROOT, "models", "tiny", "bert.onnx"), dims={"batch": 1, "seq": 7})
    runner = HostCodegenRunner(b, tmp_path)
    assert any(la.per_thread > 1 for la in runner.module.launches)
    assert any(k.size % launch.ELEMENTS_PER_THREAD for k, la in zip(runner.kernels, runner.module.launches)
               if la.per_thread > 1), "a kernel with a tail"
    runner.run(0, bucket_feeds(b, 0, 5))


def bucket_feeds(b, bucket, seed):
    return bundle_inputs(b.manifest, bucket, seed)


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to compile generated code for the host")
@pytest.mark.parametrize("name,buckets", [("gpt2", [{"seq": 8}, {"seq": 13}, {"seq": 32}]),
                                          ("wav2vec2", [{"samples": 1600}, {"samples": 2400}])])
def test_buckets_share_functions_with_sizes_as_arguments(name, buckets, tmp_path):
    """Kernels that differ only in sizes become one function per kernel, whatever the bucket count;
    the shared code, given each bucket's sizes, computes what the interpreter does."""
    path = os.path.join(ROOT, "models", "tiny", f"{name}.onnx")
    # fusion "rules": the fixed mapping rules. Under "full" the cost model may give a kernel another
    # thread mapping in another bucket, and kernels mapped differently are different functions.
    one = grapec.compile(path, dims={"batch": 1, **buckets[0]}, targets=[], fusion="rules")
    many = grapec.compile(path, dims={"batch": 1}, bucket_dims=buckets, targets=[], fusion="rules")
    single = build_module(one.kernels, kernel_users(one.plans, len(one.kernels)))
    assert not any(single.scalars), "one bucket: sizes stay literals"
    runner = HostCodegenRunner(many, tmp_path)
    functions = [n for n in runner.module.body_of if not n.endswith("_sized")]   # sized twins aside
    assert len(functions) <= len(single.bodies)   # more buckets, no more functions
    assert sum(1 for s in runner.module.scalars if s) >= len(buckets) * len(single.bodies) // 2
    if name == "wav2vec2":   # a remainder by a size argument: g_imod (codegen/module.py _size_divisions), run below
        assert "g_imod(" in runner.host.source and "% ((long long)s" not in runner.host.source
    for bucket in range(len(buckets)):
        outs = runner.run(bucket, bucket_feeds(many, bucket, 5 + bucket))
        ref = CpuPlanRunner(many).run(bucket, bucket_feeds(many, bucket, 5 + bucket))
        for k in ref:   # norm-wise: the C loops and numpy sum in different orders
            assert np.linalg.norm(outs[k] - ref[k]) <= 1e-5 * np.linalg.norm(ref[k]), (bucket, k)


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to compile generated code for the host")
def test_sized_twins_read_their_sizes_from_memory_and_skip_blocks_past_their_grid(tmp_path):
    """Each merged function's twin (codegen/module.py sized_twin) takes its sizes and grid from a
    record instead of by value; run over 7 blocks more than each launch needs, as a node sized for a
    larger size of its structure runs, every bucket still computes what the interpreter does."""
    path = os.path.join(ROOT, "models", "tiny", "gpt2.onnx")
    many = grapec.compile(path, dims={"batch": 1}, bucket_dims=[{"seq": 9}, {"seq": 13}, {"seq": 20}], targets=[])
    runner = HostCodegenRunner(many, tmp_path, sized_extra_blocks=7)
    assert runner.module.sized and "_sized(" in runner.host.source
    assert len([n for n in runner.module.names if n in runner.module.sized]) >= len(runner.module.names) // 3
    for bucket in range(3):
        outs = runner.run(bucket, bucket_feeds(many, bucket, 7 + bucket))
        ref = CpuPlanRunner(many).run(bucket, bucket_feeds(many, bucket, 7 + bucket))
        for k in ref:
            assert np.linalg.norm(outs[k] - ref[k]) <= 1e-5 * np.linalg.norm(ref[k]), (bucket, k)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc to check the CUDA source compiles for sm_90")
def test_generated_cuda_c_compiles_for_sm90(tmp_path):
    kernels = []
    for name, dims in ZOO.items():
        b = grapec.compile(os.path.join(ROOT, "models", "tiny", f"{name}.onnx"), dims=dims)
        kernels += [Kernel.from_json(k) for k in b.kernels]
    src = build_module(kernels).source
    cu = tmp_path / "zoo.cu"
    cu.write_text(src)
    r = subprocess.run(["nvcc", "-cubin", "-arch=sm_90", "-diag-suppress", "177", "-o", str(tmp_path / "zoo.cubin"), str(cu)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[:3000]


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to compile generated code for the host")
def test_value_hoisted_out_of_a_reduction_is_declared_before_the_loop(tmp_path):
    """log(sum(exp(x - m))) + m: `m` is first reached inside the loop but used after it."""
    from onnx import helper
    from helpers import model, tinfo
    from grapec.bundle.format import Bundle
    m = model([helper.make_node("ReduceLogSumExp", ["x"], ["y"], keepdims=0, axes=[1])],
              [tinfo("x", shape=[4, 16])], [tinfo("y")], opset=13)
    b = grapec.compile(m)
    runner = HostCodegenRunner(Bundle.from_bytes(b.to_bytes()), tmp_path)
    x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    out = runner.run(0, {"x": x})["y"]
    np.testing.assert_allclose(out, np.log(np.exp(x).sum(1)), rtol=1e-5)


def test_compile_builds_cubin_and_ptx_without_a_gpu():
    pytest.importorskip("cuda.bindings.nvrtc", reason="needs NVRTC (pip install cuda-bindings nvidia-cuda-nvrtc)")
    from grapec.bundle.format import Bundle
    compiled = grapec.compile(os.path.join(ROOT, "models", "tiny", "gpt2.onnx"), dims=ZOO["gpt2"], targets=["sm_90"])
    data = compiled.to_bytes()
    b = Bundle.from_bytes(data)
    # the code sections are stored zlib-compressed (PTX and CUDA C are text) and read back byte for byte
    code = {s["name"]: s for s in b.manifest["sections"] if s["name"] in compiled.extra_sections}
    assert set(code) == {"cubin.sm_90", "ptx.compute_90", "cuda.source"}
    assert all(s["compression"] == "zlib" for s in code.values())
    assert all(bytes(b.extra_sections[n]) == bytes(compiled.extra_sections[n]) for n in code)
    assert sum(s["size"] for s in code.values()) < sum(len(compiled.extra_sections[n]) for n in code) / 2
    assert b.extra_sections["cubin.sm_90"][:4] == b"\x7fELF"
    assert b".target sm_90" in b.extra_sections["ptx.compute_90"][:2000]
    cuda = b.manifest["cuda"]
    assert len(cuda["kernels"]) == len(b.kernels) and cuda["targets"] == ["sm_90"]
    src = b.extra_sections["cuda.source"].decode()
    assert all(f"void {n}(" in src for n in cuda["kernels"])


def layer_norm_model(rows: int, cols: int, seed: int = 0):
    """x + LayerNorm(x) over rows of `cols`: the row is read by two reductions and by its columns."""
    from onnx import helper
    from helpers import init, model, tinfo
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["n"], axis=-1, epsilon=1e-5),
             helper.make_node("Add", ["x", "n"], ["y"])]
    m = model(nodes, [tinfo("x", shape=[rows, cols])], [tinfo("y")],
              [init("g", 1 + rng.standard_normal(cols).astype(np.float32) / 4),
               init("b", rng.standard_normal(cols).astype(np.float32) / 4)])
    return m, {"x": (3 + rng.standard_normal((rows, cols))).astype(np.float32)}


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to compile generated code for the host")
@pytest.mark.parametrize("cols,precision,resident", [
    (768, "fp16", True),     # GPT-2's rows, read as float32 and cast: 4 elements a step, 6 steps
    (1024, "fp32", True),    # 8 steps, the most held
    (256, "fp32", True),
    (1152, "fp32", False),   # 9 steps: read from memory as before
    (776, "fp16", False),    # not whole steps a lane
])
def test_a_short_row_is_read_once_into_registers(cols, precision, resident, tmp_path):
    """codegen/resident.py: a warp-per-row LayerNorm keeps its row (and the weights along it) in
    registers, where it fits; host-compiled, it computes what the interpreter does, kept or not."""
    from grapec.bundle.format import Bundle
    m, feeds = layer_norm_model(300, cols)   # 300 rows: a warp per row (codegen/launch.py)
    b = Bundle.from_bytes(grapec.compile(m, precision=precision).to_bytes())
    runner = HostCodegenRunner(b, tmp_path)
    assert any(la.mode == "warp" for la in runner.module.launches)
    assert ("g_rv0[" in runner.module.source) == resident
    x = feeds["x"]
    out = runner.run(0, feeds)["y"].astype(np.float64)
    mean, var = x.mean(1, keepdims=True), x.var(1, keepdims=True)
    g, b_ = (np.asarray(helper_init(m, n)) for n in ("g", "b"))
    ref = x + (x - mean) / np.sqrt(var + 1e-5) * g + b_
    assert np.abs(out - ref).max() < (0.05 if precision == "fp16" else 1e-4) * np.abs(ref).max()


def test_rows_held_in_registers_stay_literal_sized_when_buckets_share_a_function():
    """Softmax rows of 256 and 512 held in registers (2 and 4 vectors a lane) in two buckets: their
    kernels differ only in numbers, but the register arrays' length must stay a literal, not become the
    shared function's parameter (NVRTC: "expression must have a constant value"; seen at batch 1:64 x
    seq 1:512 of GPT-2). The module compiles for sm_90."""
    import re
    from onnx import helper
    from helpers import model, tinfo
    m = model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], [tinfo("x", shape=[300, "n"])], [tinfo("y")])
    b = grapec.compile(m, dims={}, bucket_dims=[{"n": 256}, {"n": 512}], targets=["sm_90"], fusion="rules")
    module = build_module(b.kernels, kernel_users(b.plans, len(b.kernels)))
    held = re.findall(r"g_rv\d+\[\((\w+) \* 32 / G_WARP\)\]", module.source)
    assert sorted(set(held)) == ["2u", "4u"], held
    assert b.extra_sections["cubin.sm_90"][:4] == b"\x7fELF"


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to compile generated code for the host")
def test_a_kernel_of_several_buckets_holds_rows_in_all_or_none(tmp_path):
    """Softmax rows of 68 and 256: only 256 is whole 128-element steps (codegen/resident.py). Rendered
    each its own way they would be two functions, and a range's sizes of one launch structure, stored as
    formulas, could not name theirs; one function runs both, and computes what numpy does."""
    from onnx import helper
    from helpers import model, tinfo
    from grapec.bundle.format import Bundle
    m = model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], [tinfo("x", shape=[300, "n"])], [tinfo("y")])
    b = Bundle.from_bytes(grapec.compile(m, dims={}, bucket_dims=[{"n": 68}, {"n": 256}], targets=[],
                                         fusion="rules").to_bytes())
    runner = HostCodegenRunner(b, tmp_path)
    assert "g_rv0[" not in runner.module.source
    assert len({runner.module.names[k] for k in range(len(b.kernels))}) == 1
    alone = build_module(grapec.compile(m, dims={"n": 256}, targets=[], fusion="rules").kernels)
    assert "g_rv0[" in alone.source   # a bundle of one size still holds its rows
    rng = np.random.default_rng(4)
    for bucket, n in enumerate((68, 256)):
        x = rng.standard_normal((300, n)).astype(np.float32)
        y = runner.run(bucket, {"x": x})["y"]
        e = np.exp(x - x.max(1, keepdims=True))
        ref = e / e.sum(1, keepdims=True)
        assert np.abs(y - ref).max() < 1e-5, (n, np.abs(y - ref).max())


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to compile generated code for the host")
def test_a_kernel_of_several_buckets_reads_rows_in_vectors_in_all_or_none(tmp_path):
    """Softmax rows of 68 floats are read in 16-byte vectors, rows of 70 are not (codegen/cuda.py): two
    functions for one launch structure (Wav2Vec2's GroupNorm over 516 and 519 frames: 169 sizes of a range
    stored plan by plan). Both now read element by element in one function, and compute what numpy does;
    a bundle of one size still reads vectors."""
    from onnx import helper
    from helpers import model, tinfo
    from grapec.bundle.format import Bundle
    m = model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], [tinfo("x", shape=[300, "n"])], [tinfo("y")])
    b = Bundle.from_bytes(grapec.compile(m, dims={}, bucket_dims=[{"n": 68}, {"n": 70}], targets=[],
                                         fusion="rules").to_bytes())
    runner = HostCodegenRunner(b, tmp_path)
    assert "uint4" not in runner.module.source.split("extern")[-1]
    assert len({runner.module.names[k] for k in range(len(b.kernels))}) == 1
    alone = build_module(grapec.compile(m, dims={"n": 68}, targets=[], fusion="rules").kernels)
    assert "*(const uint4*)(in0" in alone.source
    rng = np.random.default_rng(5)
    for bucket, n in enumerate((68, 70)):
        x = rng.standard_normal((300, n)).astype(np.float32)
        y = runner.run(bucket, {"x": x})["y"]
        e = np.exp(x - x.max(1, keepdims=True))
        assert np.abs(y - e / e.sum(1, keepdims=True)).max() < 1e-5, n


def test_kernels_rendered_over_processes_give_the_same_module():
    """A range bundle's kernels are rendered over the compile's processes (compiler/fanout.py map_forked),
    a chunk at a time: the module (functions, which kernel runs which, its size arguments, its launches)
    is the one rendered in order in this process."""
    from functools import partial
    from grapec.compiler.fanout import map_forked
    b = grapec.compile(os.path.join(ROOT, "models", "tiny", "gpt2.onnx"), dims={"batch": 1},
                       bucket_dims=[{"seq": n} for n in (5, 8, 13, 21, 34)], targets=[])
    users = kernel_users(b.plans, len(b.kernels))
    here = build_module(b.kernels, users)
    forked = build_module(b.kernels, users, partial(map_forked, jobs=2, chunk=3))
    assert len(b.kernels) > 3 * 3   # several chunks
    assert forked.source == here.source and forked.names == here.names and forked.scalars == here.scalars
    assert [la.to_json() for la in forked.launches] == [la.to_json() for la in here.launches]


def test_the_objects_of_a_range_compile_stay_frozen_only_while_it_runs():
    """compiler/fanout.py frozen_heap keeps the objects alive at its entry out of every garbage collection
    (a forked worker's would copy every page it shares with the parent) until the outermost one exits: a
    range compile holds one around its rounds, and each round's fork takes one of its own, which must not
    thaw the range's."""
    import gc
    from grapec.compiler.fanout import frozen_heap, map_forked
    assert gc.get_freeze_count() == 0
    with frozen_heap():
        outer = gc.get_freeze_count()
        assert outer > 0
        xs = list(range(-2000, 2000))
        assert map_forked(abs, xs, jobs=2, chunk=512) == [abs(x) for x in xs]
        assert gc.get_freeze_count() >= outer
    assert gc.get_freeze_count() == 0


def helper_init(m, name):
    from onnx import numpy_helper
    return next(numpy_helper.to_array(t) for t in m.graph.initializer if t.name == name)


@pytest.mark.gpu
@pytest.mark.parametrize("cols,precision", [(768, "fp16"), (1024, "fp32"), (256, "bf16"), (1152, "fp32")])
def test_rows_held_in_registers_on_the_gpu(cols, precision):
    """The same LayerNorm on the GPU, rows held (768, 1024, 256) or not (1152), against onnxruntime."""
    from helpers import ort_run, rel_err
    m, feeds = layer_norm_model(300, cols, seed=5)
    b = grapec.compile(m, precision=precision, targets=["sm_90"])
    got = grapec.load(b, backend="cuda").run(feeds)["y"]
    ref = ort_run(m, feeds)["y"]
    limit = {"fp32": 1e-5, "fp16": 2e-3, "bf16": 1e-2}[precision]
    assert rel_err(got, ref) < limit, rel_err(got, ref)
    assert np.abs(got - ref).max() < 20 * limit * np.abs(ref).max()


def test_numbered_names_never_take_a_prelude_type_name():
    """The renderer numbers its variables with one counter for every prefix: the 16th name with prefix
    "f" was `f16`, the prelude's half type, and NVRTC refused the kernel ("variable f16 is not a type
    name": GPT-2's decode step with its LayerNorm as a small GEMM's prologue)."""
    from grapec.codegen.cuda import RESERVED_NAMES, CudaRenderer
    from grapec.ir import kernel as K
    r = CudaRenderer(Kernel((4,), "float32", K.load(0, (K.idx(0),), "float32"), (((4,), "float32"),)))
    names = [r.fresh(p) for _ in range(40) for p in ("f", "i", "bf")]
    assert not RESERVED_NAMES & set(names)
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("jobs", [1, 2])
def test_each_compiled_bucket_is_handed_over_as_it_comes_in(jobs):
    """compiler/fanout.py map_buckets calls `each(i, result)` for every item, in order, as its result comes
    in (a range compile makes each size's document then, while the workers go on), with the result it
    returns; in the parent process, so what `each` records stays."""
    import os
    from types import SimpleNamespace
    from grapec.compiler.fanout import map_buckets
    from grapec.passes.build_plan import KernelStore, WeightStore
    from grapec.plan import Plan

    def compile_one(item, weights, kernels):
        return SimpleNamespace(plan=Plan([], [], [], [], 0), item=item, pid=os.getpid())
    seen = []
    items = [f"size{k}" for k in range(9)]
    out = map_buckets(compile_one, items, WeightStore(), KernelStore(), jobs,
                      each=lambda i, r: seen.append((i, r.item, os.getpid())))
    assert [r.item for r in out] == items
    assert seen == [(i, it, os.getpid()) for i, it in enumerate(items)]
    assert (len({r.pid for r in out}) > 1) == (jobs > 1)   # the workers compiled them, here handed over


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to compile generated code for the host")
def test_a_division_by_a_size_argument_keeps_cs_answer_everywhere(tmp_path):
    """g_idiv / g_imod (codegen/prelude.py), which merged functions use where a size argument took a
    constant's place: 32-bit where both sides are in [0, 2^31), and C's truncating answer at any sign and
    width, the edges of the 32-bit path included."""
    import ctypes
    from grapec.codegen.host import HOST_SHIM
    from grapec.codegen.module import _merge
    from grapec.codegen.prelude import COMMON, TYPES
    a = 'extern "C" __global__ void k(long long* out) {\n  const long long v2 = (i2 % ((long long)75LL));\n' \
        '  const long long v3 = (v2 / ((long long)75LL));\n}\n'
    body = _merge([a, a.replace("75LL", "80LL")])[0]
    assert "g_imod(i2, s0)" in body and "g_idiv(v2, s0)" in body and "((long long)s0)" not in body
    src = tmp_path / "divide.cpp"
    src.write_text(HOST_SHIM + TYPES + COMMON + r"""
extern "C" void divide(const long long* a, const long long* b, long long n, long long* q, long long* r) {
  for (long long i = 0; i < n; ++i) { q[i] = g_idiv(a[i], b[i]); r[i] = g_imod(a[i], b[i]); }
}
""")
    lib = tmp_path / "divide.so"
    subprocess.run(["g++", "-O2", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True, capture_output=True)
    rng = np.random.default_rng(8)
    edge = [0, 1, 2, 2 ** 31 - 2, 2 ** 31 - 1, 2 ** 31, 2 ** 32 - 1, 2 ** 32, 2 ** 40 + 3]
    a = np.array(edge + [-e for e in edge[1:]] + list(rng.integers(-2 ** 40, 2 ** 40, 200))
                 + list(rng.integers(0, 2 ** 31, 200)), np.int64)
    b = np.array(list(rng.choice([1, 3, 75, 2 ** 31 - 1, 2 ** 31, 2 ** 33 + 1, -7, -(2 ** 31)], len(a) - 200))
                 + list(rng.integers(1, 2 ** 31, 200)), np.int64)
    q, r = np.empty_like(a), np.empty_like(a)
    fn = ctypes.CDLL(str(lib)).divide
    p = ctypes.POINTER(ctypes.c_longlong)
    fn.argtypes = [p, p, ctypes.c_longlong, p, p]
    fn(a.ctypes.data_as(p), b.ctypes.data_as(p), len(a), q.ctypes.data_as(p), r.ctypes.data_as(p))
    for x, y, got_q, got_r in zip(a.tolist(), b.tolist(), q.tolist(), r.tolist()):
        want_q = abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1)   # C truncates toward zero
        assert (got_q, got_r) == (want_q, x - want_q * y), (x, y)
