"""Where a switch's host time goes (cProfile around take), tiny GPT-2 over a seq range."""
import cProfile, pstats, statistics, sys, time
import numpy as np
import grapec
path, lo, hi = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
b = grapec.compile(path, dims={"batch": 1}, dynamic={"seq": (lo, hi)}, precision="fp16", every_size=True)
sess = grapec.load(b, backend="cuda")
sess.build_graphs()
r = sess._runner
rng = np.random.default_rng(0)
feeds = {n: {"input_ids": rng.integers(0, 100, (1, n)).astype(np.int64)} for n in range(lo, hi + 1)}
for n in range(lo, hi + 1):
    sess.run(feeds[n], on_device=True)
r.synchronize()
seq = [int(x) for x in rng.integers(lo, hi + 1, 2000)]
takes = []
orig_take = r.shared.take
prof = cProfile.Profile()
def timed_take(bucket, seg, profile=False):
    t0 = time.perf_counter()
    if profile: prof.enable()
    orig_take(bucket, seg)
    if profile: prof.disable()
    takes.append(time.perf_counter() - t0)
for label, profile in (("plain", False), ("profiled", True)):
    r.shared.take = lambda b_, s_, p=profile: timed_take(b_, s_, p)
    takes.clear(); r.shared.reset_switch_time()
    runs = []
    for n in seq:
        t0 = time.perf_counter(); sess.run(feeds[n], on_device=True); r.synchronize(); runs.append(time.perf_counter() - t0)
    print(f"[{label}] take median {statistics.median(takes)*1e6:.1f} us mean {statistics.fmean(takes)*1e6:.1f}; "
          f"switch_us {r.switch_us:.1f} over {r.shared.switch_count}; run+sync median {statistics.median(runs)*1e6:.1f} us")
pstats.Stats(prof).sort_stats("tottime").print_stats(18)
n = seq[0]; ts = []
for _ in range(500):
    t0 = time.perf_counter(); sess.run(feeds[n], on_device=True); r.synchronize(); ts.append(time.perf_counter() - t0)
print(f"same-length run+sync median {statistics.median(ts)*1e6:.1f} us")
print("switches", dict(r.switches), "structures", len(r.shared.structures))
