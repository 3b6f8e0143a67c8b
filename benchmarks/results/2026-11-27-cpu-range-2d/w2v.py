import sys, time
sys.path.insert(0, "/work/main/src")
from grapec.compiler import compile_model
lo, hi = int(sys.argv[1]), int(sys.argv[2])
t0 = time.time()
b = compile_model("models/tiny/wav2vec2.onnx", dims={"batch": 1}, dynamic={"samples": (lo, hi)}, jobs=2,
                  progress=lambda m: print(f"[{time.time()-t0:6.1f}s] {m[:700]}", flush=True))
print(f"done {time.time()-t0:.0f}s, {len(b.plans)} plans")
