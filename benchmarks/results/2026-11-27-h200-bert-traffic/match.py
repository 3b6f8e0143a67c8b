"""BERT fp16 over seq 1..512: 16 random lengths in random order, after a write and a read, on the CUDA backend
(and 4 of them on the CPU backend) against onnxruntime's fp32 CPU run; worst relative L2 and max-abs."""
import os, sys, time
import numpy as np
import onnxruntime as ort
sys.path.insert(0, "benchmarks")
import grapec
from grapec.bundle.format import Bundle
from traffic import model_inputs, model_path, feeds_for

path = model_path("bert", "full")
t0 = time.time()
grapec.compile(path, dims={"batch": 1}, dynamic={"seq": (1, 512)}, precision="fp16").write("/tmp/bert_range.grape")
print(f"compiled in {time.time() - t0:.0f}s", flush=True)
b = Bundle.read("/tmp/bert_range.grape")
inputs = model_inputs(path)
ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
rng = np.random.default_rng(43)
lengths = [int(n) for n in rng.choice(np.arange(1, 513), 16, replace=False)]
print("| backend | seq | output | rel L2 | max abs |\n|---|---|---|---|---|")
for backend, ls in (("cuda", lengths), ("cpu", lengths[:4])):
    sess = grapec.load(b, backend=backend)
    for n in ls:
        feeds = feeds_for(n, inputs, rng)
        want = dict(zip([o.name for o in ref.get_outputs()], ref.run(None, feeds)))
        got = sess.run(feeds)
        for name, w in want.items():
            g = np.asarray(got[name], np.float32)
            rel = float(np.linalg.norm(g - w) / np.linalg.norm(w))
            print(f"| {backend} | {n} | {name} | {rel:.2e} | {float(np.abs(g - w).max()):.2e} |", flush=True)
    sess.close()
