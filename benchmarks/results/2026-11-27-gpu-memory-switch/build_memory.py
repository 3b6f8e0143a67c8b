"""Which part of Session.build_graphs takes the device memory of a range bundle (GPT-2 full fp16, seq
1..512): free memory read around each library child's capture (cuBLASLt matmul, cuDNN sdpa and conv) and
around each bucket's whole graph build, summed by kind, with the count of distinct cuDNN/cuBLASLt problems."""
import collections, sys, time
import grapec
from traffic import model_path, compile_range
from grapec.runtime.cuda import driver as D, graph as G, dnn as DN, blas as BL

MIB = 2 ** 20
hi = int(sys.argv[1]) if len(sys.argv) > 1 else 512
b = compile_range(model_path("gpt2", "full"), 1, hi, "fp16", "out/bench/traffic-bundles", lambda m: None)
dev = D.Device(0)
free = lambda: dev.mem_info()[0]
spent, calls = collections.Counter(), collections.Counter()
depth = [0]
def wrap(cls, name, label):
    orig = getattr(cls, name)
    def f(self, *a, **k):
        depth[0] += 1
        f0 = free()
        try:
            return orig(self, *a, **k)
        finally:
            depth[0] -= 1
            spent[label] += f0 - free(); calls[label] += 1
    setattr(cls, name, f)
wrap(G.GraphBuilder, "matmul_child", "matmul child (cuBLASLt)")
wrap(G.GraphBuilder, "sdpa_child", "sdpa child (cuDNN)")
wrap(G.GraphBuilder, "conv_child", "conv child (cuDNN)")
wrap(DN.Dnn, "_build_sdpa", "  of which: sdpa problem built")
wrap(DN.Dnn, "_fastest_plan", "  of which: cuDNN plans timed")
wrap(BL.Blas, "_fastest", "  of which: cuBLASLt algos timed")
f0 = free()
sess = grapec.load(b, backend="cuda")
f1 = free()
t = time.time(); sess.build_graphs(); t = time.time() - t
f2 = free()
print(f"load {(f0 - f1) / MIB:.0f} MiB; build_graphs {(f1 - f2) / MIB:.0f} MiB in {t:.0f}s")
for k in spent:
    print(f"  {k}: {spent[k] / MIB:.0f} MiB over {calls[k]} calls")
r = sess._runner
print("runner.switches", dict(getattr(r, "switches", {})))
