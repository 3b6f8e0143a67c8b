"""Small helpers shared by the tests: build ONNX models, compile+run through a bundle round trip."""
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
