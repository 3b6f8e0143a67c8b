"""ir/evaluate.py: a lowered graph evaluated node by node gives the CPU backend's outputs bit for bit
(If, Loop with a body reading enclosing values, scan outputs, GEMMs through operand views), and
drops each value after its last reader."""
import os
from collections import Counter

import numpy as np
import onnx
import pytest

import grapec
from grapec.bundle.inputs import bundle_inputs
from grapec.compiler.pipeline import lowered_model
from grapec.frontend.onnx_import import import_model
from grapec.frontend.shapes import resolve_input_shapes
from grapec.ir.evaluate import _last_reads, run_graph

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = {"control_flow": {}, "gpt2_generate": {}, "bert": {"batch": 2, "seq": 8}, "gpt2": {"batch": 3, "seq": 8},
         "wav2vec2": {"batch": 1, "samples": 1600}}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_lowered_graph_evaluates_to_the_cpu_backends_outputs(name):
    path = os.path.join(ROOT, "models", "tiny", f"{name}.onnx")
    proto = onnx.load(path)
    shapes = resolve_input_shapes(import_model(proto), {}, CASES[name])
    bundle = grapec.compile(path, dims=CASES[name] or None, targets=[])
    feeds = bundle_inputs(bundle.manifest, 0, seed=11)
    want = grapec.load(bundle).run(feeds)
    low = lowered_model(proto, shapes, {})
    seen = []
    got = dict(zip(low.outputs, run_graph(low, feeds, on_value=lambda n, a: seen.append(n))))
    assert set(got) == set(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k]), k
    made = [o for n in low.nodes for o in n.outputs if o]
    counts = Counter(seen)
    assert all(counts[o] == 1 for o in made), "on_value sees each top-level value once"
    for n in low.nodes:   # and a body's values once per iteration (an If's taken branch once)
        for body in n.subgraphs.values():
            inner = {counts[o] for b in body.nodes for o in b.outputs if o}
            assert len(inner) == 1 and (n.op != "Loop" or inner.pop() >= 1), n.name
    assert set(counts) <= _made_anywhere(low)


def _made_anywhere(graph) -> set:
    return {o for n in graph.nodes for o in n.outputs if o} | set().union(
        *[_made_anywhere(b) for n in graph.nodes for b in n.subgraphs.values()])


def test_a_value_is_dropped_after_its_last_reader_and_a_body_read_keeps_it():
    proto = onnx.load(os.path.join(ROOT, "models", "tiny", "gpt2_generate.onnx"))
    low = lowered_model(proto, resolve_input_shapes(import_model(proto), {}, {}), {})
    last = _last_reads(low)
    loop = next(i for i, n in enumerate(low.nodes) if n.op == "Loop")
    body_reads = {x for n in low.nodes[loop].subgraphs["body"].nodes for x in n.inputs} - \
        {o for n in low.nodes[loop].subgraphs["body"].nodes for o in n.outputs}
    outer = [x for x in body_reads if x in last and low.lookup(x) is not None and low.lookup(x).const is None]
    assert outer, "the decode loop's body reads values of the enclosing graph"
    assert all(last[x] >= loop for x in outer)
    for i, n in enumerate(low.nodes):
        for o in n.outputs:
            if o and o not in low.outputs:
                assert last.get(o, i) >= i


@pytest.mark.parametrize("chunk", [1 << 24, 64])
def test_a_load_by_its_own_loop_variables_reads_a_view_and_matches_the_gather(monkeypatch, chunk):
    """interpret.py reads in0[j, i] and a[i, k] * b[k, j] (k reduced) as views of the buffers; the
    results equal numpy's, whole or in row slices (CHUNK_ELEMENTS small), and a masked or computed
    index still gathers."""
    import grapec.ir.interpret as interp
    from grapec.ir import kernel as K
    monkeypatch.setattr(interp, "CHUNK_ELEMENTS", chunk)
    rng = np.random.default_rng(3)
    a = rng.standard_normal((6, 5)).astype(np.float16)
    b = rng.standard_normal((5, 7)).astype(np.float32)
    i, j = K.idx(0), K.idx(1)
    transpose = K.Kernel((5, 6), "float32", K.load(0, (j, i), "float16"), (((6, 5), "float16"),))
    assert np.array_equal(interp.run_kernel(transpose, [a]), a.T.astype(np.float32))
    k = K.ridx(5)
    prod = K.cast(K.load(0, (i, k), "float16"), "float32") * K.load(1, (k, j), "float32")
    mm = K.Kernel((6, 7), "float32", K.reduce("sum", prod, (k,)),
                  (((6, 5), "float16"), ((5, 7), "float32")))
    assert np.allclose(interp.run_kernel(mm, [a, b]), a.astype(np.float32) @ b, rtol=1e-5, atol=1e-5)
    # a batch of one: the slices go along the first axis longer than 1
    x, y = K.idx(1), K.idx(2)
    batched = K.Kernel((1, 6, 7), "float32", K.reduce("sum", K.cast(K.load(0, (x, k), "float16"), "float32")
                                                      * K.load(1, (k, y), "float32"), (k,)),
                       (((6, 5), "float16"), ((5, 7), "float32")))
    assert np.allclose(interp.run_kernel(batched, [a, b])[0], a.astype(np.float32) @ b, rtol=1e-5, atol=1e-5)
    ev = interp._Evaluator(transpose, [a])
    assert ev.plain_view(a, (j, i), (), 2) is not None
    assert ev.plain_view(a, (j, i + K.const(1, "int64")), (), 2) is None


def test_a_load_at_a_constant_index_reads_a_view_not_a_copy():
    """A batch of 1 is read at the constant 0: the interpreter takes buf[0] as a view (basic
    indexing) and moves the other axes as plain_view does, instead of a fancy-index gather of the
    whole tensor (PicoDet's fp16 calibration spent 27 of its 80 s in those gathers)."""
    import numpy as np
    from grapec.ir import kernel as K
    from grapec.ir.interpret import _Evaluator, run_kernel
    x = np.random.default_rng(4).standard_normal((1, 5, 6, 7)).astype(np.float32)
    i = [K.idx(a) for a in range(3)]
    body = K.load(0, (K.const(0, "int64"), i[2], i[0], i[1]), "float32")   # out[c, h, w] = x[0, w, c, h]
    kernel = K.Kernel((6, 7, 5), "float32", body, (((1, 5, 6, 7), "float32"),))
    np.testing.assert_array_equal(run_kernel(kernel, [x]), x[0].transpose(1, 2, 0))
    view = _Evaluator(kernel, [x]).plain_view(x, body.args[1], (), 3)
    assert view is not None and np.shares_memory(view, x)
