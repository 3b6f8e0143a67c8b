"""Where a range bundle's device memory and switch time go (GPT-2 full fp16, seq 1..512, batch 1).

Memory: free device memory read before grapec.load, after it, after build_graphs and after every length
ran once, with each runtime allocation (Device.alloc) summed by what it is, the module loads, and the
cuBLASLt / cuDNN handles' creation timed and measured. Switch: 1000 random lengths run on device
buffers; each switch's host time split into its launch-signature work and its node sets, by node kind."""
import collections, sys, time
import numpy as np
import grapec
from traffic import model_path, compile_range, feeds_for, memory_limit_mib
from grapec.runtime.cuda import driver as D, model as M, shared_exec as SE

MIB = 2 ** 20
lo, hi = 1, int(sys.argv[1]) if len(sys.argv) > 1 else 512
t0 = time.time()
b = compile_range(model_path("gpt2", "full"), lo, hi, "fp16", "out/bench/traffic-bundles", lambda m: None)
print(f"bundle ready {time.time() - t0:.0f}s; weights {len(b.weights) / MIB:.1f} MiB, largest arena "
      f"{b.largest_arena() / MIB:.1f} MiB, limit {memory_limit_mib(b):.0f} MiB", flush=True)
dev = D.Device(0)
free = lambda: dev.mem_info()[0]
allocs = collections.Counter()
orig_alloc = D.Device.alloc
def alloc(self, nbytes, what):
    allocs["".join(c for c in what if not c.isdigit()).strip()] += nbytes
    return orig_alloc(self, nbytes, what)
D.Device.alloc = alloc
steps = []
orig_load = M.CudaModel._load
def load(self, image, what):
    f = free(); r = orig_load(self, image, what); steps.append((f"module load ({what})", f - free())); return r
M.CudaModel._load = load
for mod, cls in (("grapec.runtime.cuda.blas", "Blas"), ("grapec.runtime.cuda.dnn", "Dnn")):
    try:
        m = __import__(mod, fromlist=[cls]); C = getattr(m, cls); oi = C.__init__
        def init(self, *a, _oi=oi, _n=cls, **k):
            f = free(); _oi(self, *a, **k); steps.append((f"{_n} handle", f - free()))
        C.__init__ = init
    except Exception as e:   # noqa: BLE001
        print("no wrap", mod, e)
inst = []   # (nodes, MiB) per exec instantiated
from grapec.runtime.cuda import runner as RU
for mod in (SE, RU):
    oc = mod.call
    def counted(name, *a, _oc=oc):
        if name != "cuGraphInstantiate":
            return _oc(name, *a)
        f = free(); x = _oc(name, *a)
        inst.append((_oc("cuGraphGetNodes", a[0], 0)[-1], (f - free()) / MIB)); return x
    mod.call = counted
f0 = free()
sess = grapec.load(b, backend="cuda")
f1 = free()
sess.build_graphs()
f2 = free()
rng = np.random.default_rng(4)
for n in range(lo, hi + 1):
    sess.run(feeds_for(n, 50257, rng))
f3 = free()
r = sess._runner
print(f"load {(f0 - f1) / MIB:.1f} MiB, build_graphs {(f1 - f2) / MIB:.1f} MiB, every length once {(f2 - f3) / MIB:.1f} MiB, "
      f"total {(f0 - f3) / MIB:.1f} MiB")
print("runtime allocations:", {k: round(v / MIB, 1) for k, v in allocs.items()}, f"sum {sum(allocs.values()) / MIB:.1f} MiB")
print("measured steps:", [(k, round(v / MIB, 1)) for k, v in steps])
print(f"execs instantiated {len(inst)}: {sum(m for _, m in inst):.1f} MiB in all; (top-level nodes, MiB):", inst[:40])
sh = r.shared
print(f"structures {len(sh.structures)}; varying per structure:",
      {k: len(s.varying) for k, s in sh.structures.items() if s.varying})

# the switch, split
timing = collections.defaultdict(float); counts = collections.Counter()
orig_sig = SE.SharedExecs.signature
def signature(self, bucket):
    t = time.perf_counter(); x = orig_sig(self, bucket); timing["signature"] += time.perf_counter() - t; return x
SE.SharedExecs.signature = signature
orig_set = SE.SharedExecs._set
def _set(self, st, bucket, seg, p):
    t = time.perf_counter(); orig_set(self, st, bucket, seg, p)
    kind = "loader" if p == "loader" else self._params[(bucket, p)][0].replace("cuGraphExec", "").replace("NodeSetParams", "")
    timing["set " + kind] += time.perf_counter() - t; counts["set " + kind] += 1
SE.SharedExecs._set = _set
seq = [int(x) for x in np.random.default_rng(0).integers(lo, hi + 1, 1000)]
feeds = {n: feeds_for(n, 50257, rng) for n in set(seq)}
for n in seq[:50]:
    sess.run(feeds[n], on_device=True)
def timed_switches(label):
    """The traffic's switches again, timed; prints the split by node kind."""
    sh.reset_switch_time(); timing.clear(); counts.clear()
    for n in seq:
        sess.run(feeds[n], on_device=True)
    ns = sh.switch_count
    print(f"{label}switch_us {r.switch_us:.1f} over {ns} switches; per switch:",
          {k: f"{v / max(ns, 1) * 1e6:.1f} us" for k, v in timing.items()},
          "| per call:", {k: f"{timing[k] / counts[k] * 1e6:.2f} us x {counts[k] / max(ns, 1):.2f}" for k in counts})
timed_switches("")
print(f"memory at the end {(f0 - free()) / MIB:.0f} MiB, limit {memory_limit_mib(b):.0f} MiB")

# the same sets through libcuda directly (the parameters' C structs as cuda.bindings holds them)
import ctypes
lib = ctypes.CDLL("libcuda.so.1")
set_kernel, set_child = lib.cuGraphExecKernelNodeSetParams_v2, lib.cuGraphExecChildGraphNodeSetParams
for f in (set_kernel, set_child):
    f.argtypes, f.restype = [ctypes.c_void_p] * 3, ctypes.c_int
def fast_set(self, st, bucket, seg, p):
    params = self._params.get((bucket, p))
    if params is None:
        return orig_set(self, st, bucket, seg, p)
    t = time.perf_counter()
    node = st.loader if p == "loader" else st.nodes[p]
    if params[0] == "cuGraphExecKernelNodeSetParams":
        rc = set_kernel(int(st.exec), int(node), params[1].getPtr()); kind = "Kernel" if p != "loader" else "loader"
    else:
        rc = set_child(int(st.exec), int(node), int(params[1])); kind = "ChildGraph"
    assert rc == 0, rc
    timing["set " + kind] += time.perf_counter() - t; counts["set " + kind] += 1
check = [int(x) for x in np.random.default_rng(9).integers(lo, hi + 1, 24)]
want = {}
for n in check:
    want[n] = sess.run(feeds[n] if n in feeds else feeds.setdefault(n, feeds_for(n, 50257, rng)))["logits"]
SE.SharedExecs._set = fast_set
timed_switches("ctypes: ")
worst = 0.0
for n in check:
    got = sess.run(feeds[n])["logits"]
    worst = max(worst, float(np.abs(got.astype(np.float32) - want[n].astype(np.float32)).max()))
print(f"ctypes sets vs cuda.bindings sets, 24 random lengths: max abs difference {worst}")
