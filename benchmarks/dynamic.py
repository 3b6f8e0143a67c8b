"""Every length of a range served by one bundle, against PyTorch's one CUDA graph per length: one
process, one GPU.

    python benchmarks/dynamic.py [--range 1:512] [--samples 1,8,64,128,256,384,512] [--max-graphs 8]
                                 [--torch-step 1] [--iterations 200] [--out DIR] [--cache DIR]
                                 [--parts memory,switch,replay,torch]

GPT-2 (full, fp16, batch 1) is compiled once with --dynamic seq=LO:HI. Then, in this process:
  memory   device memory taken by the session after building every length's graph at load
           (Session.build_graphs: its time, and the host memory the parked graphs hold) and running every length of the range once (weights,
           arena, the graphs kept, cuBLASLt workspaces), against weights + 1.2 x the largest arena +
           64 MiB, with the model's own weights (its initializers at fp16) and the bundle's; and PyTorch's one captured graph per length (every --torch-step-th length), with a
           private pool per graph and with one shared pool, beyond its weights;
  replay   at each sampled length: the range bundle's replay against a bundle compiled for that length
           alone (their ratio), and both outputs against onnxruntime (CPU, fp32);
  switch   the time of a run (outputs left on the device, then a synchronize) whose length still has
           its exec, of a length's first run (its graph built and patched into a kept exec), and of
           one whose exec was given back (its graph parked on the host, patched into a kept exec with
           cuGraphExecUpdate); the last minus the first is the switch.
Prints a table per part, and writes DIR/dynamic.json and DIR/dynamic.md. The bundles (the range's,
and one per sampled length compiled alone, in parallel processes before CUDA starts) are kept in
--cache, so a later call with other --parts skips compiling; DIR/dynamic.json keeps the parts
measured before.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from soak import rss_bytes  # noqa: E402 - the host memory reading soak.py takes
MIB = 2 ** 20


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--range", default="1:512")
    ap.add_argument("--samples", default="1,8,64,128,256,384,512")
    ap.add_argument("--max-graphs", type=int, default=8)
    ap.add_argument("--torch-step", type=int, default=1, help="capture every N-th length in PyTorch (0: none)")
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--out", default=os.path.join(ROOT, "out", "bench"))
    ap.add_argument("--cache", default=os.path.join(ROOT, "out", "bench", "dynamic-bundles"))
    ap.add_argument("--parts", default="memory,switch,replay,torch")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    lo, hi = (int(x) for x in a.range.split(":"))
    samples = [int(s) for s in a.samples.split(",") if lo <= int(s) <= hi]
    parts = a.parts.split(",")
    say = lambda m: print(f"[dynamic] {m}", file=sys.stderr, flush=True)  # noqa: E731
    model = _full_model("gpt2")
    ranged, singles, res = _bundles(model, lo, hi, samples, a.cache, os.path.join(a.out, "dynamic.json"), say)
    rng = np.random.default_rng(0)
    ids = {n: {"input_ids": rng.integers(0, 50257, (1, n)).astype(np.int64)} for n in range(lo, hi + 1)}

    def save():   # after each part: a run cut short keeps what it measured
        with open(os.path.join(a.out, "dynamic.json"), "w") as f:
            json.dump(res, f, indent=1)
    save()
    if "memory" in parts:
        res["memory"] = _grapec_memory(ranged, ids, a.max_graphs, res["model_weights_mib"], say)
        save()
    if "switch" in parts:
        res["switch"] = _switch_cost(ranged, ids, samples, a.max_graphs)
        save()
    if "replay" in parts:
        res["replay"] = _replays(ranged, singles, model, samples, ids, a.iterations, say)
        save()
    if "torch" in parts and a.torch_step:
        res["torch"] = _torch_graphs(range(lo, hi + 1, a.torch_step), ids, say)
        save()
    lines = _tables(res)
    print("\n".join(lines))
    with open(os.path.join(a.out, "dynamic.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def _compile_single(args):
    import grapec
    model, n, path = args
    t0 = time.perf_counter()
    grapec.compile(model, dims={"batch": 1, "seq": n}, precision="fp16", jobs=1).write(path)
    return time.perf_counter() - t0


def _bundles(model, lo, hi, samples, cache, results, say):
    """The range bundle and one bundle per sampled length, from the cache or compiled (before this
    process starts CUDA: the compiles fork). Returns them and the results so far."""
    import multiprocessing

    import grapec
    from grapec.bundle.format import Bundle
    os.makedirs(cache, exist_ok=True)
    res = {}
    if os.path.exists(results):
        with open(results) as f:
            res = json.load(f)
        if res.get("range") != [lo, hi]:
            res = {}
    path = os.path.join(cache, f"gpt2-seq{lo}-{hi}.grape")
    if not os.path.exists(path):
        t0 = time.perf_counter()
        grapec.compile(model, dims={"batch": 1}, dynamic={"seq": (lo, hi)}, precision="fp16", progress=say).write(path)
        res = {"compile_s": time.perf_counter() - t0}
    todo = [(model, n, os.path.join(cache, f"gpt2-seq{n}.grape")) for n in samples
            if not os.path.exists(os.path.join(cache, f"gpt2-seq{n}.grape"))]
    if todo:
        with multiprocessing.get_context("fork").Pool(min(len(todo), os.cpu_count() or 1)) as pool:
            times = pool.map(_compile_single, todo)
        say(f"compiled {len(todo)} single-length bundles, {max(times):.0f}s the longest")
    ranged = Bundle.read(path)
    singles = {n: Bundle.read(os.path.join(cache, f"gpt2-seq{n}.grape")) for n in samples}
    storage = ranged.storage()
    res.update({"range": [lo, hi], "bundle_mib": os.path.getsize(path) / MIB, "storage": storage,
                "weights_mib": len(ranged.weights) / MIB, "model_weights_mib": _model_weights_mib(model),
                "largest_arena_mib": ranged.largest_arena() / MIB})
    say(f"{hi - lo + 1} lengths: bundle {res['bundle_mib']:.1f} MiB, plans {storage['plan_bytes'] / 1024:.0f} KiB "
        f"in {storage['plan_templates']} templates" + (f", compiled in {res['compile_s']:.0f}s" if "compile_s" in res else ""))
    return ranged, singles, res


def _model_weights_mib(model) -> float:
    """The ONNX model's initializers, floats counted at fp16 (what the fp16 bundle would store with
    no copies)."""
    import onnx
    from onnx import TensorProto
    m = onnx.load(model, load_external_data=False)
    size = {TensorProto.FLOAT: 2, TensorProto.FLOAT16: 2, TensorProto.INT64: 8, TensorProto.INT32: 4}
    return sum(int(np.prod(t.dims)) * size.get(t.data_type, 1) for t in m.graph.initializer) / MIB


def _full_model(name):
    path = os.path.join(ROOT, "models", "full", f"{name}.onnx")
    if not os.path.exists(path):
        import subprocess
        subprocess.run([sys.executable, os.path.join(ROOT, "models", "build.py"), "--size", "full", "--out",
                        os.path.dirname(path), name], check=True)
    return path


def _grapec_memory(bundle, ids, max_graphs, model_weights_mib, say) -> dict:
    import grapec
    from grapec.runtime.cuda.driver import Device
    probe = Device(0)
    free0, _ = probe.mem_info()
    sess = grapec.load(bundle, backend="cuda", max_graphs=max_graphs)
    rss0, t0 = rss_bytes() / MIB, time.perf_counter()
    sess.build_graphs()   # every length's graph, as a service would at load; all but max_graphs parked on the host
    build_s, parked_mib = time.perf_counter() - t0, rss_bytes() / MIB - rss0
    t0 = time.perf_counter()
    for feeds in ids.values():
        sess.run(feeds)
    sweep_s = time.perf_counter() - t0
    sess._runner.synchronize()
    free1, _ = probe.mem_info()
    r = sess._runner
    used = (free0 - free1) / MIB
    limit = len(bundle.weights) / MIB + 1.2 * bundle.largest_arena() / MIB + 64
    model_limit = model_weights_mib + 1.2 * bundle.largest_arena() / MIB + 64
    say(f"graphs built at load in {build_s:.1f}s ({len(sess._runner._parked)} parked, host memory +{parked_mib:.0f} MiB); "
        f"every length once: {sweep_s:.1f}s, device memory {used:.0f} MiB (limit {model_limit:.0f} with the model's "
        f"weights, {limit:.0f} with the bundle's), {dict(r.switches)}")
    out = {"device_mib": used, "limit_mib": limit, "model_limit_mib": model_limit,
           "beyond_weights_mib": used - len(bundle.weights) / MIB,
           "sweep_s": sweep_s, "switches": dict(r.switches), "graphs_kept": len(r._built),
           "build_graphs_s": build_s, "parked": len(r._parked), "parked_host_mib": parked_mib}
    r.close()
    return out


def _replays(ranged, singles, model, samples, ids, iters, say) -> list:
    import grapec
    import onnxruntime as ort
    from grapec.tools.bench import bench_grapec
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    rows = []
    for n in samples:
        single = singles[n]
        want = ref.run(None, ids[n])[0]
        row = {"seq": n}
        for kind, bundle in (("range", ranged), ("single", single)):
            sess = grapec.load(bundle, backend="cuda")
            got = sess.run(ids[n])["logits"].astype(np.float32)
            sess._runner.close()
            row[f"{kind}_rel_err"] = float(np.linalg.norm(got - want) / np.linalg.norm(want))
            row[f"{kind}_ms"] = bench_grapec(bundle, ids[n], iters)["replay"]["median_ms"]
        row["range_over_single"] = row["range_ms"] / row["single_ms"]
        say(f"seq {n}: range {row['range_ms']:.4f} ms, single {row['single_ms']:.4f} ms "
            f"({row['range_over_single']:.3f}x), rel err {row['range_rel_err']:.1e} / {row['single_rel_err']:.1e}")
        rows.append(row)
    return rows


def _switch_cost(bundle, ids, samples, max_graphs) -> dict:
    """Time of a run to its outputs on the device: a length whose graph is kept; one run for the
    first time (its graph built, GEMMs tuned, then patched into the exec of the least recently run
    length); and one run again after its exec was given back (its graph parked on the host, patched
    in). The outputs stay on the device (on_device=True): the host copy of up to 100 MB of logits
    would hide the switch. Also the host memory the parked graphs hold."""
    import grapec
    sess = grapec.load(bundle, backend="cuda", max_graphs=max_graphs)
    r = sess._runner

    def timed(n):
        t0 = time.perf_counter()
        sess.run(ids[n], on_device=True)
        r.synchronize()
        return (time.perf_counter() - t0) * 1e3
    kept_ms, first_ms, again_ms = [], [], []
    cycle = sorted(set(samples + list(ids)[:: max(1, len(ids) // (3 * max_graphs))]))
    timed(cycle[0])
    rss0 = rss_bytes() / MIB
    for rep in range(3):
        for n in cycle:   # more lengths than graphs kept: each run switches
            (first_ms if rep == 0 else again_ms).append(timed(n))
            kept_ms.append(timed(n))
    kept, first, again = statistics.median(kept_ms), statistics.median(first_ms), statistics.median(again_ms)
    out = {"kept_run_ms": kept, "switch_run_ms": again, "switch_ms": again - kept,
           "first_run_ms": first, "first_switch_ms": first - kept,
           "parked": len(r._parked), "parked_host_mib": rss_bytes() / MIB - rss0,
           "switches": dict(r.switches), "lengths_cycled": len(cycle), "switch_host_us": r.switch_us}
    r.close()
    return out


def _torch_graphs(lengths, ids, say) -> dict:
    """PyTorch (fp16, SDPA) with one CUDA graph captured per length: device memory beyond the weights,
    with a private memory pool per graph and with one pool shared by all."""
    import torch
    from grapec.tools.bench import zoo_module
    out = {}
    for mode in ("private", "shared"):
        torch.cuda.empty_cache()
        free0, _ = torch.cuda.mem_get_info()
        module = zoo_module("gpt2", "full").half().cuda().eval()
        torch.cuda.synchronize()
        weights = (free0 - torch.cuda.mem_get_info()[0]) / MIB
        pool = torch.cuda.graph_pool_handle() if mode == "shared" else None
        graphs = []
        t0 = time.perf_counter()
        with torch.no_grad():
            for n in lengths:
                x = torch.from_numpy(ids[n]["input_ids"]).cuda()
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    module(x)
                torch.cuda.current_stream().wait_stream(s)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=pool):
                    y = module(x)
                graphs.append((g, x, y))
        torch.cuda.synchronize()
        used = (free0 - torch.cuda.mem_get_info()[0]) / MIB
        out[mode] = {"device_mib": used, "weights_mib": weights, "beyond_weights_mib": used - weights,
                     "graphs": len(graphs), "capture_s": time.perf_counter() - t0}
        say(f"torch {mode} pools: {len(graphs)} graphs, {used:.0f} MiB ({used - weights:.0f} beyond weights)")
        del graphs, module
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return out


def _tables(res) -> list:
    lo, hi = res["range"]
    took = f"compiled in {res['compile_s']:.0f}s, " if "compile_s" in res else ""
    lines = [f"GPT-2 fp16, batch 1, seq {lo}..{hi} ({hi - lo + 1} lengths): {took}"
             f"bundle {res['bundle_mib']:.1f} MiB (plans {res['storage']['plan_bytes'] / 1024:.0f} KiB in "
             f"{res['storage']['plan_templates']} templates), weights {res['weights_mib']:.0f} MiB, "
             f"largest arena {res['largest_arena_mib']:.1f} MiB"]
    m = res.get("memory")
    if m or res.get("torch"):
        lines += ["", "| device memory, every length run | MiB | beyond weights MiB |", "|---|---|---|"]
    if m:
        lines += [f"| grapec, one bundle ({m['graphs_kept']} graphs kept) | {m['device_mib']:.0f} | "
                  f"{m['beyond_weights_mib']:.0f} |"]
        if "model_limit_mib" in m:
            lines.append(f"| limit: model's weights ({res['model_weights_mib']:.0f}) + 1.2 x largest arena + 64 MiB | "
                         f"{m['model_limit_mib']:.0f} | |")
        lines.append(f"| limit: bundle's weights ({res['weights_mib']:.0f}) + 1.2 x largest arena + 64 MiB | "
                     f"{m['limit_mib']:.0f} | |")
    for mode, t in (res.get("torch") or {}).items():
        lines.append(f"| PyTorch, one graph per length ({t['graphs']}), {mode} pool{'s' if mode == 'private' else ''} "
                     f"| {t['device_mib']:.0f} | {t['beyond_weights_mib']:.0f} |")
    if res.get("replay"):
        lines += ["", "| seq | range bundle ms | single-shape bundle ms | range / single | rel err range, single |",
                  "|---|---|---|---|---|"]
        for r in res["replay"]:
            lines.append(f"| {r['seq']} | {r['range_ms']:.4f} | {r['single_ms']:.4f} | {r['range_over_single']:.3f} | "
                         f"{r['range_rel_err']:.1e}, {r['single_rel_err']:.1e} |")
    s = res.get("switch")
    if s:
        lines += ["", f"switch: a run to outputs on the device whose graph is kept {s['kept_run_ms']:.2f} ms; a length's "
                      f"first run (graph built, then patched into a kept exec) {s.get('first_run_ms', float('nan')):.2f} ms; "
                      f"a run whose graph is parked on the host and patched back {s['switch_run_ms']:.2f} ms (medians): "
                      f"a switch costs {s.get('switch_ms', s['switch_run_ms'] - s['kept_run_ms']):.2f} ms; "
                      f"{s['lengths_cycled']} lengths cycled, {s.get('parked', '?')} parked graphs holding "
                      f"{s.get('parked_host_mib', float('nan')):.1f} MiB of host memory ({s['switches']})"]
    if m and "build_graphs_s" in m:
        lines += ["", f"memory: every length's graph built at load in {m['build_graphs_s']:.1f} s, {m['parked']} of them "
                      f"parked on the host (host memory +{m['parked_host_mib']:.0f} MiB); then every length run once in "
                      f"{m['sweep_s']:.1f} s ({m['switches']})"]
    return lines


if __name__ == "__main__":
    main()
