# session 49: full Wav2Vec2's range bundle (small GEMMs merged across row counts) loaded on the GPU: every graph
# and exec built at load (Session.build_graphs, timed, with progress), its device memory, then 16 sampled lengths
# (12 uniform over the range, 4 among the short sizes) against onnxruntime's float32 run of the same ONNX file.
# usage: python load_check.py BUNDLE ONNX
import sys, time
import numpy as np, onnxruntime as ort, grapec
from grapec.bundle.format import Bundle
from cuda.bindings import runtime as cudart

BUNDLE, ONNX = sys.argv[1], sys.argv[2]


def used_mib() -> float:
    free, total = cudart.cudaMemGetInfo()[1:]
    return (total - free) / 2**20


base = used_mib()
t0 = time.time(); b = Bundle.read(BUNDLE); print(f"read {time.time() - t0:.1f}s", flush=True)
t0 = time.time(); sess = grapec.load(b, backend="cuda"); print(f"load {time.time() - t0:.1f}s", flush=True)
last = [time.time()]


def progress(done, total):
    if time.time() - last[0] > 20 or done == total:
        last[0] = time.time()
        print(f"  built {done}/{total} at {time.time() - t1:.0f}s", flush=True)


t1 = time.time(); sess.build_graphs(progress)
build = time.time() - t1
runner = sess._runner
print(f"build_graphs {build:.1f}s; switches {dict(runner.switches)}; device memory {used_mib() - base:.0f} MiB over "
      f"the process's start", flush=True)
fam = getattr(runner, "families", None)
ref = ort.InferenceSession(ONNX, providers=["CPUExecutionProvider"])
rng = np.random.default_rng(47)
lengths = [int(v) for v in rng.integers(1600, 160001, 12)] + [int(v) for v in rng.integers(1600, 5601, 4)]
worst, slow = 0.0, 0.0
for x in lengths:
    f = {"input_values": rng.standard_normal((1, x)).astype(np.float32)}
    bucket = sess.select_bucket({"input_values": (1, x)})
    t0 = time.time(); got = sess.run(f)["last_hidden_state"].astype(np.float32); t_first = time.time() - t0
    slow = max(slow, t_first)
    want = ref.run(None, f)[0]
    rel = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    worst = max(worst, rel)
    how = "from its family's formulas" if fam is not None and fam.owns(bucket) else "its own plan"
    print(f"samples {x} ({how}): {got.shape}, rel L2 {rel:.2e}, max abs {np.abs(got - want).max():.2e}, "
          f"allclose(atol=5e-2, rtol=5e-2) {np.allclose(got, want, atol=5e-2, rtol=5e-2)}, first run {t_first * 1e3:.1f} ms",
          flush=True)
print(f"worst rel L2 {worst:.2e} over {len(lengths)} lengths; slowest first run {slow * 1e3:.1f} ms; "
      f"device memory after {used_mib() - base:.0f} MiB; switches {dict(runner.switches)}")
