"""Where a switch's host time goes: take() split into the driver calls and the rest."""
import gc, os, sys, time, statistics
import numpy as np
import grapec
from grapec.runtime.cuda import shared_exec, driver as drv
path, lo, hi = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
b = grapec.compile(path, dims={"batch": 1}, dynamic={"seq": (lo, hi)}, precision="fp16")
sess = grapec.load(b, backend="cuda")
sess.build_graphs()
r = sess._runner
rng = np.random.default_rng(0)
feeds = {n: {"input_ids": rng.integers(0, 100, (1, n)).astype(np.int64)} for n in range(lo, hi + 1)}
for n in range(lo, hi + 1):
    sess.run(feeds[n], on_device=True)
r.synchronize()
times = {}
orig_call = shared_exec.call
def timed_call(name, *a):
    t0 = time.perf_counter(); v = orig_call(name, *a); times.setdefault(name, []).append(time.perf_counter() - t0); return v
shared_exec.call = timed_call
takes = []
orig_take = r.shared.take
def timed_take(bucket, seg):
    t0 = time.perf_counter(); orig_take(bucket, seg); takes.append(time.perf_counter() - t0)
r.shared.take = timed_take
seq = [int(x) for x in rng.integers(lo, hi + 1, 2000)]
for label, nogc in (("gc on", False), ("gc off", True)):
    takes.clear(); times.clear(); r.shared.switch_seconds = 0; r.shared.switch_count = 0
    if nogc: gc.disable()
    for n in seq:
        sess.run(feeds[n], on_device=True); r.synchronize()
    gc.enable()
    print(f"[{label}] take: median {statistics.median(takes)*1e6:.1f} us mean {statistics.fmean(takes)*1e6:.1f} p99 {sorted(takes)[int(.99*len(takes))]*1e6:.1f}; switch_us {r.switch_us:.1f} over {r.shared.switch_count}")
    for name, ts in times.items():
        print(f"    {name}: n={len(ts)} median {statistics.median(ts)*1e6:.1f} us mean {statistics.fmean(ts)*1e6:.1f}")
# the driver's floor: the loader's update alone, straight through cuda.bindings
from cuda.bindings import driver
st = next(iter(r.shared.structures.values()))
params = r.shared._params[(st.holder, "loader")][1]
f = driver.cuGraphExecKernelNodeSetParams
for k in range(3):
    t0 = time.perf_counter()
    for _ in range(5000): f(st.exec, st.loader, params)
    print(f"raw cuGraphExecKernelNodeSetParams(loader): {(time.perf_counter()-t0)/5000*1e6:.2f} us")
# run path without switches (one length), for scale
n = seq[0]
ts = []
for _ in range(500):
    t0 = time.perf_counter(); sess.run(feeds[n], on_device=True); r.synchronize(); ts.append(time.perf_counter() - t0)
print(f"same-length run+sync median {statistics.median(ts)*1e6:.1f} us")
print("switches", dict(r.switches), "structures", len(r.shared.structures))
