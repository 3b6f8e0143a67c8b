"""The stream scheduler on the GPU: parallel branches as CUDA-graph edges, correct results with
concurrent cuBLASLt calls, and a measured timeline in which branches overlap."""
import os

import numpy as np
import pytest

import grapec
from grapec.bundle.inputs import bundle_inputs
from helpers import rel_err
from test_models import TINY

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_parallel_branches_on_gpu(precision):
    b = grapec.compile(os.path.join(TINY, "inception_v3.onnx"), dims={"batch": 1}, precision=precision,
                       precision_tolerance=0.1)   # the tiny model's fp16 error is 0.034 (test_gpu_full.py)
    plan = b.plans[0]
    assert b.manifest["buckets"][0]["schedule"]["branches"] > 1
    assert len({st.branch for st in plan.steps if st.op == "library"}) > 1, "no GEMMs on concurrent branches"
    feeds = bundle_inputs(b.manifest, 0, 5)
    sess = grapec.load(b, backend="cuda")
    for _ in range(3):   # replays of the same graph: a race shows up as a difference between them
        got = sess.run(feeds)
    ref = grapec.load(b, backend="cpu").run(feeds)
    for k in ref:
        assert rel_err(got[k], ref[k]) < (1e-4 if precision == "fp32" else 1e-2), (k, rel_err(got[k], ref[k]))
    r = sess._runner
    edges = r.edge_counts()
    assert edges["default"] + edges["programmatic"] == sum(len(st.deps) for st in plan.steps)
    assert len(set(r.workspaces.ptrs)) > 1, "concurrent GEMMs share one cuBLASLt workspace"

    from grapec.runtime.cuda.timeline import measure_timeline
    spans = measure_timeline(r, 0, launches=5)
    assert len(spans) == len(plan.steps)
    assert all(s.end >= s.start >= 0 for s in spans)
    overlap = any(a.branch != c.branch and a.start < c.end and c.start < a.end for a in spans for c in spans)
    assert overlap, "no two branches ran at once"
    after = sess.run(feeds)
    assert all(np.array_equal(after[k], got[k]) for k in got)
