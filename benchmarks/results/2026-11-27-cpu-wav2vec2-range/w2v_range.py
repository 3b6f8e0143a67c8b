import sys, time, os
sys.path.insert(0, "src")
import numpy as np, onnxruntime as ort
import grapec
from grapec.compiler import compile_model
from grapec.bundle.format import Bundle
lo, hi = int(sys.argv[1]), int(sys.argv[2])
M = "models/tiny/wav2vec2.onnx"
t0 = time.time()
b = compile_model(M, dims={"batch": 1}, dynamic={"samples": (lo, hi)}, jobs=2,
                  progress=lambda m: print(f"[{time.time()-t0:6.1f}s] {m[:500]}", flush=True) if "sizes compiled (" not in m else None)
t1 = time.time(); data = b.to_bytes(); t2 = time.time(); rb = Bundle.from_bytes(data); t3 = time.time()
print(f"compile {t1-t0:.1f}s, bundle {len(data)/2**20:.2f} MiB (weights {b.weights_nbytes/2**20:.2f}), write {t2-t1:.1f}s read {t3-t2:.1f}s, {len(b.plans)} plans")
sess = grapec.load(rb, backend="cpu"); ref = ort.InferenceSession(M, providers=["CPUExecutionProvider"])
rng = np.random.default_rng(5)
worst = 0
for x in rng.integers(lo, hi + 1, 16):
    feeds = {"input_values": rng.standard_normal((1, int(x))).astype(np.float32)}
    got = sess.run(feeds); want = ref.run(None, feeds)
    for (name, g), w in zip(got.items(), want):
        rel = np.linalg.norm(g - w) / np.linalg.norm(w); worst = max(worst, rel)
        assert np.allclose(g, w, rtol=1e-4, atol=1e-4) and rel < 1e-5, (x, name, rel)
print(f"16 random sizes equal to onnxruntime after write and read, worst rel {worst:.2e}")
