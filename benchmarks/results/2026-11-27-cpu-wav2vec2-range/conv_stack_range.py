import sys, time
sys.path.insert(0, "src")
import numpy as np, onnx
from onnx import helper, TensorProto, numpy_helper
rng = np.random.default_rng(0)
C = 8
nodes, inits = [], []
x = "input_values"
nodes.append(helper.make_node("Unsqueeze", [x, "ax1"], ["u"])); inits.append(numpy_helper.from_array(np.array([1], np.int64), "ax1"))
prev, cin = "u", 1
for i, (k, s) in enumerate(zip((10, 3, 3, 3, 3, 2, 2), (5, 2, 2, 2, 2, 2, 2))):
    w = (rng.standard_normal((C, cin, k)) / np.sqrt(cin * k)).astype(np.float32)
    inits.append(numpy_helper.from_array(w, f"w{i}"))
    nodes.append(helper.make_node("Conv", [prev, f"w{i}"], [f"c{i}"], strides=[s], kernel_shape=[k]))
    if i == 0:
        inits += [numpy_helper.from_array(np.ones(C, np.float32), "gs"), numpy_helper.from_array(np.zeros(C, np.float32), "gb")]
        nodes.append(helper.make_node("InstanceNormalization", [f"c{i}", "gs", "gb"], [f"n{i}"]))
        nodes.append(helper.make_node("Gelu", [f"n{i}"], [f"g{i}"], domain=""))
    else:
        nodes.append(helper.make_node("Gelu", [f"c{i}"], [f"g{i}"]))
    prev, cin = f"g{i}", C
nodes.append(helper.make_node("Transpose", [prev], ["t"], perm=[0, 2, 1]))
inits.append(numpy_helper.from_array((rng.standard_normal((C, 16)) / 3).astype(np.float32), "wp"))
nodes.append(helper.make_node("MatMul", ["t", "wp"], ["p"]))
nodes.append(helper.make_node("Transpose", ["p"], ["pt"], perm=[0, 2, 1]))
nodes.append(helper.make_node("MatMul", ["p", "pt"], ["scores"]))   # frames x frames
nodes.append(helper.make_node("Softmax", ["scores"], ["attn"], axis=-1))
nodes.append(helper.make_node("MatMul", ["attn", "p"], ["y"]))
g = helper.make_graph(nodes, "convstack", [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["batch", "samples"])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)], ir_version=9)
onnx.save(m, "/tmp/convstack.onnx")
import onnxruntime as ort, grapec
from grapec.compiler import compile_model
from grapec.bundle.format import Bundle
lo, hi = int(sys.argv[1]), int(sys.argv[2])
t0 = time.time()
b = compile_model("/tmp/convstack.onnx", dims={"batch": 1}, dynamic={"samples": (lo, hi)}, jobs=2, targets=[],
                  progress=lambda m: print(f"[{time.time()-t0:6.1f}s] {m[:600]}", flush=True) if "sizes compiled (" not in m else None)
rb = Bundle.from_bytes(b.to_bytes())
sess, ref = grapec.load(rb, backend="cpu"), ort.InferenceSession("/tmp/convstack.onnx", providers=["CPUExecutionProvider"])
worst = 0
for n in rng.integers(lo, hi + 1, 12):
    f = {"input_values": rng.standard_normal((1, int(n))).astype(np.float32)}
    got, want = sess.run(f)["y"], ref.run(None, f)[0]
    rel = np.linalg.norm(got - want) / np.linalg.norm(want); worst = max(worst, rel)
    assert np.allclose(got, want, rtol=1e-4, atol=1e-4), (n, rel)
print(f"12 random lengths equal to onnxruntime, worst {worst:.2e}; {time.time()-t0:.0f}s")
