"""Library `conv` and `sdpa` nodes on the GPU: cuDNN through nvidia-cudnn-frontend's graph API, recorded
into the CUDA graph at load time (captured on a side stream into a child graph), as blas.py does for GEMMs.

One cuDNN graph per convolution problem: conv_fprop on channels-last tensors (NHWC activations,
KRSC weights: the layout cuDNN's tensor-core kernels read natively), then the bias add and the
activation fused into the same kernel. cuDNN's heuristic (mode A) picks the engine; the graph is
built once per problem and shared by every convolution of that shape.

An `sdpa` step (passes/sdpa.py) is one cuDNN graph of its own: its scaled dot-product attention
reads q, k and v through their strides (heads of the fused QKV projection, in place), adds the
additive mask as cuDNN's bias (a constant causal mask as cuDNN's causal band, bottom-right aligned),
and writes merged heads through the output's strides.

Each problem's engines are timed on this GPU at load, where the runner tunes (its first use, while
nothing lives in the step's output): cuDNN's heuristic ranks its plans, and its first is not always
the fastest (H200, GPT-2's causal attention at 8 x 12 heads x 128: the first 6.4 us, the fourth 5.3).
GRAPEC_GEMM_TUNING=0 keeps the heuristic's first choice, as for GEMMs (blas.py).

fp32 convolutions keep fp32 arithmetic: engines that would use TF32 tensor cores are deselected
unless the session runs in tf32 mode, as for GEMMs.
"""
from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass

from ...errors import BackendError, gpu_package
from .driver import call, capture_stream, captured, graph_ms, shared

TUNE_REPEATS = 10

IO_TYPES = ("float16", "bfloat16", "float32")


class Dnn:
    """One cuDNN handle per device, shared by every runner of the process (blas.Blas's pattern):
    the built graphs are kept once per problem, and a lock keeps two threads from capturing on its
    stream at once. Workspaces belong to the runners."""

    def __init__(self, device, tf32: bool = False):
        try:
            import cudnn
        except ImportError:
            raise BackendError(f"convolutions on the GPU run through cuDNN: {gpu_package('nvidia-cudnn-frontend')} "
                               "(or compile with --conv gemm)") from None
        except Exception as e:  # noqa: BLE001 - the frontend loads libcudnn on import
            raise BackendError(f"cuDNN's frontend did not load ({type(e).__name__}: {e}): "
                               f"{gpu_package('nvidia-cudnn-cu13')}") from None
        self.cudnn = cudnn
        self.device = device
        self.tf32 = tf32
        try:
            self.handle = cudnn.create_handle()
        except Exception as e:  # noqa: BLE001 - no libcudnn, or one too old for this frontend
            raise BackendError(f"cuDNN did not start ({type(e).__name__}: {e}): {gpu_package('nvidia-cudnn-cu13')}") from None
        self.capture_stream = capture_stream()
        cudnn.set_stream(self.handle, int(self.capture_stream))   # once: cudnnSetStream queries the driver each call
        self._problems: dict = {}   # signature -> ConvProblem
        self._lock = threading.Lock()

    def conv_graph(self, attrs: dict, shapes: list, dtype: str, ptrs: list, out_shape, out_ptr: int, workspace: tuple,
                   warm: bool = False):
        """A child graph computing one `conv` step (ir/library.py). shapes/ptrs: x [N,H,W,C],
        w [K,R,S,C/g], optional bias [K] and residual [N,OH,OW,K] (pointer 0 when absent). workspace: (pointer, bytes) of the
        step's branch. warm: run the call once before capturing it (the caller vouches that nothing
        lives in the output yet), so that cuDNN loads its kernels outside the capture."""
        with self._lock:
            has_bias = len(ptrs) > 2 and bool(ptrs[2])
            has_residual = len(ptrs) > 3 and bool(ptrs[3])
            sig = (repr(sorted(attrs.items())), repr(shapes[:2]), dtype, has_bias, has_residual, workspace[1])
            problem = self._problems.get(sig)
            fresh = problem is None
            if fresh:
                problem = self._problems[sig] = self._build(attrs, shapes, dtype, out_shape, has_bias, has_residual,
                                                            workspace[1])
            pack = {problem.x: ptrs[0], problem.w: ptrs[1], problem.y: out_ptr}
            if has_bias:
                pack[problem.b] = ptrs[2]
            if has_residual:
                pack[problem.v] = ptrs[3]
            return self._captured(problem, pack, workspace, warm and fresh)

    def sdpa_graph(self, attrs: dict, dtype: str, ptrs: list, out_ptr: int, workspace: tuple, warm: bool = False):
        """A child graph computing one `sdpa` step (ir/library.py): ptrs are the q, k, v buffers
        and the bias's (absent: no bias); the attrs' offsets are added here. warm: as conv_graph."""
        with self._lock:
            has_bias = "bias" in attrs and len(ptrs) > 3 and bool(ptrs[3])
            keys = ("dims", "scale", "q", "k", "v", "out", "bias", "causal")
            sig = ("sdpa", repr([attrs.get(key) for key in keys]), dtype, has_bias, workspace[1])
            problem = self._problems.get(sig)
            fresh = problem is None
            if fresh:
                problem = self._problems[sig] = self._build_sdpa(attrs, dtype, has_bias, workspace[1])
            isz = 2   # float16 | bfloat16
            pack = {problem.x: ptrs[0] + attrs["q"][0] * isz, problem.w: ptrs[1] + attrs["k"][0] * isz,
                    problem.v: ptrs[2] + attrs["v"][0] * isz, problem.y: out_ptr + attrs["out"][0] * isz}
            if has_bias:
                pack[problem.b] = ptrs[3] + attrs["bias"][0] * isz
            return self._captured(problem, pack, workspace, warm and fresh)

    def _captured(self, problem, pack: dict, workspace: tuple, warm: bool):
        """problem's graph run on `pack` as a captured child graph; warm: run once before (the
        first use of a problem, so that cuDNN loads its kernels outside the capture)."""
        if warm:
            if _tuning():
                problem.plan = self._fastest_plan(problem, pack, workspace)
            self._execute(problem, pack, workspace)
            call("cuStreamSynchronize", self.capture_stream)
        return captured(self.capture_stream, lambda: self._execute(problem, pack, workspace))

    def _execute(self, problem, pack: dict, workspace: tuple, plan: int | None = None):
        plan = problem.plan if plan is None else plan
        if plan is None:
            problem.graph.execute(pack, workspace[0], handle=self.handle)
        else:
            problem.graph.execute_plan_at_index(pack, workspace[0], plan, handle=self.handle)

    def _fastest_plan(self, problem, pack: dict, workspace: tuple) -> int | None:
        """The index of the built plan of the fewest microseconds per call, each timed as a graph of
        TUNE_REPEATS calls (None: one plan, nothing to choose)."""
        count = problem.graph.get_execution_plan_count()
        if count < 2:
            return None
        times = []
        for i in range(count):
            def calls(i=i):
                for _ in range(TUNE_REPEATS):
                    self._execute(problem, pack, workspace, i)
            try:
                self._execute(problem, pack, workspace, i)   # kernels loaded outside the capture
                times.append(graph_ms(captured(self.capture_stream, calls), self.capture_stream, 3))
            except Exception:  # noqa: BLE001 - a plan cuDNN listed but could not build or run is not a choice
                times.append(math.inf)
        best = min(range(count), key=lambda i: times[i])
        return None if math.isinf(times[best]) else best

    def _build_sdpa(self, attrs: dict, dtype: str, has_bias: bool, ws_bytes: int) -> "ConvProblem":
        cudnn = self.cudnn
        if dtype not in ("float16", "bfloat16"):
            raise BackendError(f"sdpa on {dtype} has no cuDNN path (only float16, bfloat16)")
        dt = cudnn.data_type.HALF if dtype == "float16" else cudnn.data_type.BFLOAT16
        b, h, s, t, d, dv = attrs["dims"]
        g = cudnn.pygraph(io_data_type=dt, intermediate_data_type=cudnn.data_type.FLOAT,
                          compute_data_type=cudnn.data_type.FLOAT, handle=self.handle)
        q = g.tensor(name="q", dim=[b, h, s, d], stride=list(attrs["q"][1]), data_type=dt)
        k = g.tensor(name="k", dim=[b, h, t, d], stride=list(attrs["k"][1]), data_type=dt)
        v = g.tensor(name="v", dim=[b, h, t, dv], stride=list(attrs["v"][1]), data_type=dt)
        extra = {}
        if has_bias:
            _, dims, strides = attrs["bias"]
            extra["bias"] = g.tensor(name="bias", dim=list(dims), stride=list(strides), data_type=dt)
        if attrs.get("causal"):   # key j > query i + T - S hidden (ir/library.py sdpa)
            extra["diagonal_alignment"] = cudnn.diagonal_alignment.BOTTOM_RIGHT
            extra["diagonal_band_right_bound"] = 0
        o, _ = g.sdpa(name="sdpa", q=q, k=k, v=v, attn_scale=float(attrs.get("scale", 1.0)), generate_stats=False,
                      compute_data_type=cudnn.data_type.FLOAT, **extra)
        o.set_output(True).set_dim([b, h, s, dv]).set_stride(list(attrs["out"][1])).set_data_type(dt)
        self._plans(g, f"sdpa q[{b}, {h}, {s}, {d}] k[{b}, {h}, {t}, {d}] {dtype}"
                       + (f" bias{list(attrs['bias'][1])}" if has_bias else "")
                       + (" causal" if attrs.get("causal") else ""), dtype, ws_bytes)
        return ConvProblem(g, q, k, extra.get("bias"), o, v)

    def _plans(self, g, what: str, dtype: str, ws_bytes: int):
        """Validate g and build its execution plans within ws_bytes of workspace, or say why not."""
        cudnn = self.cudnn
        try:
            g.validate()
            g.build_operation_graph()
            g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
            if dtype == "float32" and not self.tf32:
                g.deselect_numeric_notes([cudnn.numerical_note.TENSOR_CORE])
            g.deselect_workspace_greater_than(ws_bytes)
            g.check_support()
            g.build_plans(cudnn.build_plan_policy.ALL if _tuning() else cudnn.build_plan_policy.HEURISTICS_CHOICE)
        except Exception as e:  # noqa: BLE001 - cuDNN says why in its own words; name the problem too
            raise BackendError(f"cuDNN has no engine for {what}: {type(e).__name__}: {e}") from None
        if g.get_workspace_size() > ws_bytes:
            raise BackendError(f"cuDNN's plan for {what} needs {g.get_workspace_size()} bytes of workspace, "
                               f"more than the {ws_bytes} the runner has")

    def _build(self, attrs: dict, shapes: list, dtype: str, out_shape, has_bias: bool, has_residual: bool,
               ws_bytes: int) -> "ConvProblem":
        cudnn = self.cudnn
        if dtype not in IO_TYPES:
            raise BackendError(f"conv on {dtype} has no cuDNN path in this grapec (only {', '.join(IO_TYPES)})")
        dt = {"float16": cudnn.data_type.HALF, "bfloat16": cudnn.data_type.BFLOAT16, "float32": cudnn.data_type.FLOAT}[dtype]
        n, h, w, c = shapes[0]
        k, r, s, cg = shapes[1]
        _, oh, ow, _ = out_shape
        pt, pl, pb, pr = attrs["pads"]
        g = cudnn.pygraph(io_data_type=dt, intermediate_data_type=cudnn.data_type.FLOAT,
                          compute_data_type=cudnn.data_type.FLOAT, handle=self.handle)
        # cuDNN names dims NCHW whatever the layout; the strides say NHWC / KRSC
        x = g.tensor(name="x", dim=[n, c, h, w], stride=[h * w * c, 1, w * c, c], data_type=dt)
        wt = g.tensor(name="w", dim=[k, cg, r, s], stride=[r * s * cg, 1, s * cg, cg], data_type=dt)
        y = g.conv_fprop(image=x, weight=wt, pre_padding=[pt, pl], post_padding=[pb, pr], stride=list(attrs["strides"]),
                         dilation=list(attrs["dilations"]), compute_data_type=cudnn.data_type.FLOAT)
        b = None
        if has_bias:
            b = g.tensor(name="bias", dim=[1, k, 1, 1], stride=[k, 1, k, k], data_type=dt)
            y = g.add(a=y, b=b, compute_data_type=cudnn.data_type.FLOAT)
        res = None
        if has_residual:   # the shortcut, NHWC like the output, added before the activation
            res = g.tensor(name="residual", dim=[n, k, oh, ow], stride=[oh * ow * k, 1, ow * k, k], data_type=dt)
            y = g.add(a=y, b=res, compute_data_type=cudnn.data_type.FLOAT)
        act = attrs.get("act") or "none"
        if act == "relu":
            y = g.relu(input=y, compute_data_type=cudnn.data_type.FLOAT)
        elif act != "none":
            raise BackendError(f"conv: no cuDNN epilogue for activation '{act}'")
        y.set_output(True).set_data_type(dt).set_dim([n, k, oh, ow]).set_stride([oh * ow * k, 1, ow * k, k])
        geometry = {key: attrs[key] for key in ('strides', 'dilations', 'pads', 'group') if key in attrs}
        self._plans(g, f"conv x{[n, h, w, c]} (NHWC) w{[k, r, s, cg]} (KRSC) {dtype} {geometry}", dtype, ws_bytes)
        return ConvProblem(g, x, wt, b, y, res)


@dataclass
class ConvProblem:
    """One problem's built cuDNN graph and its tensors (the variant pack's keys): a convolution's
    x, w, bias, y and residual (in v); an attention's q, k, bias, out, and v."""
    graph: object
    x: object
    w: object
    b: object
    y: object
    v: object = None
    plan: int | None = None   # the timed fastest plan's index (None: cuDNN's first)


def _tuning() -> bool:
    return os.environ.get("GRAPEC_GEMM_TUNING", "1") != "0"


def shared_dnn(device, tf32: bool = False) -> Dnn:
    """One cuDNN handle per device and precision mode, shared by all sessions of the process."""
    return shared(Dnn, device, tf32)
