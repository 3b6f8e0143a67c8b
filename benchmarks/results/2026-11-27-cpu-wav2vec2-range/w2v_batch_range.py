import sys, time
sys.path.insert(0, "src")
import numpy as np, onnxruntime as ort, grapec
from grapec.compiler import compile_model
from grapec.bundle.format import Bundle
M = "models/tiny/wav2vec2.onnx"
t0 = time.time()
b = compile_model(M, dynamic={"batch": (1, int(sys.argv[1])), "samples": (1600, int(sys.argv[2]))}, jobs=2,
                  progress=lambda m: print(f"[{time.time()-t0:6.1f}s] {m[:600]}", flush=True) if "sizes compiled (" not in m and "note:" not in m else None)
data = b.to_bytes(); rb = Bundle.from_bytes(data)
print(f"compile+write+read {time.time()-t0:.1f}s, bundle {len(data)/2**20:.2f} MiB, {len(b.plans)} plans")
sess, ref = grapec.load(rb, backend="cpu"), ort.InferenceSession(M, providers=["CPUExecutionProvider"])
rng = np.random.default_rng(6); worst = 0
for _ in range(16):
    bb, x = int(rng.integers(1, int(sys.argv[1]) + 1)), int(rng.integers(1600, int(sys.argv[2]) + 1))
    f = {"input_values": rng.standard_normal((bb, x)).astype(np.float32)}
    got, want = sess.run(f)["last_hidden_state"], ref.run(None, f)[0]
    rel = np.linalg.norm(got - want) / np.linalg.norm(want); worst = max(worst, rel)
    assert np.allclose(got, want, rtol=1e-4, atol=1e-4), (bb, x, rel)
print(f"16 random (batch, samples) equal to onnxruntime, worst {worst:.2e}")
