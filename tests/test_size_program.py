"""A size record computed from a range's formulas (codegen/size_program.py): the program gives what the
formulas give (bundle/formulas.py NumberFit.numbers), evaluated in Python, by the same C text compiled
with the host's C compiler, and by the loader kernel itself, run on host threads (one per CUDA thread) and
on the GPU; the loader compiles with NVRTC."""
import ctypes
import os
import shutil
import subprocess

import numpy as np
import pytest

from grapec.bundle.format import Bundle
from grapec.codegen.size_program import EVAL_SIZES, SIZE_PROGRAM, run_size_program, size_program
from grapec.compiler import compile_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
W2V = os.path.join(ROOT, "models", "tiny", "wav2vec2.onnx")


@pytest.fixture(scope="module")
def families():
    """Tiny Wav2Vec2 over samples 1600..4000, written and read: its families' formulas take the floors
    of the samples (strided convolutions' frames) and round-ups of them."""
    b = compile_model(W2V, dims={"batch": 1}, dynamic={"samples": (1600, 4000)}, targets=[], jobs=2)
    fams = Bundle.from_bytes(b.to_bytes()).plans.docs.families
    assert fams and any(f.plan.fit.extra for f in fams)
    return fams


def _members(f, n=24, seed=0):
    rng = np.random.default_rng(seed)
    pick = {0, len(f.sizes) - 1} | {int(i) for i in rng.integers(0, len(f.sizes), n)}
    return f.sizes[sorted(pick)]


def test_a_size_program_gives_what_the_formulas_give(families):
    for f in families:
        fit = f.plan.fit
        slots = list(range(len(fit.slots)))
        prog = size_program(fit, 1, slots)
        sizes = _members(f)
        want = fit.numbers(sizes)
        for size, row in zip(sizes, want):
            assert (run_size_program(prog, size) == row).all(), size
        # a program of some slots, in another order, gives those
        some = slots[::-7]
        assert (run_size_program(size_program(fit, 1, some), sizes[-1]) == want[-1][some]).all()


def test_an_f64_output_is_its_doubles_bits(families):
    fit = families[0].plan.fit
    prog = size_program(fit, 1, [0, 1], f64=[True, False])
    size = families[0].sizes[-1]
    got = run_size_program(prog, size)
    want = fit.numbers(size[None])[0, :2]
    assert got[0] == np.float64(want[0]).view(np.int64) and got[1] == want[1]


def test_a_malformed_request_is_refused(families):
    fit = families[0].plan.fit
    with pytest.raises(ValueError):
        size_program(fit, 4, [0])   # more dims than the loader takes
    with pytest.raises(ValueError):
        size_program(fit, 1, [len(fit.slots)])   # no such slot


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a host C compiler (cc)")
def test_the_c_evaluator_gives_what_the_formulas_give(families, tmp_path):
    """The evaluator's C text, as the loader kernel holds it, compiled for the host: every member of
    every family, against the formulas evaluated by numpy."""
    src = tmp_path / "size_program.c"
    src.write_text("#include <string.h>\n#define G_HD\n" + SIZE_PROGRAM + r"""
void g_eval(const long long* prog, const long long* sizes, long long n, long long* out) {
  for (long long i = 0; i < n; ++i) {
    long long cols[G_MAX_VARIABLES];
    for (long long d = 0; d < prog[0]; ++d) cols[d] = sizes[i * prog[0] + d];
    g_size_variables(prog, cols);
    for (long long j = 0; j < prog[2]; ++j) out[i * prog[2] + j] = g_size_output(prog, j, cols);
  }
}
""")
    lib = tmp_path / "size_program.so"
    subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True, capture_output=True)
    g_eval = ctypes.CDLL(str(lib)).g_eval
    ptr = ctypes.POINTER(ctypes.c_longlong)
    g_eval.argtypes = [ptr, ptr, ctypes.c_longlong, ptr]
    for f in families:
        fit = f.plan.fit
        prog = size_program(fit, 1, list(range(len(fit.slots))))
        sizes = np.ascontiguousarray(f.sizes, np.int64)
        out = np.empty((len(sizes), len(fit.slots)), np.int64)
        g_eval(prog.ctypes.data_as(ptr), sizes.ctypes.data_as(ptr), len(sizes), out.ctypes.data_as(ptr))
        assert (out == fit.numbers(sizes)).all()


def test_the_loader_kernel_compiles_for_the_gpu():
    pytest.importorskip("cuda.bindings.nvrtc", reason="needs NVRTC (pip install cuda-bindings nvidia-cuda-nvrtc)")
    from grapec.codegen.nvrtc import compile_cuda
    out = compile_cuda(EVAL_SIZES, "sm_90")
    assert out


@pytest.fixture(scope="module")
def with_gpu_code():
    """The same range with GPU code (the families' CUDA rows as formulas), written and read."""
    pytest.importorskip("cuda.bindings.nvrtc", reason="needs NVRTC (pip install cuda-bindings nvidia-cuda-nvrtc)")
    b = compile_model(W2V, dims={"batch": 1}, dynamic={"samples": (1600, 4000)}, targets=["sm_90"], jobs=2)
    return Bundle.from_bytes(b.to_bytes())


def test_a_members_record_and_band_come_from_its_familys_formulas(with_gpu_code):
    """What a shared exec needs of a size, worked out from its family's formulas without joining its plan
    (runtime/cuda/size_record.py family_record_program, shared_exec.py family_bands), equals what the
    runner works out from the joined plan: each kernel step's scalars and grid, and the size's band."""
    from grapec.plan import KernelStep
    from grapec.runtime.cuda.shared_exec import family_bands, size_band
    from grapec.runtime.cuda.size_record import family_kernels, family_record_program
    b = with_gpu_code
    cuda = b.manifest["cuda"]
    fams = [f for f in b.plans.docs.families if f.cuda is not None]
    assert fams
    for f in fams:
        positions = sorted(family_kernels(f))
        prog = family_record_program(f, positions)
        bands = family_bands(f)
        rng = np.random.default_rng(3)
        for m in sorted({0, len(f.sizes) - 1, *[int(i) for i in rng.integers(0, len(f.sizes), 6)]}):
            plan = b.plans[f.buckets[m]]
            assert all(isinstance(plan.steps[p], KernelStep) for p in positions)
            want = []
            for p in positions:
                k = plan.steps[p].kernel
                want += [int(v) if t == "i64" else int(np.float64(v).view(np.int64)) for t, v in cuda["scalars"][k]]
                want.append(int(cuda["launch"][k][1]))
            assert run_size_program(prog, f.sizes[m]).tolist() == want, (f.sizes[m], m)
            assert bands[m] == size_band(b, plan), f.sizes[m]


def test_a_members_exec_key_comes_from_its_family(with_gpu_code):
    """The exec a member shares (its launch structure and band) worked out for a whole family at once
    (shared_exec.family_exec_keys), equal to the runner's exec_key from each member's joined plan."""
    from grapec.runtime.cuda.shared_exec import exec_key, family_exec_keys, graph_shape
    b = with_gpu_code
    for f in [f for f in b.plans.docs.families if f.cuda is not None]:
        keys = family_exec_keys(b, f)
        assert keys is not None and len(keys) == len(f.buckets)
        rng = np.random.default_rng(5)
        for m in sorted({0, len(f.buckets) - 1, *[int(i) for i in rng.integers(0, len(f.buckets), 8)]}):
            bucket = f.buckets[m]
            assert keys[m] == exec_key(b, bucket, graph_shape(b.plans[bucket])), f.sizes[m]


def test_inspect_joins_a_few_members_of_each_family(with_gpu_code, monkeypatch):
    """`grapec inspect` of a range tells its launch structures and GPU execs without joining every size's
    plan (joining each of tiny Wav2Vec2's 14401 sizes took it past two minutes; a full-size 158401-size
    range, hours): a family's members from its formulas, at most shared_exec.SAMPLED compared per exec."""
    from grapec.bundle.families import BucketDocs
    from grapec.runtime.cuda.shared_exec import SAMPLED
    from grapec.tools.show import launch_structures, shared_execs
    b = with_gpu_code
    docs = b.plans.docs
    joined = set()
    real = BucketDocs.__getitem__

    def counting(self, bucket):
        if self.at[bucket][0] != "stored":
            joined.add(bucket)
        return real(self, bucket)
    monkeypatch.setattr(BucketDocs, "__getitem__", counting)
    structures = launch_structures(b)
    execs = shared_execs(b)
    members = sum(len(f.buckets) for f in docs.families)
    assert sum(len(s["buckets"]) for s in structures) == len(b.plans) and execs["execs"] >= len(structures)
    assert len(joined) <= len(docs.families) + SAMPLED * execs["execs"] < members, (len(joined), members)


def test_a_members_inputs_and_outputs_come_from_its_familys_formulas(families):
    """What a run copies in and out of a member (bundle/families.py member_io), from the formulas, equal
    to its joined plan's input and output buffers."""
    from grapec.bundle.families import member_io
    from grapec.plan import Buffer
    for f in families:
        members = sorted({0, len(f.sizes) - 1, len(f.sizes) // 2})
        io = member_io(f, members)
        for i, m in enumerate(members):
            doc = f.document(m)["plan"]
            bufs = [Buffer.from_json(r) for r in doc["buffers"]]
            for side in ("inputs", "outputs"):
                want = [(name, bufs[b]) for name, b in doc[side]]
                assert [(name, got[i]) for name, got in io[side]] == want, (f.sizes[m], side)


def _loader_source(shared: int | None, block: int | None = None) -> str:
    """The loader's text, its shared memory cut to `shared` int64s (then no block's records fit), its block
    `block` threads."""
    from grapec.codegen.size_program import EVAL_SHARED, EVAL_SIZES_BLOCK
    source = EVAL_SIZES
    if shared is not None:
        source = source.replace(f"#define G_EVAL_SHARED {EVAL_SHARED}", f"#define G_EVAL_SHARED {shared}")
    if block is not None:
        source = source.replace(f"#define G_EVAL_BLOCK {EVAL_SIZES_BLOCK}", f"#define G_EVAL_BLOCK {block}")
    assert (source == EVAL_SIZES) == (shared is None and block is None)
    return source


def _loader_program(f) -> tuple:
    """(program, slots) of every slot of the family's plan formulas, every fifth an f64, over several blocks."""
    from grapec.codegen.size_program import eval_sizes_grid
    slots = list(range(len(f.plan.fit.slots)))
    prog = size_program(f.plan.fit, 1, slots, f64=[j % 5 == 0 for j in slots])
    assert eval_sizes_grid(prog) > 1   # several blocks, each its own outputs
    return prog, slots


@pytest.mark.gpu
@pytest.mark.parametrize("shared", [None, 40], ids=["records-in-shared-memory", "records-read-from-global"])
def test_the_loader_kernel_gives_what_the_formulas_give(families, shared):
    """The loader (EVAL_SIZES) run on the GPU, several blocks of outputs, at members of every family: its
    record equals the formulas'. With 40 int64s of shared memory no block's records fit, so the same kernel
    reads them from global memory, which must give the same."""
    from grapec.runtime.devices import gpu_count
    if not gpu_count():
        pytest.skip("needs an NVIDIA GPU")
    from grapec.codegen.nvrtc import compile_cuda
    from grapec.codegen.size_program import EVAL_SIZES_BLOCK, MAX_DIMS, eval_sizes_grid
    from grapec.runtime.cuda.driver import Device, KernelArgs, call
    source = _loader_source(shared)
    dev = Device(0)
    module = call("cuModuleLoadData", compile_cuda(source, dev.arch))
    func = call("cuModuleGetFunction", module, b"grapec_eval_sizes")
    stream = call("cuStreamCreate", 0)
    for f in families:
        prog, slots = _loader_program(f)
        p_prog, p_rec, p_dims = (dev.alloc(n, "test") for n in (prog.nbytes, 8 * len(slots) + 8, 8 * MAX_DIMS))
        dev.upload(p_prog, prog.ctypes.data, prog.nbytes)
        for size in _members(f, n=6, seed=1):
            dims = np.zeros(MAX_DIMS, np.int64)
            dims[:len(size)] = size
            dev.upload(p_dims, dims.ctypes.data, dims.nbytes)
            args = KernelArgs([p_prog, p_rec, p_dims])
            call("cuLaunchKernel", func, eval_sizes_grid(prog), 1, 1, EVAL_SIZES_BLOCK, 1, 1, 0, stream,
                 args.address, 0)
            call("cuStreamSynchronize", stream)
            got = np.empty(len(slots), np.int64)
            dev.download(got.ctypes.data, p_rec, got.nbytes)
            assert (got == run_size_program(prog, size)).all(), (size, np.flatnonzero(got != run_size_program(prog, size))[:5])
        for ptr in (p_prog, p_rec, p_dims):
            dev.free(ptr)


# The loader kernel compiled for the host with a POSIX thread per CUDA thread of a block and a barrier for
# __syncthreads: its blocks, shared memory and phases run as written, without a GPU
_THREADED_SHIM = r"""
#include <pthread.h>
#include <cstring>
#include <algorithm>
struct g_dim3 { unsigned x, y, z; };
static thread_local g_dim3 threadIdx, blockIdx;
static g_dim3 blockDim;
static pthread_barrier_t g_bar;
#define __global__
#define __device__
#define __shared__ static
#define __restrict__ __restrict
#define __syncthreads() pthread_barrier_wait(&g_bar)
#define __launch_bounds__(n)
using std::min;
/* a warp's barrier: every lane of the warp reaches each shuffle (the loader's loops run alike in all 32) */
static pthread_barrier_t g_warp_bar[32];
#define __syncwarp() pthread_barrier_wait(&g_warp_bar[threadIdx.x / 32])
static long long g_shuffled[1024];
static long long __shfl_xor_sync(unsigned, long long v, int k) {
  g_shuffled[threadIdx.x] = v;
  __syncwarp();
  const long long got = g_shuffled[threadIdx.x ^ k];
  __syncwarp();
  return got;
}
static inline long long __double_as_longlong(double d) { long long i; std::memcpy(&i, &d, 8); return i; }
"""
_THREADED_LAUNCH = r"""
struct g_args { const long long* prog; long long* record; const long long* dims; unsigned t, b; };
static void* g_thread(void* p) {
  g_args* a = (g_args*)p;
  threadIdx = {a->t, 0, 0};
  blockIdx = {a->b, 0, 0};
  grapec_eval_sizes(a->prog, a->record, a->dims);
  return nullptr;
}
extern "C" void launch(const long long* prog, long long* record, const long long* dims, unsigned grid, unsigned block) {
  blockDim = {block, 1, 1};
  pthread_t th[1024];
  g_args args[1024];
  for (unsigned b = 0; b < grid; ++b) {   /* one block after another: a block's shared arrays are one static copy */
    pthread_barrier_init(&g_bar, nullptr, block);
    for (unsigned w = 0; w < block / 32; ++w) pthread_barrier_init(&g_warp_bar[w], nullptr, 32);
    for (unsigned t = 0; t < block; ++t) {
      args[t] = {prog, record, dims, t, b};
      pthread_create(&th[t], nullptr, g_thread, &args[t]);
    }
    for (unsigned t = 0; t < block; ++t) pthread_join(th[t], nullptr);
    pthread_barrier_destroy(&g_bar);
    for (unsigned w = 0; w < block / 32; ++w) pthread_barrier_destroy(&g_warp_bar[w]);
  }
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to compile the loader for the host")
@pytest.mark.parametrize("shared", [None, 40], ids=["records-in-shared-memory", "records-read-from-global"])
def test_the_loader_kernel_run_on_host_threads_gives_what_the_formulas_give(families, shared, tmp_path):
    """The loader (EVAL_SIZES) as the GPU runs it, a thread per CUDA thread: several blocks of outputs, each
    copying its records into shared memory (or, with 40 int64s of it, reading them from global memory), write
    every output of the record and nothing past it. Blocks of 64 threads (two warps, each its own outputs)
    keep the barriers of 2 CPU cores' worth of threads in seconds."""
    from grapec.codegen.size_program import MAX_DIMS, eval_sizes_grid
    block = 64
    source = _loader_source(shared, block)
    src, lib = tmp_path / "loader.cpp", tmp_path / "loader.so"
    src.write_text(_THREADED_SHIM + source + _THREADED_LAUNCH)
    built = subprocess.run(["g++", "-O1", "-shared", "-fPIC", "-pthread", "-o", str(lib), str(src)], capture_output=True,
                           text=True)
    assert built.returncode == 0, built.stderr[-3000:]
    launch = ctypes.CDLL(str(lib)).launch
    ptr = ctypes.POINTER(ctypes.c_longlong)
    launch.argtypes = [ptr, ptr, ptr, ctypes.c_uint, ctypes.c_uint]
    for f in families:
        prog, slots = _loader_program(f)
        for size in _members(f, n=3, seed=2):
            dims = np.zeros(MAX_DIMS, np.int64)
            dims[:len(size)] = size
            record = np.full(len(slots) + 1, -7, np.int64)   # one more: nothing is written past the outputs
            launch(prog.ctypes.data_as(ptr), record.ctypes.data_as(ptr), dims.ctypes.data_as(ptr), eval_sizes_grid(prog),
                   block)
            want = run_size_program(prog, size)
            assert (record[:-1] == want).all(), (size, np.flatnonzero(record[:-1] != want)[:5])
            assert record[-1] == -7
