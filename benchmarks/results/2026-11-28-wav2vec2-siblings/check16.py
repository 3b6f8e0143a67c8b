# sessions 47-48: 16 sampled lengths of the full-size Wav2Vec2 range bundle (12 uniform over the range, 4 among the
# short sizes) on a backend against onnxruntime's float32 run (CPU), the families' sizes run from their formulas
# usage: python check16.py BUNDLE ONNX [cuda|cpu] [--ref-cpu-backend]
# --ref-cpu-backend: the reference is the same bundle on grapec's CPU backend (which matched onnxruntime at 16 lengths
# on the CPU machine, ../2026-11-28-cpu-wav2vec2-full): the device's models/build.py gives other seeded weights
import sys, time
import numpy as np, onnxruntime as ort, grapec
from grapec.bundle.format import Bundle
BUNDLE, ONNX = sys.argv[1], sys.argv[2]
backend = sys.argv[3] if len(sys.argv) > 3 and not sys.argv[3].startswith("--") else "cuda"
t0 = time.time(); b = Bundle.read(BUNDLE); print(f"read {time.time()-t0:.1f}s", flush=True)
sess = grapec.load(b, backend=backend)
fam = getattr(sess._runner, "families", None)
if "--ref-cpu-backend" in sys.argv:
    cpu = grapec.load(b, backend="cpu")
    class _Ref:
        def run(self, _, feeds):
            return [cpu.run(feeds)["last_hidden_state"].astype(np.float32)]
    ref = _Ref()
else:
    ref = ort.InferenceSession(ONNX, providers=["CPUExecutionProvider"])
rng = np.random.default_rng(47)
lengths = [int(v) for v in rng.integers(1600, 160001, 12)] + [int(v) for v in rng.integers(1600, 5601, 4)]
worst = 0.0
for x in lengths:
    f = {"input_values": rng.standard_normal((1, x)).astype(np.float32)}
    bucket = sess.select_bucket({"input_values": (1, x)})
    t0 = time.time(); got = sess.run(f)["last_hidden_state"].astype(np.float32); t1 = time.time() - t0
    want = ref.run(None, f)[0]
    rel = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    worst = max(worst, rel)
    how = "from its family's formulas" if fam is not None and fam.owns(bucket) else "its own plan"
    print(f"samples {x} ({how}): {got.shape}, rel L2 {rel:.2e}, max abs {np.abs(got - want).max():.2e}, "
          f"allclose(atol=5e-2, rtol=5e-2) {np.allclose(got, want, atol=5e-2, rtol=5e-2)}, first run {t1 * 1e3:.1f} ms",
          flush=True)
print(f"worst rel L2 {worst:.2e} over {len(lengths)} lengths ({backend})")
