"""BERT's range: its launch structures (which lengths share an exec, and what varies in a switch), and each
length's time with GEMMs run at their structure's widest M (the default) and at their own M."""
import os, statistics, sys, time
from collections import defaultdict
import numpy as np
sys.path.insert(0, "benchmarks")
import grapec
from grapec.plan import KernelStep
from traffic import compile_range, compile_singles, model_inputs, model_path, feeds_for, sync

path = model_path("bert", "full")
cache = "out/bench/traffic-bundles"
say = lambda m: print(m, file=sys.stderr, flush=True)
lengths = [1, 74, 147, 220, 293, 366, 439, 512]
singles = compile_singles(path, "seq", lengths, "fp16", cache)
ranged = compile_range(path, "seq", 1, 512, "fp16", cache, say)
inputs = model_inputs(path)
rng = np.random.default_rng(0)
feeds = {n: feeds_for(n, inputs, rng) for n in lengths}

def med(fn, k=40):
    for _ in range(5): fn()
    ts = []
    for _ in range(k):
        t0 = time.perf_counter(); fn(); sync("cuda"); ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3

def bound(sess, f):
    b = sess.io_binding()
    for k, v in f.items(): b.bind_input(k, v)
    for o in sess.get_outputs(): b.bind_output(o.name)
    sess.run_with_iobinding(b)

single = {}
for n in lengths:
    ss = grapec.load(singles[n], backend="cuda")
    single[n] = (med(lambda: ss.run(feeds[n])), med(lambda: bound(ss, feeds[n])))
    ss.close()
res = {}
for widest in ("1", "0"):
    os.environ["GRAPEC_WIDEST_GEMMS"] = widest
    rs = grapec.load(ranged, backend="cuda"); rs.build_graphs()
    r = rs._runner
    if widest == "1":
        groups = defaultdict(list)
        for b, k in r.shared.key_of.items():
            groups[k].append(ranged.manifest["buckets"][b]["shapes"]["input_ids"][1])
        for k, ls in sorted(groups.items(), key=lambda kv: min(kv[1])):
            print(f"structure {k}: {len(ls)} lengths {min(ls)}..{max(ls)} e.g. {sorted(ls)[:6]}")
        for a, b in [(74, 147), (293, 366), (439, 512), (220, 293)]:
            ba, bb = (rs.select_bucket({"input_ids": (1, x), "attention_mask": (1, x)}) for x in (a, b))
            if r.shared.key_of.get(ba) != r.shared.key_of.get(bb):
                print(f"{a} and {b}: different structures"); continue
            sa, sb = r.shared.signature(ba), r.shared.signature(bb)
            steps = r.plan(ba).steps
            diff = [p for p in range(len(sa)) if sa[p] != sb[p]]
            print(f"{a} vs {b}: {len(diff)} positions differ: " + "; ".join(
                f"{p} {type(steps[p]).__name__} {(r.functions[steps[p].kernel] if isinstance(steps[p], KernelStep) else steps[p].attrs.get('op'))}"
                for p in diff[:8]))
    for n in lengths:
        res[(widest, n)] = (med(lambda: rs.run(feeds[n])), med(lambda: bound(rs, feeds[n])))
    rs.close()
print("| length | single numpy | single bound | range numpy | range bound | range own-M numpy | own-M bound |")
print("|---|---|---|---|---|---|---|")
for n in lengths:
    print(f"| {n} | {single[n][0]:.3f} | {single[n][1]:.3f} | {res[('1', n)][0]:.3f} | {res[('1', n)][1]:.3f} | "
          f"{res[('0', n)][0]:.3f} | {res[('0', n)][1]:.3f} |")
