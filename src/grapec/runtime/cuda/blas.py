"""Library `matmul` nodes on the GPU: cuBLASLt through nvmath-python's bindings, recorded into the
CUDA graph at load time (captured on a side stream into a child graph).

The algorithm is tuned at load: cuBLASLt's heuristic ranks up to TUNE_CANDIDATES algorithms for
the shape, and each is timed on this GPU as a CUDA graph of TUNE_REPEATS calls (timing calls
launched one by one from Python would time Python). The heuristic's first choice is not always the
fastest at the small M of batch-1 inference; on the zoo the tuned choices made a replay 1-3% faster
(benchmarks/graph_options.py, H100). GRAPEC_GEMM_TUNING=0 keeps the heuristic's first choice (faster
load, no timing runs).

Row-major C[M,N] = op(A) op(B) is column-major C^T[N,M] = op(B)^T op(A)^T, so B is cuBLASLt's first
operand and A its second; batches are strided (stride 0 for an operand without batch dims).
fp32 computes in fp32 (no TF32 unless asked), fp16 accumulates in fp32, and writes fp32 where the
step says so (attrs out_dtype: passes/epilogue.py folds a widening cast of the output into the call).
"""
from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass

import numpy as np

from ...errors import BackendError, gpu_package
from .driver import call, capture_stream, captured, graph_ms, shared

CUDA_R = {"float32": 0, "float16": 2, "float64": 1, "bfloat16": 14}
COMPUTE_32F, COMPUTE_32F_FAST_TF32, COMPUTE_64F = 68, 77, 70
OP_N, OP_T = 0, 1
# cublasLtEpilogue_t; cuBLASLt's GELU is the tanh approximation, so erf-GELU stays a kernel.
EPILOGUE = {"none": 1, "relu": 2, "gelu_tanh": 32}
EPILOGUE_BIAS = 4
TUNE_CANDIDATES = 8
# A side branch's GEMMs (passes/streams.py) are the small ones of a parallel block: 4 MiB (cuBLAS's
# default before Hopper) serves them, and keeps four branches at 44 MiB of workspace instead of 128.
SIDE_BRANCH_WORKSPACE = 4 << 20
TUNE_REPEATS = 20
WORKSPACE_BYTES = 32 << 20


class Workspaces:
    """cuBLASLt workspaces of one runner, one per branch of its stream schedule: calls that may run
    at once (two branches of a graph, or the graphs of two runners) must not share one."""

    def __init__(self, device, nbytes: int = WORKSPACE_BYTES):
        self.device, self.nbytes, self.ptrs = device, nbytes, []

    def size(self, branch: int) -> int:
        return self.nbytes if branch == 0 else min(self.nbytes, SIDE_BRANCH_WORKSPACE)

    def get(self, branch: int) -> tuple:
        """(pointer, bytes) of a branch's workspace, allocated on first use."""
        while len(self.ptrs) <= branch:
            n = len(self.ptrs)
            self.ptrs.append(self.device.alloc(self.size(n), f"cuBLASLt workspace {n}"))
        return self.ptrs[branch], self.size(branch)

    def free(self):
        for p in self.ptrs:
            self.device.free(p)
        self.ptrs = []


class Blas:
    """One cuBLASLt handle per device, shared by every runner of the process: the GEMM problems met
    (descriptors, heuristic, tuned choice) are kept once, and a lock keeps two threads from capturing
    on its stream at once. Workspaces belong to the runners."""

    def __init__(self, device, tf32: bool = False):
        try:
            from nvmath.bindings import cublasLt
        except ImportError:
            raise BackendError(f"the CUDA backend needs cuBLASLt through nvmath-python: {gpu_package('nvmath-python')}") from None
        self.lt = cublasLt
        self.device = device
        try:
            self.handle = cublasLt.create()
        except Exception as e:  # noqa: BLE001 - the bindings load libcublasLt only now: no library, or too old a one
            raise BackendError(f"cuBLASLt did not start ({type(e).__name__}: {e}): {gpu_package('nvidia-cublas')}") from None
        self.tf32 = tf32
        self.capture_stream = capture_stream()
        self._gemms: dict = {}    # GEMM signature -> GemmProblem
        self._lock = threading.Lock()

    def _layout(self, dtype, rows, cols, ld, batch, stride):
        lt = self.lt
        lay = lt.matrix_layout_create(CUDA_R[dtype], rows, cols, ld)
        if batch > 1:
            cnt = np.array([batch], np.int32)
            st = np.array([stride], np.int64)
            lt.matrix_layout_set_attribute(lay, lt.MatrixLayoutAttribute.BATCH_COUNT, cnt.ctypes.data, 4)
            lt.matrix_layout_set_attribute(lay, lt.MatrixLayoutAttribute.STRIDED_BATCH_OFFSET, st.ctypes.data, 8)
        return lay

    def matmul_graph(self, attrs: dict, shapes: list, dtype: str, ptrs: list, out_shape, out_ptr: int,
                     layouts: dict | None, workspace: tuple, tune: bool = False, accept=None):
        """A child graph computing one `matmul` step. shapes/ptrs: A, B, optional C and bias (0 when
        absent); attrs["act"] picks the epilogue. layouts: {"0" (A) | "1" (B) | "out": (ld, batch
        stride)} for operands seen through a view (passes/strided_operands.py); dense otherwise.
        tune: time the candidate algorithms (the caller vouches that nothing lives in the output yet).
        workspace: (pointer, bytes) the call may use, its runner's for the step's branch (graph.py).
        accept(graph) -> bool: the graph of the first ranked algorithm it accepts, None where it takes none
        (a range family's shape variants must launch as the node they are set into: family_exec.py)."""
        with self._lock:
            return self._matmul_graph(attrs, shapes, dtype, ptrs, out_shape, out_ptr, layouts or {}, workspace, tune,
                                      accept)

    def _matmul_graph(self, attrs, shapes, dtype, ptrs, out_shape, out_ptr, layouts, workspace, tune, accept=None):
        if dtype not in CUDA_R:
            raise BackendError(f"matmul on {dtype} has no cuBLASLt path in this grapec (only float32/float16/bfloat16/float64)")
        lt = self.lt
        has_c = len(ptrs) > 2 and ptrs[2]
        bias_ptr = ptrs[3] if len(ptrs) > 3 else 0
        ws, ws_bytes = workspace
        enabled = os.environ.get("GRAPEC_GEMM_TUNING", "1") != "0"
        # one signature per GEMM problem: GPT-2's 12 layers share theirs, and a range's sizes met again
        # (a bucket switch rebuilds its graph) find their descriptors, heuristic and tuned choice here
        sig = (repr(sorted(attrs.items())), repr(shapes), dtype, repr(out_shape), repr(layouts),
               tuple(p % 256 if p else -1 for p in ptrs + [out_ptr]), ws_bytes, enabled)
        gemm = self._gemms.get(sig)
        if gemm is None:
            gemm = self._gemms[sig] = self._problem(attrs, shapes, dtype, out_shape, layouts, bool(has_c),
                                                    bool(bias_ptr), ws_bytes, TUNE_CANDIDATES if enabled else 1)
        if bias_ptr:   # read when the call is captured: the graph keeps its own copy
            bp = np.array([bias_ptr], np.uint64)
            lt.matmul_desc_set_attribute(gemm.desc, lt.MatmulDescAttribute.BIAS_POINTER, bp.ctypes.data, 8)
        c_ptr = ptrs[2] if has_c else out_ptr

        def launch(algo, stream):
            lt.matmul(self.handle, gemm.desc, gemm.alpha.ctypes.data, ptrs[1], gemm.b_lay, ptrs[0], gemm.a_lay,
                      gemm.beta.ctypes.data, c_ptr, gemm.d_lay, out_ptr, gemm.d_lay, algo, ws, ws_bytes, int(stream))
        if accept is not None:
            if len(gemm.algos) < TUNE_CANDIDATES:   # the ranking of the first choice only: rank more
                gemm = self._gemms[sig] = self._problem(attrs, shapes, dtype, out_shape, layouts, bool(has_c),
                                                        bool(bias_ptr), ws_bytes, TUNE_CANDIDATES)
            return self._accepted(launch, gemm.algos, accept)
        if enabled and tune and gemm.choice is None:
            gemm.choice = self._fastest(gemm.algos, launch)
        return self._capture(launch, gemm.algos[gemm.choice or 0])

    def _accepted(self, launch, algos: list, accept):
        for algo in algos:
            try:
                graph = self._capture(launch, algo)
            except Exception:  # noqa: BLE001 - an algorithm cuBLASLt ranked but cannot run here is not a choice
                continue
            if accept(graph):
                return graph
            call("cuGraphDestroy", graph)
        return None

    def _problem(self, attrs: dict, shapes: list, dtype: str, out_shape, layouts: dict, has_c: bool, has_bias: bool,
                 ws_bytes: int, candidates: int) -> "GemmProblem":
        """The descriptors of one GEMM problem and cuBLASLt's ranked algorithms for it."""
        lt = self.lt
        a_shape, b_shape = shapes[0], shapes[1]
        ta, tb = int(attrs.get("trans_a", 0)), int(attrs.get("trans_b", 0))
        m, n = out_shape[-2], out_shape[-1]
        k = a_shape[-2] if ta else a_shape[-1]
        batch = math.prod(out_shape[:-2])
        a_batch, b_batch = math.prod(a_shape[:-2]), math.prod(b_shape[:-2])
        for name, nb, sh in (("A", a_batch, a_shape), ("B", b_batch, b_shape)):
            if nb not in (1, batch) or (nb == batch and tuple(sh[:-2]) != tuple(out_shape[:-2]) and batch > 1):
                raise BackendError(f"matmul: operand {name} batch dims {list(sh[:-2])} broadcast against "
                                   f"{list(out_shape[:-2])} in a way strided cuBLASLt batches cannot express")
        if has_c and "out" in layouts:
            raise BackendError("matmul: a C operand with a strided output is not supported")
        if has_c and tuple(shapes[2]) != tuple(out_shape):
            raise BackendError(f"matmul: C of shape {list(shapes[2])} must match the output {list(out_shape)}")
        compute = COMPUTE_64F if dtype == "float64" else COMPUTE_32F_FAST_TF32 if self.tf32 else COMPUTE_32F
        scale_t = CUDA_R["float64"] if dtype == "float64" else CUDA_R["float32"]
        desc = lt.matmul_desc_create(compute, scale_t)
        op_first, op_second = np.array([OP_T if tb else OP_N], np.int32), np.array([OP_T if ta else OP_N], np.int32)
        lt.matmul_desc_set_attribute(desc, lt.MatmulDescAttribute.TRANSA, op_first.ctypes.data, 4)
        lt.matmul_desc_set_attribute(desc, lt.MatmulDescAttribute.TRANSB, op_second.ctypes.data, 4)
        # first operand: B. Stored row-major [K,N] (col-major N x K, ld N) or, transposed, [N,K] (col-major K x N, ld K)
        b_ld, b_stride = layouts.get("1", (k if tb else n, k * n if b_batch > 1 else 0))
        a_ld, a_stride = layouts.get("0", (m if ta else k, m * k if a_batch > 1 else 0))
        d_ld, d_stride = layouts.get("out", (n, m * n))
        if batch > 1 and b_batch == 1 and a_batch == batch and not ta and a_stride == m * a_ld and d_stride == m * d_ld:
            # [batch, m, k] x [k, n] is one [batch * m, k] x [k, n]: a weight shared by every batch
            # (a Linear on [batch, seq, hidden]) gets the big-M kernels, not `batch` GEMMs tuned to
            # small M; GPT-2's batch-16 LM head ran at 42% of peak as 16 GEMMs of M=128.
            m, batch, a_stride, d_stride = batch * m, 1, 0, 0
        b_lay = self._layout(dtype, k if tb else n, n if tb else k, b_ld, batch, b_stride)
        a_lay = self._layout(dtype, m if ta else k, k if ta else m, a_ld, batch, a_stride)
        d_lay = self._layout(attrs.get("out_dtype") or dtype, n, m, d_ld, batch, d_stride)
        sdt = np.float64 if dtype == "float64" else np.float32
        alpha = np.array([attrs.get("alpha", 1.0)], sdt)
        beta = np.array([attrs.get("beta", 1.0) if has_c else 0.0], sdt)
        self._epilogue(desc, attrs.get("act", ""), has_bias, dtype)
        ranked = self._heuristic(desc, b_lay, a_lay, d_lay, candidates, ws_bytes)
        return GemmProblem(desc, a_lay, b_lay, d_lay, alpha, beta, ranked)

    def _capture(self, launch, algo: int, repeats: int = 1):
        def calls():
            for _ in range(repeats):
                launch(algo, self.capture_stream)
        return captured(self.capture_stream, calls)

    def _fastest(self, algos: list, launch) -> int:
        """Index of the algorithm of the fewest microseconds per call, each timed as a graph of
        repeated calls. The calls write the step's own output buffer, which holds nothing yet."""
        if len(algos) == 1:
            return 0
        times = [self._time(launch, a) for a in algos]
        return min(range(len(algos)), key=lambda i: times[i])

    def _time(self, launch, algo: int) -> float:
        try:
            graph = self._capture(launch, algo, TUNE_REPEATS)
        except Exception:  # noqa: BLE001 - an algorithm cuBLASLt ranked but cannot run here is not a choice
            return math.inf
        return graph_ms(graph, self.capture_stream, 3)

    def tuning_counts(self) -> dict:
        """GEMM signatures tuned so far, and those where a candidate beat cuBLASLt's first choice."""
        tuned = [g.choice for g in self._gemms.values() if g.choice is not None]
        return {"shapes_timed": len(tuned), "beat_first_choice": sum(i != 0 for i in tuned)}

    def _epilogue(self, desc, act: str, has_bias: bool, dtype: str):
        """Bias (a vector over the output's columns, which are cuBLASLt's rows; its address is set per
        call) and activation."""
        act = act or "none"
        if act not in EPILOGUE or (act != "none" and dtype == "float64"):
            raise BackendError(f"matmul: no cuBLASLt epilogue for activation '{act}' on {dtype}")
        if not has_bias and act == "none":
            return
        # DEFAULT is 1, the others are bit flags: RELU 2, BIAS 4, GELU 32 (RELU_BIAS 6, GELU_BIAS 36)
        code = (EPILOGUE[act] if act != "none" else 0) | (EPILOGUE_BIAS if has_bias else 0)
        epi = np.array([code], np.int32)
        self.lt.matmul_desc_set_attribute(desc, self.lt.MatmulDescAttribute.EPILOGUE, epi.ctypes.data, 4)

    def _heuristic(self, desc, a_lay, b_lay, d_lay, n: int, workspace_bytes: int) -> np.ndarray:
        """Up to n algorithms for the shape that fit the workspace, cuBLASLt's best guess first."""
        lt = self.lt
        pref = lt.matmul_preference_create()
        ws = np.array([workspace_bytes], np.uint64)
        lt.matmul_preference_set_attribute(pref, lt.MatmulPreferenceAttribute.MAX_WORKSPACE_BYTES, ws.ctypes.data, 8)
        res = np.zeros(n, dtype=lt.matmul_heuristic_result_dtype)
        count = np.zeros(1, np.int32)
        try:
            lt.matmul_algo_get_heuristic(self.handle, desc, a_lay, b_lay, d_lay, d_lay, pref, n, res.ctypes.data,
                                         count.ctypes.data)
        finally:
            lt.matmul_preference_destroy(pref)
        if count[0] < 1:
            raise BackendError("cuBLASLt found no algorithm for a matmul of this shape")
        return res[:int(count[0])]


@dataclass
class GemmProblem:
    """One GEMM problem's cuBLASLt descriptors (kept alive while graphs captured from them exist),
    its ranked algorithms, and the index the tuning chose (None: not tuned)."""
    desc: int
    a_lay: int
    b_lay: int
    d_lay: int
    alpha: np.ndarray
    beta: np.ndarray
    ranked: np.ndarray   # cublasLtMatmulHeuristicResult_t records
    choice: int | None = None

    @property
    def algos(self) -> list:
        """Addresses of the ranked algorithms (cublasLtMatmulAlgo_t) for the matmul call."""
        r = self.ranked
        return [r.ctypes.data + i * r.itemsize + r.dtype.fields["algo"][1] for i in range(len(r))]


def apply_views(attrs: dict, shapes: list, ptrs: list, out_shape, out_ptr: int, dtype: str,
                out_dtype: str | None = None) -> tuple:
    """A step's views (passes/strided_operands.py) applied to its buffers' shapes and addresses:
    shapes and ptrs change in place; -> (out_shape, out_ptr, layouts for matmul_graph). dtype: the
    operands'; out_dtype: the output's (attrs out_dtype), dtype when None."""
    from ... import dtypes
    layouts = {}
    for key, (offset, batch_stride, ld, shape) in (attrs.get("views") or {}).items():
        nbytes = offset * dtypes.itemsize(out_dtype or dtype if key == "out" else dtype)
        layouts[key] = (ld, batch_stride)
        if key == "out":
            out_shape, out_ptr = shape, out_ptr + nbytes
        else:
            shapes[int(key)], ptrs[int(key)] = shape, ptrs[int(key)] + nbytes
    return out_shape, out_ptr, layouts


def shared_blas(device, tf32: bool = False) -> Blas:
    """One cuBLASLt handle per device and precision mode, shared by all sessions of the process."""
    return shared(Blas, device, tf32)
