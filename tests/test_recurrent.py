"""LSTM, GRU and RNN (frontend/recurrent.py rewrites them to Loops, the input GEMM hoisted out of
the loop) against onnxruntime on fresh random inputs; every sequence loop is graphed (--strict).
onnxruntime refuses layout=1 (batch-first), so those cases are checked against ONNX's reference
evaluator."""
import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from grapec.plan import LoopStep, walk_steps

from helpers import compile_and_run, init, model, ort_run, tinfo

SEQ, BATCH, IN, HID = 5, 3, 4, 6


def recurrent_model(op, direction="forward", layout=0, with_initial=True, with_lens=False, **attrs):
    rng = np.random.default_rng(hash((op, direction, layout)) % 2**32)
    dirs = 2 if direction == "bidirectional" else 1
    g = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    w = (rng.standard_normal((dirs, g * HID, IN)) * 0.5).astype(np.float32)
    r = (rng.standard_normal((dirs, g * HID, HID)) * 0.5).astype(np.float32)
    b = (rng.standard_normal((dirs, 2 * g * HID)) * 0.5).astype(np.float32)
    xs = [SEQ, BATCH, IN] if layout == 0 else [BATCH, SEQ, IN]
    hs = [dirs, BATCH, HID] if layout == 0 else [BATCH, dirs, HID]
    ins = [tinfo("x", shape=xs)]
    names = ["x", "w", "r", "b", "lens" if with_lens else ""]
    if with_lens:
        ins.append(tinfo("lens", TensorProto.INT32, [BATCH]))
    if with_initial:
        names.append("h0")
        ins.append(tinfo("h0", shape=hs))
        if op == "LSTM":
            names.append("c0")
            ins.append(tinfo("c0", shape=hs))
    outs = ["y", "y_h"] + (["y_c"] if op == "LSTM" else [])
    node = helper.make_node(op, names, outs, hidden_size=HID, direction=direction, layout=layout, **attrs)
    m = model([node], ins, [tinfo(o) for o in outs], [init("w", w), init("r", r), init("b", b)], opset=14)
    feeds = {"x": rng.standard_normal(xs).astype(np.float32)}
    if with_lens:
        feeds["lens"] = np.array([SEQ, 2, 4], np.int32)
    if with_initial:
        feeds["h0"] = rng.standard_normal(hs).astype(np.float32)
        if op == "LSTM":
            feeds["c0"] = rng.standard_normal(hs).astype(np.float32)
    return m, feeds


CASES = [
    ("LSTM", {"direction": "bidirectional"}),
    ("LSTM", {"layout": 1, "with_initial": False}),
    ("LSTM", {"with_lens": True, "clip": 1.5}),
    ("GRU", {"direction": "bidirectional"}),
    ("GRU", {"direction": "reverse", "linear_before_reset": 1}),
    ("GRU", {"with_lens": True}),
    ("GRU", {"layout": 1}),
    ("RNN", {"direction": "bidirectional", "activations": ["Relu", "Tanh"]}),
    ("RNN", {"layout": 1, "with_initial": False}),
]


@pytest.mark.parametrize("op,kw", CASES, ids=[f"{o}-{'-'.join(f'{k}={v}' for k, v in kw.items())}" for o, kw in CASES])
def test_recurrent_matches_onnxruntime_and_is_graphed(op, kw):
    m, feeds = recurrent_model(op, **kw)
    out, bundle = compile_and_run(m, feeds, strict=True)
    if kw.get("layout"):
        ref = dict(zip([o.name for o in m.graph.output], ReferenceEvaluator(m).run(None, feeds)))
    else:
        ref = ort_run(m, feeds)
    for name, want in ref.items():
        np.testing.assert_allclose(out[name], want, rtol=1e-5, atol=1e-5, err_msg=name)
    loops = [st for st in walk_steps(bundle.plans[0].steps) if isinstance(st, LoopStep)]
    assert loops and all(lp.graphed for lp in loops)
    assert len(loops) == (2 if kw.get("direction") == "bidirectional" else 1)


def test_input_projection_is_hoisted_out_of_the_loop():
    """The x @ W^T GEMM covers every time step before the loop; only h @ R^T runs per step."""
    m, feeds = recurrent_model("LSTM")
    _, bundle = compile_and_run(m, feeds)
    (loop,) = [st for st in walk_steps(bundle.plans[0].steps) if isinstance(st, LoopStep)]
    in_loop = {id(st) for st in walk_steps(loop.body.steps)}
    gemms_outside = [st for st in walk_steps(bundle.plans[0].steps)
                     if getattr(st, "op", "") == "library" and id(st) not in in_loop]
    assert gemms_outside, "the input projection should be one GEMM outside the loop"
    out_buf = bundle.plans[0].buffers[gemms_outside[0].out]
    assert out_buf.shape[-1] == 4 * HID and SEQ * BATCH in (np.prod(out_buf.shape[:-1]),)
