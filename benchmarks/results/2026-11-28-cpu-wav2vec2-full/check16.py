# session 46: 16 sampled lengths (12 uniform over the range, 4 among the short sizes stored plan by plan) of the
# full-size Wav2Vec2 range bundle on the CPU backend against onnxruntime's float32 run; then a length outside the
# range through the CLI (exit 2)
import subprocess, sys, time
import numpy as np, onnxruntime as ort, grapec
from grapec.bundle.format import Bundle
# session 56 ran it again on its own bundle: python check16.py BUNDLE ONNX
BUNDLE, ONNX = sys.argv[1:3] if len(sys.argv) > 2 else ("/tmp/w2v_full_z.grape", "/tmp/full/wav2vec2.onnx")
t0 = time.time(); b = Bundle.read(BUNDLE); print(f"read {time.time()-t0:.1f}s", flush=True)
docs = b.plans.docs
in_family = {bk for f in docs.families for bk in f.buckets}
sess = grapec.load(b, backend="cpu")
ref = ort.InferenceSession(ONNX, providers=["CPUExecutionProvider"])
rng = np.random.default_rng(46)
lengths = [int(v) for v in rng.integers(1600, 160001, 12)] + [int(v) for v in rng.integers(1600, 5601, 4)]
worst = 0.0
for x in lengths:
    f = {"input_values": rng.standard_normal((1, x)).astype(np.float32)}
    bucket = sess.select_bucket({"input_values": (1, x)})
    t0 = time.time(); got = sess.run(f)["last_hidden_state"]; t1 = time.time() - t0
    want = ref.run(None, f)[0]
    rel = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    worst = max(worst, rel)
    print(f"samples {x} ({'family member' if bucket in in_family else 'stored plan'}): {got.shape}, rel L2 {rel:.2e}, "
          f"max abs {np.abs(got - want).max():.2e}, allclose(atol=5e-2, rtol=5e-2) {np.allclose(got, want, atol=5e-2, rtol=5e-2)}, "
          f"grapec cpu {t1:.1f}s", flush=True)
print(f"worst rel L2 {worst:.2e} over {len(lengths)} lengths")
np.save("/tmp/short.npy", np.zeros((1, 1000), np.float32) + 0.5)
r = subprocess.run([sys.executable, "-m", "grapec.tools.cli", "run", BUNDLE, "--input", "input_values=/tmp/short.npy"],
                   capture_output=True, text=True)
print(f"1000 samples through `grapec run`: exit {r.returncode}: {r.stderr.strip()[-300:]}")
