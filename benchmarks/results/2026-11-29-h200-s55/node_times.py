"""Per graph node, the GPU time of a range family's band exec at a length against the length's own bundle
(runtime/cuda/profile.py profile_nodes: each node alone in the exec as it is). Session 55: full Wav2Vec2's
band execs replay 1.01-1.16x the single bundles' (run_parts.py), and steps.py cannot time a band exec's steps.
usage: node_times.py ONNX RANGE_BUNDLE SINGLE_PATTERN L1,L2,..  (SINGLE_PATTERN holds {n})"""
import sys
from collections import defaultdict
import numpy as np
sys.path.insert(0, "benchmarks")
import grapec
from grapec.bundle.format import Bundle
from grapec.runtime.cuda.profile import profile_nodes
from traffic import model_inputs, feeds_for

onnx_path, range_path, pattern, lengths = sys.argv[1], sys.argv[2], sys.argv[3], [int(x) for x in sys.argv[4].split(",")]
inputs = model_inputs(onnx_path)
rng = np.random.default_rng(0)


def graph_and_exec(sess, feeds):
    r = sess._runner
    sess.run(feeds)
    bucket = sess.select_bucket({k: v.shape for k, v in feeds.items()})
    if r.families is not None and r.families.owns(bucket):
        ex = r.families.switch(bucket)
        return ex.graph, ex.exec, r.stream
    segs = r.program(bucket, r.plan(bucket).steps)
    assert len(segs) == 1, "one segment expected"
    r.own_exec(segs[0])
    return segs[0].graph, segs[0].exec, r.stream


def group(t):
    n = t.name
    if t.kind != "kernel":
        return t.kind
    if n.startswith("k_"):
        return "grapec kernels"
    return n[:48]


rs = grapec.load(Bundle.read(range_path), backend="cuda")
for n in lengths:
    feeds = feeds_for(n, inputs, rng)
    ss = grapec.load(Bundle.read(pattern.format(n=n)), backend="cuda")
    single = profile_nodes(*graph_and_exec(ss, feeds))
    ranged = profile_nodes(*graph_and_exec(rs, feeds))
    print(f"\n## length {n}: single {len(single)} nodes {sum(t.us for t in single):.1f} us; "
          f"range {len(ranged)} nodes {sum(t.us for t in ranged):.1f} us")
    for name, ts in (("single", single), ("range", ranged)):
        print(f"### {name}")
        for t in ts:
            print(f"{t.index} {t.kind} {t.us:.2f} {t.name[:90]}")
    by = defaultdict(lambda: [0.0, 0.0, 0, 0])
    for side, ts in ((0, single), (1, ranged)):
        for t in ts:
            g = by[group(t)]
            g[side] += t.us
            g[side + 2] += 1
    print(f"\n| length {n}: group | single us | range us | single nodes | range nodes |\n|---|---|---|---|---|")
    for g, v in sorted(by.items(), key=lambda kv: -abs(kv[1][1] - kv[1][0])):
        print(f"| {g} | {v[0]:.1f} | {v[1]:.1f} | {v[2]} | {v[3]} |")
    steps = [t for t in ranged if "eval_sizes" not in t.name]   # the band exec's first node loads the sizes
    if len(steps) == len(single):
        pairs = sorted(zip(single, steps), key=lambda p: p[0].us - p[1].us)[:25]
        print(f"\n| length {n}: node | single us | range us | single | range |\n|---|---|---|---|---|")
        for a, b in pairs:
            print(f"| {a.index} | {a.us:.2f} | {b.us:.2f} | {a.name[:40]} | {b.name[:40]} |")
    ss.close()
