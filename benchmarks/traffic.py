"""Requests of random length, as a service sees them: grapec's range bundle against the ideal and the
peers, one process, one GPU (issue 33's benchmark).

    python benchmarks/traffic.py [--model gpt2|bert] [--range 1:128] [--requests 2000] [--precision fp16]
                                 [--backend cuda] [--max-graphs 8] [--peers torch,compile,padded]
                                 [--baseline-own-execs] [--out DIR] [--cache DIR]

Two traffics of --requests each: lengths drawn uniformly from the range, and from a log-normal
(median 40 tokens, or 32000 samples, 2 s of 16 kHz audio, for wav2vec2; --median; sigma 0.8; clipped to the
range), in one seeded random order. Every request is
timed from its numpy input to its numpy output (wall time, the device synchronized), and also with its
output left on the device ("bound": grapec's IOBinding, a peer's output tensor not copied out). Outputs come
back through page-locked memory for every row, the peers' too (a pageable copy would time page faults). Rows:

  grapec range        one bundle compiled with --dynamic seq=LO:HI (`run`, numpy in and out); its
                      graphs built at load (Session.build_graphs) unless --lazy-graphs
  grapec range bound  the same, with device buffers bound (cuda only)
  grapec range, own execs   (--baseline-own-execs) the same bundle with an exec per length
                      (GRAPEC_SHARED_EXECS=0), as before the sizes of a launch structure shared one
  grapec range, length medians   the range bundle measured as the ideal is: each length's median
                      of 20 runs in a row (no switch between them), in the traffic's order
  ideal               each request's length run by a bundle compiled for that length alone: its
                      median of 20 runs in a row, once per length that occurs, in the traffic's order
  ideal in traffic    the traffic itself, each request run by its length's single-size bundle, all
                      of them loaded at once (--ideal-lengths: the K-length traffic)
  torch graphs        PyTorch, one CUDA graph per length, every graph kept (its memory reported)
  torch.compile       torch.compile(dynamic=True), no CUDA graphs
  padded to P         PyTorch, lengths padded to the next multiple of P (--pad-to: 64 tokens, or 1600
                      samples, 0.1 s of audio), one CUDA graph per bucket (what services do today;
                      audio padded without a mask: timed only, its outputs differ)
  PEER bound          each peer again, its output tensor left on the device (the counterpart of grapec's bound row)
A PyTorch peer that runs out of device memory (one graph per length of a range of 10^5 sizes) is reported
as failed, with how many graphs it held. --peer-requests times the peers on the first N requests of
each traffic (a graph captured per length costs about 0.1 s).

Prints mean, p50 and p99 latency (ms) per row and traffic, the device memory each took (MiB), the
ratios to the ideal, grapec's graph switches (runner.switches where the runner counts them) and the
mean host time of a switch (runner.switch_us).
A request slower than 100 ms is named as it happens (its length, its place in the traffic), and each traffic's
time is said when it ends, so a run that stalls shows where. Writes DIR/traffic.json and DIR/traffic.md. `--backend cpu` runs the grapec rows only, on the CPU
backend (a check that the script runs; its times say nothing about the GPU).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
MIB = 2 ** 20
LOGNORMAL_MEDIAN, LOGNORMAL_SIGMA = 40, 0.8
LOGNORMAL_MEDIAN_SAMPLES = 32000   # audio: 2 s at 16 kHz (40 would clip every request to a 0.1 s range's floor)


def traffics(lo: int, hi: int, n: int, seed: int = 0, median: int = LOGNORMAL_MEDIAN) -> dict:
    """name -> the request lengths, in arrival order."""
    rng = np.random.default_rng(seed)
    skewed = np.clip(np.rint(rng.lognormal(np.log(median), LOGNORMAL_SIGMA, n)), lo, hi)
    return {"uniform": [int(x) for x in rng.integers(lo, hi + 1, n)], "log-normal": [int(x) for x in skewed]}


def stats(times_s: list) -> dict:
    ms = sorted(t * 1e3 for t in times_s)
    return {"mean_ms": statistics.fmean(ms), "p50_ms": ms[len(ms) // 2], "p99_ms": ms[min(len(ms) - 1, int(0.99 * len(ms)))],
            "n": len(ms)}


def model_path(name: str, size: str) -> str:
    path = os.path.join(ROOT, "models", size, f"{name}.onnx")
    if not os.path.exists(path):
        import subprocess
        subprocess.run([sys.executable, os.path.join(ROOT, "models", "build.py"), "--size", size, "--out",
                        os.path.dirname(path), name], check=True)
    return path


def compile_range(path, dim, lo, hi, precision, cache, say, calibrate_at: int | None = None):
    import grapec
    from grapec.bundle.format import Bundle
    out = os.path.join(cache, f"{os.path.basename(path)[:-5]}-{precision}-{dim}{lo}-{hi}.grape")
    if not os.path.exists(out):
        t0 = time.perf_counter()
        grapec.compile(path, dims={"batch": 1}, dynamic={dim: (lo, hi)}, precision=precision, progress=say,
                       calibration_dims={dim: calibrate_at} if calibrate_at else None).write(out)
        say(f"range bundle compiled in {time.perf_counter() - t0:.0f}s")
    return Bundle.read(out)


def compile_singles(path, dim, lengths, precision, cache, calibrate_at: int | None = None) -> dict:
    """length -> its single-size bundle's file, each compiled in a process of its own, a few at a time
    with their BLAS threads split between them (16 compiles of full GPT-2 forked at once, each with
    every core's BLAS threads, did not finish in 9 minutes on a 16-core machine; one takes 18 s)."""
    import subprocess
    outs = {n: os.path.join(cache, f"{os.path.basename(path)[:-5]}-{precision}-{dim}{n}.grape") for n in lengths}
    todo = [(n, out) for n, out in outs.items() if not os.path.exists(out)]
    cores = os.cpu_count() or 1
    jobs = max(1, min(len(todo), cores // 4))
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, cores // jobs)), OPENBLAS_NUM_THREADS=str(max(1, cores // jobs)),
               PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "src"), os.environ.get("PYTHONPATH", "")]))
    running: list = []
    while todo or running:
        while todo and len(running) < jobs:
            n, out = todo.pop(0)
            calibration = {dim: calibrate_at} if calibrate_at and n > calibrate_at else None
            code = (f"import grapec; grapec.compile({path!r}, dims={{'batch': 1, {dim!r}: {n}}}, precision={precision!r}, "
                    f"jobs=1, calibration_dims={calibration!r}).write({out!r})")
            running.append(subprocess.Popen([sys.executable, "-c", code], env=env))
        p = running.pop(0)
        if p.wait() != 0:
            raise SystemExit(f"compiling a single-length bundle failed: {p.args[-1]}")
    return outs


@dataclass(frozen=True)
class ModelInput:
    """One input of a request of length n, shaped [1, n]: token ids below `vocab`, a mask of ones (a request
    has no padding of its own), or floats (audio samples)."""
    name: str
    kind: str            # "ids", "mask" or "float"
    vocab: int = 0

    def make(self, n: int, rng) -> np.ndarray:
        if self.kind == "ids":
            return rng.integers(0, self.vocab, (1, n)).astype(np.int64)
        if self.kind == "mask":
            return np.ones((1, n), np.int64)
        return rng.standard_normal((1, n)).astype(np.float32)

    def padded(self, a: np.ndarray, to: int) -> np.ndarray:
        """a padded to length `to`: zeros after it (a mask's zeros hide the padding from the real positions)."""
        out = np.zeros((1, to), a.dtype)
        out[:, :a.shape[1]] = a
        return out


def model_inputs(path: str) -> list:
    """The model's inputs as ModelInputs, in its order (a token id's vocabulary from the Gather it indexes)."""
    import onnx
    from grapec.bundle.inputs import value_ranges
    model = onnx.load(path, load_external_data=False)
    ranges = value_ranges(model)
    out = []
    for v in model.graph.input:
        if v.type.tensor_type.elem_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16):
            out.append(ModelInput(v.name, "float"))
        elif "mask" in v.name.lower():
            out.append(ModelInput(v.name, "mask"))
        else:
            out.append(ModelInput(v.name, "ids", ranges[v.name].hi + 1))
    return out


def feeds_for(n: int, inputs: list, rng) -> dict:
    return {i.name: i.make(n, rng) for i in inputs}


def sync(backend: str):
    if backend == "cuda":
        from cuda.bindings import runtime
        runtime.cudaDeviceSynchronize()


def time_grapec(sess, lengths, inputs, backend, bound: bool) -> dict:
    """-> latency stats of the traffic through one session."""
    return time_traffic(lambda n: sess, lengths, inputs, backend, bound)


def time_traffic(session_of, lengths, inputs, backend, bound: bool = False) -> dict:
    """The requests in the traffic's order, request i through session_of(its length): -> latency stats."""
    rng = np.random.default_rng(1)
    requests = [(n, feeds_for(n, inputs, rng)) for n in lengths]
    for n, f in requests[:20]:   # warm: the first lengths' graphs
        session_of(n).run(f)
    times = []
    slow = []   # (seconds, length) of requests past SLOW_S: named at the end, so a stalled run says where
    for n, f in requests:
        sess = session_of(n)
        t0 = time.perf_counter()
        run_once(sess, f, bound)
        sync(backend)
        times.append(time.perf_counter() - t0)
        if times[-1] > SLOW_S:
            slow.append((times[-1], n))
            if len(slow) <= 10 or len(slow) % 100 == 0:
                print(f"[traffic] request {len(times)} of {len(requests)} (length {n}) took {times[-1] * 1e3:.0f} ms "
                      f"({len(slow)} over {SLOW_S * 1e3:.0f} ms so far)", file=sys.stderr, flush=True)
    return stats(times)


SLOW_S = 0.1   # a request slower than this is reported as it happens


def run_once(sess, feeds: dict, bound: bool):
    """One request: numpy in and out, or (bound) through an IOBinding whose outputs stay on the device."""
    if not bound:
        sess.run(feeds)
        return
    binding = sess.io_binding()
    for k, v in feeds.items():
        binding.bind_input(k, v)
    for o in sess.get_outputs():
        binding.bind_output(o.name)
    sess.run_with_iobinding(binding)


def length_medians(session_of, lengths: list, inputs: list, backend: str, bound: bool = False) -> dict:
    """Each length that occurs run 5 times, then timed 20 times in a row (numpy in and out, or bound): -> the
    traffic's latencies as those medians, in the traffic's order. session_of(n) is called once a length."""
    rng = np.random.default_rng(2)
    per = {}
    for n in sorted(set(lengths)):
        sess = session_of(n)
        f = feeds_for(n, inputs, rng)
        for _ in range(5):
            run_once(sess, f, bound)
        ts = []
        for _ in range(20):
            t0 = time.perf_counter()
            run_once(sess, f, bound)
            sync(backend)
            ts.append(time.perf_counter() - t0)
        per[n] = statistics.median(ts)
    return stats([per[n] for n in lengths])


def ideal(singles: dict, lengths: list, inputs: list, backend: str, say, bound: bool = False) -> dict:
    """Each length's single-size bundle, loaded one at a time: its median latency (length_medians)."""
    import grapec
    opened = []

    def session_of(n):
        while opened:
            opened.pop().close()
        opened.append(grapec.load(singles[n], backend=backend))
        return opened[-1]
    out = length_medians(session_of, lengths, inputs, backend, bound)
    while opened:
        opened.pop().close()
    say(f"ideal: {len(set(lengths))} single-length bundles timed")
    return out


def ideal_in_traffic(singles: dict, lengths: list, inputs: list, backend: str) -> dict:
    """The traffic itself with every request run by its length's single-size bundle, all of them loaded
    at once (their graphs built at load): what the range bundle is measured under, less its switches."""
    import grapec
    sessions = {n: grapec.load(singles[n], backend=backend) for n in sorted(set(lengths))}
    for sess in sessions.values():
        sess.build_graphs()
    try:
        return time_traffic(sessions.__getitem__, lengths, inputs, backend)
    finally:
        for sess in sessions.values():
            sess.close()


def output_length(module):
    """n -> the output's length for an input of length n: Wav2Vec2's frames (its feature extractor's
    convolutions, from the transformers config), else n. Worked out once, outside the timed requests."""
    config = next((m.config for m in module.modules() if hasattr(getattr(m, "config", None), "conv_kernel")), None)
    convs = list(zip(config.conv_kernel, config.conv_stride)) if config is not None else []

    def length(n: int) -> int:
        for k, st in convs:
            n = (n - k) // st + 1
        return n
    return length


class PeerOutOfMemory(Exception):
    """A peer's graphs filled the device; its message says at which graph and how much they held."""


def torch_rows(name: str, inputs: list, lengths_by_traffic: dict, precision: str, peers: list, say,
               pad_to: int = 64) -> dict:
    """PyTorch peers on the zoo module's weights: one CUDA graph per length, torch.compile(dynamic=True),
    and padding to multiples of 64 with one graph per bucket. The module takes `inputs` in order; where it
    returns several outputs, the first is the one copied out. Memory: what torch's caching allocator holds
    (memory_reserved) beyond what it held before, the graphs' private pools included (memory_allocated
    leaves out what a captured graph freed inside its pool, which stays held for its replays)."""
    import torch
    from grapec.tools.bench import zoo_module
    module = zoo_module(name, "full").cuda().eval()
    if precision == "fp16":
        module = module.half()
    half = precision == "fp16"
    out = {}
    all_lengths = sorted({n for ls in lengths_by_traffic.values() for n in ls})

    def first(y):
        return y[0] if isinstance(y, (tuple, list)) else y

    def to_device(arrays):
        return [torch.from_numpy(a).cuda().half() if half and a.dtype == np.float32 else torch.from_numpy(a).cuda()
                for a in arrays]

    def graphs_for(lengths):
        kept = {}
        # an earlier peer's graphs may wait for the cycle collector: freed during this capture, they made the
        # padded peer's BERT memory read -2 MiB (session 57)
        gc.collect()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_reserved()
        rng = np.random.default_rng(5)
        for n in lengths:
            try:
                xs = to_device([i.make(n, rng) for i in inputs])
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s), torch.no_grad():
                    module(*xs)
                torch.cuda.current_stream().wait_stream(s)
                g = torch.cuda.CUDAGraph()
                with torch.no_grad(), torch.cuda.graph(g):
                    y = first(module(*xs))
            except torch.cuda.OutOfMemoryError:
                held, count = (torch.cuda.memory_reserved() - base) / MIB, len(kept)
                kept.clear()
                torch.cuda.empty_cache()
                raise PeerOutOfMemory(f"out of device memory at graph {count + 1} of {len(lengths)} "
                                      f"({held:.0f} MiB held)") from None
            kept[n] = (g, xs, y)
        torch.cuda.synchronize()
        return kept, (torch.cuda.memory_reserved() - base) / MIB

    pinned = []   # one page-locked buffer, grown to the largest output: grapec's outputs land in page-locked blocks too

    def to_host(y):
        """The output as numpy through a page-locked buffer: a fresh pageable array per request faults in its
        pages (GPT-2's logits at 512 tokens are 100 MiB) and would time the host's page faults, not the peer."""
        y = y.float()
        if not pinned or pinned[0].numel() < y.numel():
            pinned[:] = [torch.empty(y.numel(), dtype=torch.float32, pin_memory=True)]
        host = pinned[0][:y.numel()].view(y.shape)
        host.copy_(y)
        return host.numpy()

    def timed(fn, lengths):
        rng = np.random.default_rng(1)
        requests = [[i.make(n, rng) for i in inputs] for n in lengths]
        times = []
        for arrays in requests:
            t0 = time.perf_counter()
            fn(arrays)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        return stats(times)

    def rows(name, run, run_bound, mib):
        """The peer's row (numpy in and out) and its bound row (numpy in, the output left on the device)."""
        run([i.make(all_lengths[-1], np.random.default_rng(7)) for i in inputs])   # the page-locked buffer at its largest
        out[name] = {t: dict(timed(run, ls), memory_mib=mib) for t, ls in lengths_by_traffic.items()}
        out[name + " bound"] = {t: timed(run_bound, ls) for t, ls in lengths_by_traffic.items()}

    if "torch" in peers:
        try:
            kept, mib = graphs_for(all_lengths)
        except PeerOutOfMemory as e:
            say(f"torch graphs: {e}")
            out["torch graphs"] = {"failed": str(e)}
            peers = [p for p in peers if p != "torch"]
            kept = None
    if "torch" in peers:
        say(f"torch: {len(kept)} graphs captured, {mib:.0f} MiB")

        def run_bound(arrays):
            g, xs, y = kept[arrays[0].shape[1]]
            for x, a in zip(xs, arrays):
                x.copy_(torch.from_numpy(a))
            g.replay()
            return y
        rows("torch graphs", lambda arrays: to_host(run_bound(arrays)), run_bound, mib)
        del kept
        torch.cuda.empty_cache()
    if "padded" in peers:
        buckets = sorted({-(-n // pad_to) * pad_to for n in all_lengths})
        kept, mib = graphs_for(buckets)
        out_length = output_length(module)

        def run_bound(arrays):
            n = arrays[0].shape[1]
            g, xs, y = kept[-(-n // pad_to) * pad_to]
            for x, i, a in zip(xs, inputs, arrays):
                # GPT-2 is causal and BERT's mask hides the padding: positions < n are unchanged by it
                x.copy_(torch.from_numpy(i.padded(a, x.shape[1])))
            g.replay()
            return y[:, :out_length(n)]
        rows(f"padded to {pad_to}", lambda arrays: to_host(run_bound(arrays)), run_bound, mib)
        del kept
        torch.cuda.empty_cache()
    if "compile" in peers:
        cm = torch.compile(module, dynamic=True)
        base = torch.cuda.memory_reserved()

        def run_bound(arrays):
            with torch.no_grad():
                return first(cm(*to_device(arrays)))
        rng = np.random.default_rng(6)
        for n in all_lengths[:: max(1, len(all_lengths) // 8)]:   # warm: the compile happens here, not timed
            to_host(run_bound([i.make(n, rng) for i in inputs]))
        rows("torch.compile", lambda arrays: to_host(run_bound(arrays)), run_bound, None)
        for st in out["torch.compile"].values():   # read after the traffic: dynamic shapes grow the cache as they come
            st["memory_mib"] = (torch.cuda.memory_reserved() - base) / MIB
    return out


def _free_device_bytes(backend: str):
    """Free device memory (None on the CPU backend)."""
    if backend != "cuda":
        return None
    from grapec.runtime.cuda.driver import Device
    return Device(0).mem_info()[0]


EVERY_LENGTH_AT_MOST = 4096


def once_lengths(lo: int, hi: int) -> list:
    """The lengths run once before memory is read: every one, or in a range of more than
    EVERY_LENGTH_AT_MOST (Wav2Vec2's 158401 samples), an even spread of that many with both ends."""
    if hi - lo + 1 <= EVERY_LENGTH_AT_MOST:
        return list(range(lo, hi + 1))
    return sorted({int(round(x)) for x in np.linspace(lo, hi, EVERY_LENGTH_AT_MOST)})


def every_length_once(sess, lengths: list, inputs: list):
    rng = np.random.default_rng(4)
    slow = 0
    for i, n in enumerate(lengths):
        t0 = time.perf_counter()
        sess.run(feeds_for(n, inputs, rng))
        if time.perf_counter() - t0 > SLOW_S:
            slow += 1
            if slow <= 10 or slow % 100 == 0:
                print(f"[traffic] length {n} ({i + 1} of {len(lengths)} run once) took "
                      f"{(time.perf_counter() - t0) * 1e3:.0f} ms ({slow} over {SLOW_S * 1e3:.0f} ms so far)",
                      file=sys.stderr, flush=True)


def check_against_onnxruntime(sess, path: str, lo: int, hi: int, k: int, inputs: list, precision: str, say) -> list:
    """k lengths drawn at random over the range (in the order drawn), each run through the session and
    through onnxruntime (CPU, float32) on the same fresh inputs, every output judged by `grapec check`'s
    measure (compiler/accuracy.py: ||out-ref||/||ref|| in half, allclose in float32)."""
    import onnxruntime as ort
    from grapec.compiler.accuracy import check_limits, compare
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(33)
    atol, rtol, limit = check_limits(precision)
    out = []
    for n in (int(x) for x in rng.integers(lo, hi + 1, k)):
        feeds = feeds_for(n, inputs, rng)
        got = sess.run(feeds)
        want = dict(zip([o.name for o in ref.get_outputs()], ref.run(None, feeds)))
        for name, w in want.items():
            c = compare(name, np.asarray(got[name], np.float32), np.asarray(w, np.float32), atol, rtol, limit,
                        elementwise=limit is None)
            out.append({"length": n, "output": name, "rel_l2": c.rel, "max_abs": c.max_abs, "ok": bool(c.ok),
                        "allclose_5e-2": bool(np.allclose(got[name], w, atol=5e-2, rtol=5e-2))})
        say(f"check: length {n}: " + ", ".join(f"{c['output']} rel L2 {c['rel_l2']:.2e} max abs {c['max_abs']:.2e}"
                                               f"{'' if c['ok'] else ' FAILS'}" for c in out[-len(want):]))
    return out


def memory_limit_mib(bundle) -> float:
    """Issue 33's bound on a range bundle's device memory: its weights + 1.2 x the largest arena + 64 MiB."""
    # the manifest's arena sizes: joining every size's plan to read it took over 8 minutes for Wav2Vec2's 158401
    return (bundle.weights_nbytes + 1.2 * bundle.largest_arena()) / MIB + 64


def _checks_line(checks: list) -> str:
    lengths = sorted({c["length"] for c in checks})
    bad = [c for c in checks if not c["ok"]]
    return (f" Against onnxruntime (CPU, float32) at {len(lengths)} random lengths: rel L2 "
            f"{min(c['rel_l2'] for c in checks):.2e}..{max(c['rel_l2'] for c in checks):.2e}, max abs up to "
            f"{max(c['max_abs'] for c in checks):.2e}, allclose(5e-2) at {sum(c['allclose_5e-2'] for c in checks)} of "
            f"{len(checks)} outputs; " + ("every output passes check's measure." if not bad else
                                          f"FAILS at {sorted({c['length'] for c in bad})}."))


def table(res: dict) -> list:
    lines = [f"{res['model']} {res['precision']}, {res.get('dim', 'seq')} {res['range'][0]}..{res['range'][1]}, {res['requests']} requests "
             f"per traffic, {res['backend']}. Latency of one request, numpy in and out unless bound; ratio = row / ideal (a bound row's: / the ideal's bound row). "
             f"grapec's graphs {res.get('graphs', 'lazy')} (load {res.get('load_s', float('nan')):.2f} s); "
             f"switches {res.get('switches')} (execs instantiated after load, on requests: "
             f"{res.get('instantiated_on_requests', 'not counted')}); mean host time of a switch, us (runner.switch_us): {res.get('switch_us')}. "
             f"grapec's memory limit (weights + 1.2 x the largest arena + 64 MiB): {res.get('memory_limit_mib', 0):.0f} MiB, "
             f"its memory column the free device memory its session took (the weights, {res.get('weights_mib', 0):.0f} MiB, "
             f"included); a PyTorch row's, what torch reserved beyond the model already loaded (weights not counted), "
             f"read after {res.get('ran_once', 'every')} lengths ran once."
             + (f" The PyTorch rows timed the first {res['peer_requests']} requests of each traffic."
                if res.get("peer_requests") else "")
             + (_checks_line(res["checks"]) if res.get("checks") else "")
             + (f" Outputs of at least 1 MiB copied into {res['host_blocks']} page-locked block(s), "
                f"{res['host_pageable']} into pageable arrays (the pool full)." if "host_blocks" in res else ""),
             "", "| row | traffic | mean ms | p50 ms | p99 ms | mean / ideal | p99 / ideal | memory MiB |",
             "|---|---|---|---|---|---|---|---|"]
    for row, per in res["rows"].items():
        if "failed" in per:
            lines.append(f"| {row} | all | failed: {per['failed']} | | | | | {per.get('memory_mib', 0):.0f} |")
            continue
        for traffic, s in per.items():
            ideal_row = "ideal bound" if "bound" in row and "ideal bound" in res["rows"] else "ideal"
            ide = res["rows"].get(ideal_row, {}).get(traffic)
            mem = s.get("memory_mib")
            ratio = (f"{s['mean_ms'] / ide['mean_ms']:.2f}x | {s['p99_ms'] / ide['p99_ms']:.2f}x" if ide else "- | -")
            lines.append(f"| {row} | {traffic} | {s['mean_ms']:.3f} | {s['p50_ms']:.3f} | {s['p99_ms']:.3f} | {ratio} | "
                         f"{'' if mem is None else f'{mem:.0f}'} |")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--dim", default=None, help="the model's length dim (default: samples for wav2vec2, else seq)")
    ap.add_argument("--size", default="full", choices=["tiny", "full"])
    ap.add_argument("--range", default="1:128")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--backend", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--max-graphs", type=int, default=None)
    ap.add_argument("--peers", default="torch,compile,padded")
    ap.add_argument("--no-ideal", action="store_true", help="skip the ideal row (and compiling a bundle per length)")
    ap.add_argument("--ideal-lengths", type=int, default=None, metavar="K",
                    help="compile single-length bundles for K lengths spread over the range only (a bundle per length of "
                         "a 1:512 range does not fit a disk), and add a third traffic drawn uniformly from those K "
                         "lengths, the one the ideal row is measured on")
    ap.add_argument("--only-peers", action="store_true", help="time the PyTorch peers only (no grapec rows, no compile)")
    ap.add_argument("--compile-only", action="store_true",
                    help="compile the range and single-length bundles into --cache, then stop (a later run times them)")
    ap.add_argument("--singles-only", action="store_true",
                    help="compile the single-length bundles into --cache, then stop (another process compiles the range)")
    ap.add_argument("--calibrate-at", type=int, default=None, metavar="N",
                    help="calibrate fp16 at this length instead of the range's longest (grapec.compile calibration_dims): "
                         "full Wav2Vec2 at 160000 samples took 117 s of the numpy interpreter on 2 cores")
    ap.add_argument("--baseline-own-execs", action="store_true",
                    help="also run the range bundle with an exec per length (GRAPEC_SHARED_EXECS=0), as before shared execs")
    ap.add_argument("--baseline-spare", action="store_true",
                    help="also time grapec with an exec per length and GRAPEC_SPARE_BY_SHAPE=0: the exec patched at a "
                         "switch is the least recently run one's, whatever its graph's shape")
    ap.add_argument("--band-ratios", default="", metavar="R,..",
                    help="also time the range with each of these GRAPEC_BAND_RATIO values (0: one exec per launch "
                         "structure; runtime/cuda/shared_exec.py size_band)")
    ap.add_argument("--lazy-graphs", action="store_true",
                    help="build each length's graph at its first request instead of at load (Session.build_graphs)")
    ap.add_argument("--out", default=os.path.join(ROOT, "out", "bench"))
    ap.add_argument("--cache", default=os.path.join(ROOT, "out", "bench", "traffic-bundles"))
    ap.add_argument("--pad-to", type=int, default=None,
                    help="the padded peer's multiple (default 64 tokens, or 1600 samples for wav2vec2)")
    ap.add_argument("--peer-requests", type=int, default=None, metavar="N",
                    help="time the PyTorch peers on the first N requests of each traffic (default: all)")
    ap.add_argument("--check", type=int, default=0, metavar="K",
                    help="also run K random lengths through the range bundle and onnxruntime (CPU, float32) and "
                         "compare every output (after the first row's timings, so they do not disturb them)")
    ap.add_argument("--median", type=int, default=None,
                    help=f"the log-normal traffic's median length (default {LOGNORMAL_MEDIAN} tokens, "
                         f"{LOGNORMAL_MEDIAN_SAMPLES} for the samples of wav2vec2)")
    a = ap.parse_args()
    import grapec
    say = lambda m: print(f"[traffic] {m}", file=sys.stderr, flush=True)  # noqa: E731
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.cache, exist_ok=True)
    lo, hi = (int(x) for x in a.range.split(":"))
    a.dim = a.dim or ("samples" if a.model == "wav2vec2" else "seq")
    path = model_path(a.model, a.size)
    median = a.median or (LOGNORMAL_MEDIAN_SAMPLES if a.dim == "samples" else LOGNORMAL_MEDIAN)
    lengths = traffics(lo, hi, a.requests, median=median)
    inputs = model_inputs(path)
    if a.ideal_lengths:
        sampled = sorted({int(round(x)) for x in np.linspace(lo, hi, a.ideal_lengths)})
        lengths[f"uniform over {len(sampled)} lengths"] = [int(x) for x in np.random.default_rng(3).choice(sampled, a.requests)]
        used = sampled
    else:
        used = sorted({n for ls in lengths.values() for n in ls})
    res = {"model": a.model, "dim": a.dim, "precision": a.precision, "range": [lo, hi], "requests": a.requests,
           "backend": a.backend, "rows": {}}
    if a.only_peers:
        a.no_ideal = True
    singles = {} if a.no_ideal else compile_singles(path, a.dim, used, a.precision, a.cache,
                                                            a.calibrate_at)   # forks: before CUDA starts
    if a.singles_only:
        say(f"compiled: {len(singles)} single-length bundles in {a.cache}")
        return
    ranged = None if a.only_peers else compile_range(path, a.dim, lo, hi, a.precision, a.cache, say,
                                                          a.calibrate_at)
    if a.compile_only:
        say(f"compiled: the range and {len(singles)} single-length bundles in {a.cache}")
        return
    options = {} if a.max_graphs is None or a.backend == "cpu" else {"max_graphs": a.max_graphs}
    # each row's environment: one exec per launch structure by default (runtime/cuda/shared_exec.py);
    # the baselines give each length its own exec (an LRU of max_graphs, parked graphs patched in)
    variants = [("grapec range", {"GRAPEC_SHARED_EXECS": "1", "GRAPEC_SPARE_BY_SHAPE": "1"})]
    if a.baseline_own_execs:
        variants.append(("grapec range, own execs", {"GRAPEC_SHARED_EXECS": "0", "GRAPEC_SPARE_BY_SHAPE": "1"}))
    if a.baseline_spare:
        variants.append(("grapec range, own execs, LRU spare", {"GRAPEC_SHARED_EXECS": "0", "GRAPEC_SPARE_BY_SHAPE": "0"}))
    for ratio in filter(None, a.band_ratios.split(",")):
        variants.append((f"grapec range, band ratio {ratio}", {"GRAPEC_SHARED_EXECS": "1", "GRAPEC_BAND_RATIO": ratio}))
    for row, env in ([] if a.only_peers else variants):
        os.environ.update(env)
        free0 = _free_device_bytes(a.backend)
        t0 = time.perf_counter()
        sess = grapec.load(ranged, backend=a.backend, **options)
        if not a.lazy_graphs:
            def progress(done, total, t0=t0, every=[0]):   # a line per tenth: a long load shows where it is
                if done * 10 // max(total, 1) > every[0] or done == total:
                    every[0] = done * 10 // max(total, 1)
                    say(f"{row}: graphs built {done} of {total}, {time.perf_counter() - t0:.0f}s")
            sess.build_graphs(progress)
        res.setdefault("load_s", time.perf_counter() - t0)
        at_load = dict(getattr(sess._runner, "switches", {}))
        once = once_lengths(lo, hi)
        res["ran_once"] = len(once)
        t1 = time.perf_counter()
        every_length_once(sess, once, inputs)   # the memory read below is after every size ran (or a spread)
        say(f"{row}: {len(once)} lengths run once in {time.perf_counter() - t1:.1f}s")
        res["rows"][row] = {}
        for t, ls in lengths.items():
            t1 = time.perf_counter()
            res["rows"][row][t] = time_grapec(sess, ls, inputs, a.backend, False)
            say(f"{row}: traffic '{t}' in {time.perf_counter() - t1:.1f}s, mean {res['rows'][row][t]['mean_ms']:.2f} ms")
        if row.startswith("grapec range") and "own execs" not in row and not a.no_ideal:   # measured as the ideal is
            res["rows"][row + ", length medians"] = {t: length_medians(lambda n: sess, ls, inputs, a.backend)
                                                     for t, ls in lengths.items() if set(ls) <= set(singles)}
            if a.backend == "cuda":   # the device's work alone: the ideal's bound row is its counterpart
                res["rows"][row + " bound, length medians"] = {
                    t: length_medians(lambda n: sess, ls, inputs, a.backend, bound=True)
                    for t, ls in lengths.items() if set(ls) <= set(singles)}
        used = None if free0 is None else (free0 - _free_device_bytes(a.backend)) / MIB
        for st in res["rows"][row].values():
            st["memory_mib"] = used
        if a.check and row == variants[0][0]:
            res["checks"] = check_against_onnxruntime(sess, path, lo, hi, a.check, inputs, a.precision, say)
            save(res, a.out)
        if a.backend == "cuda":
            pool = getattr(sess._runner, "host_arrays", None)
            if pool is not None:
                res["host_blocks"], res["host_pageable"] = pool.allocated, pool.pageable
            res["rows"][row + " bound"] = {t: time_grapec(sess, ls, inputs, a.backend, True) for t, ls in lengths.items()}
            res.setdefault("switches", {})[row] = dict(getattr(sess._runner, "switches", {}))
            # the acceptance's "no graph built on the request path": execs made after load, over every request
            res.setdefault("instantiated_on_requests", {})[row] = (res["switches"][row].get("instantiated", 0)
                                                                   - at_load.get("instantiated", 0))
            res.setdefault("switch_us", {})[row] = sess._runner.switch_us
        sess.close()
        os.environ.pop("GRAPEC_BAND_RATIO", None)
    for key in ("GRAPEC_SHARED_EXECS", "GRAPEC_SPARE_BY_SHAPE"):
        os.environ.pop(key, None)
    if ranged is not None:
        res["graphs"] = "lazy" if a.lazy_graphs else "built at load"
        res["memory_limit_mib"] = memory_limit_mib(ranged)
        res["weights_mib"] = ranged.weights_nbytes / MIB
    save(res, a.out)
    if not a.no_ideal:
        res["rows"]["ideal"] = {t: ideal(singles, ls, inputs, a.backend, say) for t, ls in lengths.items()
                                if set(ls) <= set(singles)}
        save(res, a.out)
        if a.backend == "cuda":
            res["rows"]["ideal bound"] = {t: ideal(singles, ls, inputs, a.backend, say, bound=True)
                                          for t, ls in lengths.items() if set(ls) <= set(singles)}
            save(res, a.out)
        res["rows"]["ideal in traffic"] = {t: ideal_in_traffic(singles, ls, inputs, a.backend)
                                           for t, ls in lengths.items() if set(ls) <= set(singles)}
        save(res, a.out)
    if a.backend == "cuda" and a.peers:
        pad_to = a.pad_to or (1600 if a.dim == "samples" else 64)
        peer_lengths = {t: ls[:a.peer_requests] for t, ls in lengths.items()}
        if a.peer_requests:
            res["peer_requests"] = a.peer_requests
        for peer in a.peers.split(","):   # saved after each: a run cut short keeps what it measured
            res["rows"].update(torch_rows(a.model, inputs, peer_lengths, a.precision, [peer], say, pad_to))
            save(res, a.out)
    print("\n".join(table(res)))


def save(res: dict, out: str):
    with open(os.path.join(out, "traffic.json"), "w") as f:
        json.dump(res, f, indent=1)
    with open(os.path.join(out, "traffic.md"), "w") as f:
        f.write("\n".join(table(res)) + "\n")


if __name__ == "__main__":
    main()
