"""The plans of a --dynamic bundle, per template (one launch structure: bundle/templates.py): which of
their numbers are constant across its sizes, affine in the size, or neither (issue 33's question:
what a structure-level plan would have to compute per size). No GPU needed.

    grapec compile models/tiny/gpt2.onnx --dim batch=1 --dynamic seq=1:64 --no-gpu -o /tmp/r.grape
    python benchmarks/plan_numbers.py /tmp/r.grape input_ids 1      # the input and axis that vary
"""
import sys

import numpy as np

from grapec.bundle.format import Bundle
b = Bundle.read(sys.argv[1])
docs = b.plans.docs
sizes = [bk["shapes"][sys.argv[2]][int(sys.argv[3])] for bk in b.manifest["buckets"]]
by_t = {}
for i, (k, j) in enumerate(docs.where):
    by_t.setdefault(k, []).append((sizes[i], np.asarray(docs.ints[k][j])))
for k, rows in by_t.items():
    s = np.array([r[0] for r in rows]); m = np.stack([r[1] for r in rows])
    const = (m == m[:1]).all(axis=0)
    affine = np.zeros(m.shape[1], bool)
    if len(s) >= 2:
        ds = s - s[0]
        slope = (m[1] - m[0]) / (s[1] - s[0])
        pred = m[0] + np.outer(ds, slope)
        affine = np.isclose(pred, m).all(axis=0) & ~const
    other = ~(const | affine)
    print(f"template {k}: sizes {s.min()}..{s.max()} ({len(s)}: {s.tolist()[:8]}{'...' if len(s) > 8 else ''}), "
          f"{m.shape[1]} numbers: {const.sum()} constant, {affine.sum()} affine in the size, {other.sum()} neither")
    if other.any():
        for c in np.nonzero(other)[0][:4]:
            print("   neither:", list(zip(s.tolist(), m[:, c].tolist()))[:10])
