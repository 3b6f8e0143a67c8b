"""Why BERT's range bundle, numpy in and out, is 1.14x its single-length bundles while bound it is 0.96x:
each length's request timed on the range (same length again: no switch; alternating: a switch each) and on
its single-length bundle, numpy and bound, then cProfile of the range's numpy runs."""
import cProfile, os, pstats, statistics, sys, time
import numpy as np
sys.path.insert(0, "benchmarks")
import grapec
from traffic import compile_range, compile_singles, model_inputs, model_path, feeds_for, sync

path = model_path("bert", "full")
cache = "out/bench/traffic-bundles"
say = lambda m: print(m, file=sys.stderr, flush=True)
lengths = [74, 293, 512]
singles = compile_singles(path, "seq", lengths, "fp16", cache)
ranged = compile_range(path, "seq", 1, 512, "fp16", cache, say)
inputs = model_inputs(path)
rng = np.random.default_rng(0)
feeds = {n: feeds_for(n, inputs, rng) for n in lengths}

def med(fn, k=60):
    for _ in range(5): fn()
    ts = []
    for _ in range(k):
        t0 = time.perf_counter(); fn(); sync("cuda"); ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3

def bound_run(sess, f):
    b = sess.io_binding()
    for k, v in f.items(): b.bind_input(k, v)
    for o in sess.get_outputs(): b.bind_output(o.name)
    sess.run_with_iobinding(b)

rows = []
rs = grapec.load(ranged, backend="cuda"); rs.build_graphs()
for n in lengths:
    ss = grapec.load(singles[n], backend="cuda")
    rows.append((n, med(lambda: ss.run(feeds[n])), med(lambda: bound_run(ss, feeds[n])),
                 med(lambda: rs.run(feeds[n])), med(lambda: bound_run(rs, feeds[n]))))
    ss.close()
it = iter(range(10 ** 9))
alt = lambda: rs.run(feeds[lengths[next(it) % 2]])
alt_ms = med(alt, 200)
print("| length | single numpy | single bound | range numpy | range bound |\n|---|---|---|---|---|")
for r in rows: print("| %d | %.3f | %.3f | %.3f | %.3f |" % r)
print(f"range numpy alternating 74/293: median {alt_ms:.3f} ms; switch_us {rs._runner.switch_us:.1f}; switches {getattr(rs._runner, 'switches', None)}")
pr = cProfile.Profile(); pr.enable()
for i in range(400): rs.run(feeds[lengths[i % 2]])
pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(25)
