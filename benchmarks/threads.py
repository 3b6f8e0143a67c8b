"""Throughput of one model served from 8 threads on one GPU: grapec's ways of sharing it, and the
peers called the same way, in one process.

    python benchmarks/threads.py [--only gpt2-s8,bert-s128] [--precision fp16] [--threads 8]
                                 [--seconds 4] [--out DIR]

Every thread calls `run` with its own inputs (numpy in, numpy out: the inputs copied in, the
outputs copied out, as a service does) for --seconds. grapec is measured as:
    1 thread               one session, one caller (the latency baseline)
    lock                   one session with one runner (concurrency=1): runs take turns
    pool of N              one session with N runners (concurrency=N): N arenas, streams and sets of
                           graphs over one copy of the weights
    a session per thread   8 sessions: 8 copies of the weights
The peers from 8 threads: PyTorch eager (each thread on its own CUDA stream) and onnxruntime's CUDA
provider (one InferenceSession, whose run is thread-safe) where onnxruntime-gpu is installed.

For each: runs per second, its ratio to the lock, the device memory it took, and for grapec how many
outputs differed from the single-threaded output for the same input (must be 0, bit for bit).
Writes DIR/threads.json and DIR/table.md.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
MIB = 2 ** 20
CONFIGS = {"gpt2-s8": ("gpt2", {"batch": 1, "seq": 8}), "gpt2-s128": ("gpt2", {"batch": 1, "seq": 128}),
           "bert-s128": ("bert", {"batch": 1, "seq": 128})}
POOLS = (2, 4, 8)


def zoo_benchmark():
    """benchmarks/zoo.py as a module (its name would clash with models/zoo.py, which the peers import)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("zoo_benchmark", os.path.join(ROOT, "benchmarks", "zoo.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def drive(call, feeds: list, seconds: float, threads: int) -> tuple:
    """call(thread, feeds) from `threads` threads for `seconds` after a warm-up; -> (runs/s, errors)."""
    stop, counts, errors = threading.Event(), [0] * threads, []
    start = threading.Barrier(threads + 1)

    def worker(t):
        try:
            call(t, feeds[t])   # warm: graphs built, streams made
            start.wait()
            while not stop.is_set():
                call(t, feeds[t])
                counts[t] += 1
        except Exception as e:  # noqa: BLE001 - counted and reported
            errors.append(f"thread {t}: {type(e).__name__}: {e}")
            start.abort()
    workers = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(threads)]
    for w in workers:
        w.start()
    try:
        start.wait()
    except threading.BrokenBarrierError:
        pass
    t0 = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for w in workers:
        w.join()
    return sum(counts) / (time.perf_counter() - t0), errors


class GpuMemory:
    """Free device memory, read through the driver (torch's allocator does not see grapec's)."""

    def __init__(self):
        from grapec.runtime.cuda.driver import Device
        self.dev = Device(0)

    def used_since(self, free0: int) -> float:
        self.dev.synchronize()
        return (free0 - self.dev.mem_info()[0]) / MIB

    def free(self) -> int:
        return self.dev.mem_info()[0]


def measure_grapec(bundle, feeds, refs, a, mem) -> list:
    import grapec
    rows = []
    options = [("1 thread", 1, 1, 1), ("lock (concurrency=1)", a.threads, 1, 1)]
    options += [(f"pool of {n} (concurrency={n})", a.threads, n, 1) for n in POOLS]
    options += [(f"a session per thread ({a.threads})", a.threads, 1, a.threads)]
    for label, threads, concurrency, sessions in options:
        free0 = mem.free()
        sess = [grapec.load(bundle, backend="cuda", concurrency=concurrency) for _ in range(sessions)]
        wrong = [0]

        def call(t, f, sess=sess):
            out = sess[t % len(sess)].run(f)
            if any(not np.array_equal(out[k], refs[t][k]) for k in out):
                wrong[0] += 1
        rate, errors = drive(call, feeds, a.seconds, threads)
        rows.append({"option": label, "threads": threads, "runs_per_s": rate, "device_mib": mem.used_since(free0),
                     "mismatches": wrong[0], "errors": errors[:3]})
        print(f"  {label:34s} {rate:9.0f} runs/s  {rows[-1]['device_mib']:8.1f} MiB  mismatches {wrong[0]}", flush=True)
        for s in sess:
            s.close()
    return rows


def measure_torch(name, feeds, a, mem) -> dict:
    import torch
    from grapec.tools.bench import zoo_module
    free0 = mem.free()
    module = zoo_module(name, "full").to("cuda").eval()
    if a.precision == "fp16":
        module = module.half()
    streams = [torch.cuda.Stream() for _ in range(a.threads)]

    def call(t, f):
        with torch.no_grad(), torch.cuda.stream(streams[t]):
            args = [torch.from_numpy(v).to("cuda", non_blocking=False) for v in f.values()]
            out = module(*args)
            out = out[0] if isinstance(out, (tuple, list)) else out
            out.cpu()
    rate, errors = drive(call, feeds, a.seconds, a.threads)
    row = {"option": "torch eager, a stream per thread", "threads": a.threads, "runs_per_s": rate,
           "device_mib": mem.used_since(free0), "errors": errors[:3]}
    module.cpu()   # its weights leave the GPU before the next measurement
    torch.cuda.empty_cache()
    return row


def measure_ort(path, feeds, a, mem) -> dict | None:
    from grapec.tools.bench import ort_cuda_available
    if not ort_cuda_available()[0]:
        return None
    import onnxruntime as ort
    from grapec.frontend.onnx_import import load_model
    proto = load_model(path)
    if a.precision == "fp16":
        from grapec.frontend.precision import to_fp16
        proto = to_fp16(proto)
    free0 = mem.free()
    sess = ort.InferenceSession(proto.SerializeToString(), providers=[("CUDAExecutionProvider", {"device_id": "0"})])
    rate, errors = drive(lambda t, f: sess.run(None, f), feeds, a.seconds, a.threads)
    row = {"option": "onnxruntime CUDA, one session", "threads": a.threads, "runs_per_s": rate,
           "device_mib": mem.used_since(free0), "errors": errors[:3]}
    return row   # the session goes with this frame


def render(results: dict) -> str:
    lines = []
    for label, rows in results.items():
        base = next(r["runs_per_s"] for r in rows if r["option"].startswith("lock"))
        lines += [f"### {label}", "", "| option | threads | runs/s | x lock | device MiB | mismatches |", "|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['option']} | {r['threads']} | {r['runs_per_s']:.0f} | {r['runs_per_s'] / base:.2f} | "
                         f"{r['device_mib']:.0f} | {r.get('mismatches', '-')} |")
        lines.append("")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(CONFIGS))
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--out", default=os.path.join(ROOT, "out", "threads"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    import grapec
    from grapec.bundle.inputs import bundle_inputs
    full_model = zoo_benchmark().full_model
    mem = GpuMemory()
    results = {}
    for label in a.only.split(","):
        name, dims = CONFIGS[label]
        path = full_model(name)
        print(f"{label} {a.precision}: compiling", flush=True)
        bundle = grapec.compile(path, dims=dims, precision=a.precision)
        feeds = [bundle_inputs(bundle.manifest, 0, seed=t) for t in range(a.threads)]
        ref_sess = grapec.load(bundle, backend="cuda")
        refs = [ref_sess.run(f) for f in feeds]
        ref_sess.close()
        rows = measure_grapec(bundle, feeds, refs, a, mem)
        for peer in (measure_torch(name, feeds, a, mem), measure_ort(path, feeds, a, mem)):
            if peer is not None:
                rows.append(peer)
                print(f"  {peer['option']:34s} {peer['runs_per_s']:9.0f} runs/s  {peer['device_mib']:8.1f} MiB "
                      f"{peer['errors'] or ''}", flush=True)
        results[f"{label}/{a.precision}"] = rows
        with open(os.path.join(a.out, "threads.json"), "w") as f:
            json.dump({"device": mem.dev.name, "threads": a.threads, "seconds": a.seconds, "results": results}, f, indent=1)
    table = f"{mem.dev.name}, {a.threads} threads, {a.seconds:.0f} s each, numpy in and out\n\n" + render(results)
    with open(os.path.join(a.out, "table.md"), "w") as f:
        f.write(table)
    print(table)


if __name__ == "__main__":
    main()
