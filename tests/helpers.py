"""Small helpers shared by the tests: build ONNX models, compile+run through a bundle round trip."""
import os

import numpy as np
import onnx
from onnx import TensorProto, helper

import grapec
from grapec.bundle.format import Bundle


def model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def tinfo(name, dtype=TensorProto.FLOAT, shape=None):
    return helper.make_tensor_value_info(name, dtype, shape)


def init(name, arr):
    return onnx.numpy_helper.from_array(np.asarray(arr), name)


def compile_and_run(m, feeds, **kw):
    shapes = {k: v.shape for k, v in feeds.items()}
    kw.setdefault("targets", [])   # CPU backend: no GPU code needed
    b = grapec.compile(m, shapes=shapes, **kw)
    sess = grapec.load(Bundle.from_bytes(b.to_bytes()), backend="cpu")
    return sess.run(feeds), b


def ort_run(m, feeds):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds)))


def rel_err(got, ref):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    den = np.linalg.norm(ref)
    return float(np.linalg.norm(got - ref) / den) if den else float(np.abs(got - ref).max(initial=0))


def run_both(op, feeds, consts=None, attrs=None, outs=1, out_types=None, opset=18):
    """One-node model: `feeds` are graph inputs, `consts` initializers, named <x>_<position>;
    a None const is an absent optional input. Returns (grapec outputs, onnxruntime outputs)."""
    args = {**feeds, **(consts or {})}
    order = sorted(args, key=lambda n: int(n.split("_")[-1]))
    node = helper.make_node(op, [n if args[n] is not None else "" for n in order],
                            [f"y{i}" for i in range(outs)], **(attrs or {}))
    first = next(iter(feeds.values()))
    out_types = out_types or [helper.np_dtype_to_tensor_dtype(first.dtype)] * outs
    m = model([node], [tinfo(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for n, v in feeds.items()],
              [tinfo(f"y{i}", t) for i, t in enumerate(out_types)],
              [init(n, v) for n, v in (consts or {}).items() if v is not None], opset=opset)
    got, _ = compile_and_run(m, feeds)
    ref = ort_run(m, feeds)
    return [got[f"y{i}"] for i in range(outs)], [ref[f"y{i}"] for i in range(outs)]


def needs_nvrtc():
    """Skip the calling test where NVRTC cannot compile CUDA C (cuda-bindings or its library missing)."""
    import pytest
    pytest.importorskip("cuda.bindings.nvrtc", reason="NVRTC (cuda-bindings) is not installed")
    from grapec.codegen.nvrtc import NvrtcUnavailable, nvrtc_version
    try:
        nvrtc_version()
    except NvrtcUnavailable as e:
        pytest.skip(f"no NVRTC: {e}")


def only_float32_attention_notes(bundle):
    """Everything runs in the CUDA graph and fuses but float32 attention (the fused kernel is half
    precision; --strict would refuse the bundle for that note alone)."""
    notes = bundle.manifest["notes"]
    assert all("stays GEMM + softmax + GEMM: float32" in n for n in notes), notes


def gpt2_with_positions(n: int, path: str) -> str:
    """Tiny GPT-2 with a position table of n rows (its first 64 the model's own), saved at path."""
    from onnx import numpy_helper
    m = onnx.load(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models", "tiny", "gpt2.onnx"))
    for i, t in enumerate(m.graph.initializer):
        if t.name.endswith("wpe.weight"):
            a = numpy_helper.to_array(t)
            big = np.random.default_rng(0).standard_normal((n, a.shape[1])).astype(a.dtype) * a.std()
            big[:len(a)] = a
            m.graph.initializer[i].CopyFrom(numpy_helper.from_array(big, t.name))
    onnx.save(m, path)
    return path
