import sys, time, os, resource
sys.path.insert(0, "src")
import numpy as np, onnxruntime as ort
import grapec
from grapec.bundle.format import Bundle
B, S = int(sys.argv[1]), int(sys.argv[2])
t = time.time()
b = grapec.compile("/tmp/gpt2_512.onnx", dynamic={"batch": (1, B), "seq": (1, S)}, jobs=2,
                   progress=lambda m: print(f"[{time.time()-t:6.1f}s] {m[:700]}", flush=True))
t1 = time.time()
b.write("/tmp/big.grape"); t2 = time.time()
print(f"compile {t1-t:.1f}s write {t2-t1:.1f}s rss {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss/1024:.0f} MiB", flush=True)
r = Bundle.read("/tmp/big.grape")
print(f"file {os.path.getsize('/tmp/big.grape')/2**20:.2f} MiB, weights {r.weights_nbytes/2**20:.2f} MiB; read {time.time()-t2:.1f}s")
for s in r.manifest["sections"]: print("  ", s["name"], s["size"])
sess = grapec.load(r, backend="cpu")
ref = ort.InferenceSession("/tmp/gpt2_512.onnx", providers=["CPUExecutionProvider"])
rng = np.random.default_rng(1)
n = len(r.manifest["buckets"])
worst, picks = 0, rng.choice(n, 24, replace=False)
for i in picks:
    shp = r.manifest["buckets"][i]["shapes"]["input_ids"]
    feeds = {"input_ids": rng.integers(0, 256, shp).astype(np.int64)}
    want = ref.run(None, feeds)[0]; got = sess.run(feeds)["logits"]
    rel = np.linalg.norm(got - want) / np.linalg.norm(want); worst = max(worst, rel)
    assert np.allclose(got, want, rtol=1e-4, atol=1e-4), (shp, rel)
print(f"24 random sizes vs onnxruntime in random order: worst rel {worst:.2e}; derived among them {sum(bool(r.manifest['buckets'][i].get('derived')) for i in picks)}")
