# session 51: the 2-D GPT-2 bundle (batch 1:64 x seq 1:512, fp16) read back and run on the CPU backend at 16 sizes
# drawn uniformly from the grid's sizes of at most MAX_TOKENS tokens (batch x seq; the CPU backend took over 9
# minutes for the first uniform draw, 25 x 483), in random order, random token ids within the vocabulary, against
# onnxruntime's float32 run of the same ONNX file. usage: python check16.py BUNDLE ONNX [MAX_TOKENS SEED N]
import sys, time
import numpy as np, onnxruntime as ort, grapec
from grapec.bundle.format import Bundle

BUNDLE, ONNX = sys.argv[1], sys.argv[2]
t0 = time.time(); b = Bundle.read(BUNDLE); print(f"read {time.time() - t0:.1f}s", flush=True)
t0 = time.time(); sess = grapec.load(b, backend="cpu"); print(f"load {time.time() - t0:.1f}s", flush=True)
ref = ort.InferenceSession(ONNX, providers=["CPUExecutionProvider"])
MAX_TOKENS, SEED, N = (int(a) for a in sys.argv[3:6]) if len(sys.argv) > 3 else (1024, 51, 16)
rng = np.random.default_rng(SEED)
grid = [(b, s) for b in range(1, 65) for s in range(1, 513) if b * s <= MAX_TOKENS]
sizes = [grid[i] for i in rng.choice(len(grid), N, replace=False)]
worst = 0.0
for bs, s in sizes:
    f = {"input_ids": rng.integers(0, 50257, (bs, s)).astype(np.int64)}
    t0 = time.time(); got = sess.run(f)["logits"].astype(np.float32); t_run = time.time() - t0
    want = ref.run(None, f)[0]
    rel = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    worst = max(worst, rel)
    print(f"batch {bs} x seq {s}: rel L2 {rel:.2e}, max abs {np.abs(got - want).max():.2e}, "
          f"allclose(atol=5e-2, rtol=5e-2) {np.allclose(got, want, atol=5e-2, rtol=5e-2)}, {t_run:.1f} s", flush=True)
print(f"worst rel L2 {worst:.2e} over {len(sizes)} sizes")
