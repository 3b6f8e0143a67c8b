import sys, os
sys.path.insert(0, "benchmarks")
import grapec
import grapec.codegen.attention as A
from grapec.tools.bench import bench_grapec
from grapec.bundle.inputs import bundle_inputs
from zoo import full_model
for label, name, dims in [("bert-s128", "bert", {"batch": 1, "seq": 128}), ("gpt2-s128", "gpt2", {"batch": 1, "seq": 128})]:
    path = full_model(name)
    bundles = {}
    for slices in (1, 4):
        A.MAX_KEY_SLICES = slices
        bundles[slices] = grapec.compile(path, dims=dims, precision="fp16")
    feeds = bundle_inputs(bundles[1].manifest, 0, 0)
    outs = {}
    for rep in range(2):
        for slices, b in bundles.items():
            r = bench_grapec(b, feeds, 200, per_step=(rep == 0))
            att = [s["us"] for s in r.get("steps", []) if s.get("kind") == "attention"]
            print(label, "max_key_slices", slices, "rep", rep, "ms %.4f" % r["replay"]["median_ms"],
                  "attention step us %.2f" % (sum(att) / len(att)) if att else "", flush=True)
        if rep == 0:
            for slices, b in bundles.items():
                outs[slices] = grapec.load(b, backend="cuda").run(feeds)
    import numpy as np
    for k in outs[1]:
        a, c = outs[1][k].astype(np.float32), outs[4][k].astype(np.float32)
        print(label, k, "rel diff split vs unsplit %.2e" % (np.linalg.norm(a - c) / np.linalg.norm(a)))
