import time, sys
import numpy as np, onnxruntime as ort, grapec
from grapec.bundle.format import Bundle
t0 = time.time(); b = Bundle.read("/tmp/w2v_full.grape"); print(f"read {time.time()-t0:.1f}s", flush=True)
sess = grapec.load(b, backend="cpu")
ref = ort.InferenceSession("/tmp/full/wav2vec2.onnx", providers=["CPUExecutionProvider"])
rng = np.random.default_rng(45)
for x in [int(v) for v in rng.integers(1600, 160001, 6)]:
    f = {"input_values": rng.standard_normal((1, x)).astype(np.float32)}
    t0 = time.time(); got = sess.run(f)["last_hidden_state"]; t1 = time.time() - t0
    want = ref.run(None, f)[0]
    rel = np.linalg.norm(got - want) / np.linalg.norm(want)
    print(f"samples {x}: {got.shape}, rel L2 {rel:.2e}, max abs {np.abs(got - want).max():.2e}, grapec cpu {t1:.1f}s", flush=True)
