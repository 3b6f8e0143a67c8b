import sys, time
sys.path.insert(0, "src")
import grapec
import grapec.compiler.pipeline as P
B, S = int(sys.argv[1]), int(sys.argv[2])
class Stop(Exception): pass
orig = P.compile_range
def wrapped(*a, **k):
    r = orig(*a, **k)
    print('SUMMARY', r[1].summary(), flush=True)
    raise Stop
P.compile_range = wrapped
t = time.time()
try:
    grapec.compile("/tmp/gpt2_512.onnx", dynamic={"batch": (1, B), "seq": (1, S)}, jobs=2,
                   progress=lambda m: print(f"[{time.time()-t:6.1f}s] {m[:3000]}", flush=True))
except Stop:
    print(f"range compile returned after {time.time()-t:.1f}s")
