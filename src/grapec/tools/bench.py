"""`grapec bench`: GPU time of one replay (median / p90 / p99 over many, after warm-up), host-to-
device and device-to-host apart, device memory; and, with --vs torch, PyTorch eager, PyTorch CUDA
graph and torch.compile (mode="reduce-overhead", i.e. with CUDA graphs) on the same weights and
inputs, measured in the same process on the same GPU; with --vs ort, onnxruntime's CUDA provider
on the same ONNX model (as compiled: the fp16 rewrite for fp16 bundles), with and without its CUDA
graph mode.

All GPU times come from CUDA events recorded around each replay on the stream that runs it.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import time

import numpy as np

from ..errors import GrapecError
from ..runtime.cuda.driver import call


def _stats(ms: list) -> dict:
    a = np.sort(np.asarray(ms))
    return {"median_ms": float(np.median(a)), "p90_ms": float(np.percentile(a, 90)),
            "p99_ms": float(np.percentile(a, 99)), "min_ms": float(a[0]), "n": len(a)}


def _event_times(stream, fn, iters: int) -> list:
    starts = [call("cuEventCreate", 0) for _ in range(iters)]
    ends = [call("cuEventCreate", 0) for _ in range(iters)]
    for s, e in zip(starts, ends):
        call("cuEventRecord", s, stream)
        fn()
        call("cuEventRecord", e, stream)
    call("cuEventSynchronize", ends[-1])
    out = [float(call("cuEventElapsedTime", s, e)) for s, e in zip(starts, ends)]
    for ev in starts + ends:
        call("cuEventDestroy", ev)
    return out


# model metadata naming a generation model's outputs: the generated ids, and how many were generated
TOKENS_OUTPUT_KEY = "grapec.generated_tokens_output"
COUNT_OUTPUT_KEY = "grapec.generated_count_output"


def bench_grapec(bundle, feeds: dict, iters: int = 200, warmup: int = 20, device: int = 0,
                 per_step: bool = False, timeline: bool = False, loop_body: bool = False) -> dict:
    """per_step: also time every top-level step alone (runtime/cuda/profile.py) into res["steps"];
    timeline: also measure when each step runs in a replay (runtime/cuda/timeline.py) into res["timeline"];
    loop_body: also time the last Loop's body (profile_loop_body) into res["loop_body"]."""
    import grapec
    from ..runtime.cuda.driver import Device
    probe = Device(device)
    free0, _ = probe.mem_info()
    t0 = time.perf_counter()
    sess = grapec.load(bundle, backend="cuda", device=device)
    r = sess._runner
    bucket = sess.select_bucket({k: np.asarray(v).shape for k, v in feeds.items()})
    first = sess.run(feeds)               # builds and instantiates the graph
    load_s = time.perf_counter() - t0
    launches = r.launched
    meta = bundle.manifest.get("metadata", {})
    r.synchronize()
    free1, _ = probe.mem_info()
    stream = r.stream
    host = {k: np.ascontiguousarray(v) for k, v in feeds.items()}

    family = r.families if r.families is not None and r.families.owns(bucket) else None
    if family is not None:   # a range's family size: its band's exec, as Session.run launches it (family_exec.py)
        ins = [(name, family.ptr(buf), buf) for name, buf in family.buffers(bucket, "inputs")]
        places = [(name, family.ptr(buf), buf) for name, buf in family.buffers(bucket, "outputs")]

        def replay():
            call("cuGraphLaunch", family.switch(bucket).exec, stream)   # the switch writes the size's dims
    else:
        plan = bundle.plans[bucket]   # (a family size's plan is joined from its formulas: not needed above)
        ins = [(name, r.ptr(bucket, b), plan.buffers[b]) for name, b in plan.inputs]
        places = [(name, r.ptr(bucket, b), plan.buffers[b]) for name, b in plan.outputs]

        def replay():
            r.execute(bucket, plan.steps)

    def h2d():
        for name, ptr, _ in ins:
            call("cuMemcpyHtoDAsync", ptr, host[name].ctypes.data, host[name].nbytes, stream)
    outs = {name: np.empty(buf.shape, np.dtype(buf.dtype)) for name, _, buf in places}

    def d2h():
        for name, ptr, buf in places:
            r.copy_buffer_out(buf, ptr, outs[name].ctypes.data, host=True)
    _event_times(stream, replay, warmup)
    res = {"replay": _stats(_event_times(stream, replay, iters)),
           "exec": family.describe(bucket) if family is not None else None,   # None: the size's own graph
           "h2d": _stats(_event_times(stream, h2d, max(iters // 4, 10))),
           "d2h": _stats(_event_times(stream, d2h, max(iters // 4, 10))),
           "device_memory_mib": (free0 - free1) / 2**20,
           "arena_mib": r.arena_bytes / 2**20, "weights_mib": bundle.weights_nbytes / 2**20,
           "load_and_first_run_s": load_s, "device": r.dev.name, "code": r.code, "launches": launches,
           "graph_edges": r.edge_counts()}
    if r.blas is not None:   # the process's shared cuBLASLt state: counts over every session so far
        res["gemm_tuning"] = r.blas.tuning_counts()
    if meta.get(COUNT_OUTPUT_KEY) in first:   # a generation model: users compare the time per generated token
        res["generated"] = int(np.asarray(first[meta[COUNT_OUTPUT_KEY]]).reshape(-1)[0])
        if meta.get(TOKENS_OUTPUT_KEY) in first:
            res["tokens"] = [int(t) for t in np.asarray(first[meta[TOKENS_OUTPUT_KEY]]).reshape(-1)[:res["generated"]]]
    r.release_host_copies()   # the replays' switches kept their dims arrays, copied long since
    if per_step and family is not None:   # its steps run at the band's shapes, in one exec: time each node there
        from ..runtime.cuda.profile import profile_nodes
        ex = family.switch(bucket)
        res["nodes"] = [dataclasses.asdict(t) for t in profile_nodes(ex.graph, ex.exec, stream)]
    elif per_step:
        from ..runtime.cuda.profile import profile_steps
        res["steps"] = [t.to_json() for t in profile_steps(r, bucket)]
    if loop_body:
        from ..runtime.cuda.profile import profile_loop_body
        body = profile_loop_body(r, bucket)
        res["loop_body"] = {"one_launch_us": body.one_launch_us, "steps": [t.to_json() for t in body.steps]}
    if timeline:
        from ..runtime.cuda.timeline import measure_timeline
        res["timeline"] = [dataclasses.asdict(s) for s in measure_timeline(r, bucket)]
    sess._runner.close()
    return res


def bench_torch(module, feeds: dict, iters: int = 200, warmup: int = 20, modes=("eager", "cuda_graph", "compile"),
                say=None, precision: str = "fp32") -> dict:
    """The peers at the bundle's precision: fp16 runs module.half() on float16 inputs; tf32 allows
    TF32 matmuls; fp32 forbids them (PyTorch's default for matmul, made explicit)."""
    import torch
    say = say or (lambda m: None)
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    module = module.to(dev).eval()
    args = [torch.from_numpy(np.ascontiguousarray(v)).to(dev) for v in feeds.values()]
    if precision == "fp16":
        module = module.half()
        args = [a.half() if a.is_floating_point() else a for a in args]
    else:   # a module an earlier fp16 run left in half
        module = module.float()

    def timed(fn, n=iters, w=warmup):
        with torch.no_grad():
            for _ in range(w):
                fn()
            torch.cuda.synchronize()
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
            for s, e in zip(starts, ends):
                s.record()
                fn()
                e.record()
            torch.cuda.synchronize()
        return _stats([s.elapsed_time(e) for s, e in zip(starts, ends)])

    out = {}
    torch.cuda.synchronize()
    m0 = torch.cuda.memory_allocated()
    if hasattr(module, "generation_peers"):   # a whole generation per run: the module names its peers
        out.update(_time_generation_peers(module, feeds, precision, timed, say, iters))
    else:
        if "eager" in modes:
            out["torch eager"] = timed(lambda: module(*args))
        try:
            _graph_and_compile(module, args, modes, timed, out, say)
        except Exception as e:  # noqa: BLE001 - report which peer failed and why, keep the others
            out["_torch error"] = _failure(e)
            say(f"peer failed: {out['_torch error']}")
    out["_weights_mib"] = (torch.cuda.memory_allocated() - m0) / 2**20
    return out


def _graph_and_compile(module, args, modes, timed, out, say):
    import torch
    if "cuda_graph" in modes:
        with torch.no_grad():
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    module(*args)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                module(*args)
        out["torch CUDA graph"] = timed(g.replay)
        del g
    if "compile" in modes:
        say("torch.compile(mode='reduce-overhead') compiling...")
        t0 = time.perf_counter()
        # a fresh compile at static shapes: dynamo keys its cache by the forward's code, so a model
        # already compiled at another batch in this process would be recompiled with the batch dynamic
        # (slower kernels: ResNet-50 at batch 8 ran 1.01 ms after batch 1, 0.70 alone, H200)
        torch._dynamo.reset()
        cm = torch.compile(module, mode="reduce-overhead", dynamic=False)
        with torch.no_grad():
            for _ in range(3):
                cm(*args)
        say(f"torch.compile ready in {time.perf_counter() - t0:.0f}s")
        out["torch.compile + CUDA graph"] = timed(lambda: cm(*args))


GENERATION_PEER_ITERATIONS = 10   # a whole generation per iteration: HF eager takes ~1 s for 128 tokens


def _time_generation_peers(module, feeds, precision, timed, say, iters) -> dict:
    """A generation model's own peers (the zoo module's generation_peers): each callable runs one whole
    generation; its tokens are kept so the report can say whether every peer generated the same."""
    import torch
    out = {}
    say("building the generation peers (torch.compile takes a while)...")
    runners = module.generation_peers(feeds, half=precision == "fp16")
    for label, fn in runners.items():
        try:
            with torch.no_grad():
                tokens = fn()
                torch.cuda.synchronize()
                out[label] = dict(timed(fn, n=min(GENERATION_PEER_ITERATIONS, iters), w=1), tokens=[int(t) for t in tokens.cpu().reshape(-1)])
        except Exception as e:  # noqa: BLE001 - report which peer failed and why, keep the others
            out[f"_{label} error"] = _failure(e)
            say(f"peer failed: {label}: {out[f'_{label} error']}")
    return out


def generation_table(g: dict, rows: list) -> list:
    """Lines: per run and per generated token for grapec (g) and each (label, stats) row, the ratio to
    grapec, and whether the row generated the same ids as grapec."""
    n = g["generated"]
    lines = [f"generation: {n} tokens per run; grapec ran each in {g['launches']} graph launch(es)",
             f"{'':34s} {'ms/run':>9s} {'ms/token':>9s} {'p90/token':>9s} {'vs grapec':>10s}  same tokens"]
    base = g["replay"]["median_ms"] / n
    for label, st in rows:
        per = st["median_ms"] / n
        if "tokens" not in st or "tokens" not in g:
            same = "-"
        else:
            first_diff = next((i for i, (a, b) in enumerate(zip(st["tokens"], g["tokens"])) if a != b), None)
            same = "yes" if first_diff is None and len(st["tokens"]) >= n else f"first {first_diff} of {n}"
        lines.append(f"{label:34s} {st['median_ms']:9.3f} {per:9.4f} {st['p90_ms'] / n:9.4f} {per / base:9.2f}x  {same}")
    return lines


def _failure(e: Exception) -> str:
    """A peer's failure in one line, for the report (the other peers still run)."""
    return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def ort_cuda_available() -> tuple:
    """-> (available, the providers onnxruntime has here)."""
    try:
        import onnxruntime as ort
    except ImportError:
        return False, []
    providers = ort.get_available_providers()
    return "CUDAExecutionProvider" in providers, providers


def bench_ort(model, feeds: dict, iters: int = 200, warmup: int = 20, precision: str = "fp32") -> dict:
    """onnxruntime CUDA on the model, inputs and outputs bound on the GPU (IOBinding), on a stream of
    ours so that CUDA events time it like every other peer; once plain, once with enable_cuda_graph."""
    import onnxruntime as ort
    from ..frontend.onnx_import import load_model
    from ..runtime.cuda.driver import Device
    proto = load_model(model)
    if precision == "fp16":
        from ..frontend.precision import to_fp16
        proto = to_fp16(proto)
    data = proto.SerializeToString()
    Device(0)   # its context current: the stream below belongs to it
    stream = call("cuStreamCreate", 0)
    out = {}
    for label, graph in (("onnxruntime CUDA", "0"), ("onnxruntime CUDA graph", "1")):
        opts = {"device_id": "0", "user_compute_stream": str(int(stream)), "enable_cuda_graph": graph}
        try:
            sess = ort.InferenceSession(data, providers=[("CUDAExecutionProvider", opts)])
            binding = sess.io_binding()
            keep = [ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(v), "cuda", 0) for v in feeds.values()]
            for name, v in zip(feeds, keep):
                binding.bind_ortvalue_input(name, v)
            for o in sess.get_outputs():
                binding.bind_output(o.name, "cuda", 0)
            sess.run_with_iobinding(binding)      # the graph mode captures on this first run
            binding.synchronize_outputs()
            run = lambda: sess.run_with_iobinding(binding)  # noqa: E731
            _event_times(stream, run, warmup)
            out[label] = _stats(_event_times(stream, run, iters))
        except Exception as e:  # noqa: BLE001 - report which peer failed and why, keep the others
            out[f"_{label} error"] = _failure(e)
    return out


def zoo_module(name: str, size: str):
    """The torch module of a zoo model, from its builder (same seeded weights as its ONNX file)."""
    here = os.path.abspath(__file__)   # <repo>/src/grapec/tools/bench.py
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(here))))
    models = os.path.join(root, "models")
    if not os.path.isfile(os.path.join(models, "zoo.py")):
        raise GrapecError(f"--vs torch builds the zoo's torch models from {models}/zoo.py, which is not there "
                          "(a grapec installed without its repository): run from a clone of it")
    sys.path.insert(0, models)
    import zoo
    module = zoo.get(name, size=size).module
    # The peers get PyTorch's default fast attention (SDPA), as its users would run it; the zoo's
    # export uses the eager path, which also cannot be captured into a CUDA graph (it copies a
    # host scalar to the GPU while building the mask).
    for m in module.modules():   # the zoo wraps the transformers model; find it
        if hasattr(m, "set_attn_implementation"):
            try:
                m.set_attn_implementation("sdpa")
            except Exception:  # noqa: BLE001 - keep eager where a model has no SDPA path
                if hasattr(getattr(m, "config", None), "_attn_implementation"):
                    m.config._attn_implementation = "sdpa"
            break
    return module


def measure_roofs(precision: str = "fp16", iters: int = 20) -> dict:
    """The device's measured ceilings, with torch on the current GPU: DRAM bandwidth (a 1 GiB
    device-to-device copy reads and writes each byte) and matrix peak (an 8192^3 matmul in the
    plan's precision; fp32 without TF32). -> {"bandwidth_gbs", "peak_tflops"}."""
    import torch
    nbytes = 1 << 30
    src, dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda"), torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision, torch.float32)
    n = 8192
    a, b = torch.randn(n, n, device="cuda", dtype=dtype), torch.randn(n, n, device="cuda", dtype=dtype)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    try:
        copy_ms = _torch_ms(lambda: dst.copy_(src), iters)
        mm_ms = _torch_ms(lambda: torch.matmul(a, b), iters)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return {"bandwidth_gbs": round(2 * nbytes / (copy_ms * 1e-3) / 1e9, 1),
            "peak_tflops": round(2 * n ** 3 / (mm_ms * 1e-3) / 1e12, 1)}


def torch_graph_us(fn, reps: int = 20, rounds: int = 15) -> float:
    """Median microseconds per call of a short torch call, captured as a CUDA graph of `reps` calls
    and replayed (launched one by one, such calls would time the launches)."""
    import statistics
    import torch
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for _ in range(reps):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / reps)
    return statistics.median(times)


def _torch_ms(fn, iters: int) -> float:
    """Median milliseconds of fn on the current stream, by CUDA events, after a warm-up."""
    import torch
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return float(np.median(times))
