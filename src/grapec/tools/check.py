"""`grapec check`: compile, run on a backend, and compare with onnxruntime (CPU), as polygraphy does.
The measure each output is judged by is compiler/accuracy.py's, which compile's calibration shares.
"""
from __future__ import annotations

import os
import tempfile
import time
from contextlib import contextmanager

import numpy as np

from ..compiler.accuracy import HALF_TOLERANCE, check_limits, compare
from ..errors import GrapecError

REFERENCES = {"onnxruntime": "onnxruntime CPU", "onnxruntime-cuda": "onnxruntime CUDA (no TF32)", "onnx": "onnx.reference"}


def reference_outputs(model_path, feeds: dict, reference: str = "onnxruntime", say=None) -> dict:
    """The model's outputs in fp32 from onnxruntime's CPU provider, its CUDA provider
    ("onnxruntime-cuda": onnxruntime-gpu, TF32 off, refused where the provider is missing or does
    not take the session), or onnx.reference (numpy, exact integer arithmetic; slow, but the
    arbiter where onnxruntime's x86 int8 kernels saturate)."""
    if reference == "onnx":
        return _onnx_reference(model_path, feeds)
    try:
        import onnxruntime as ort
    except ImportError:
        raise GrapecError("grapec check needs onnxruntime as the reference: pip install 'grapec[cpu]' (onnxruntime), or "
                          "'grapec[gpu]' (onnxruntime-gpu)") from None
    providers = ["CPUExecutionProvider"]
    if reference == "onnxruntime-cuda":
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise GrapecError("--reference onnxruntime-cuda: onnxruntime's CUDA provider is not installed here "
                              f"(providers: {', '.join(ort.get_available_providers())}); pip install 'grapec[gpu]' "
                              "(onnxruntime-gpu)")
        providers = [("CUDAExecutionProvider", {"use_tf32": "0"})]
    so = ort.SessionOptions()
    so.log_severity_level = 3
    try:
        with _float_accuracy(model_path, say) as source:
            s = ort.InferenceSession(source, so, providers=providers)
    except Exception as e:  # noqa: BLE001 - the reference failing is the user's model's problem
        raise GrapecError(f"onnxruntime could not load {model_path} as a reference: {str(e).splitlines()[0]}") from None
    if reference == "onnxruntime-cuda" and s.get_providers()[0] != "CUDAExecutionProvider":
        raise GrapecError(f"--reference onnxruntime-cuda: onnxruntime did not start its CUDA provider (it runs on "
                          f"{', '.join(s.get_providers())}); check its CUDA and cuDNN libraries")
    try:
        return dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds)))
    except Exception as e:  # noqa: BLE001 - the reference failing is the user's model's problem
        raise GrapecError(f"onnxruntime could not run {model_path} as a reference: {str(e).splitlines()[0]}") from None


@contextmanager
def _float_accuracy(model_path, say=None):
    """The model for onnxruntime: its path, or, where a MatMulNBits asks for an accuracy_level, the model
    with level 0. onnxruntime-genai's builder asks its CPU kernel for level 4 (activations quantized
    to int8 on the fly), which moves logits by ~1e-2 from exact arithmetic; grapec, like onnxruntime's
    CUDA kernel, computes in float, and so does the reference then. A model with external data is
    written beside its data for the session's creation, then removed."""
    import onnx
    model = onnx.load(str(model_path), load_external_data=False)
    levels = [a for n in model.graph.node if n.op_type == "MatMulNBits"
              for a in n.attribute if a.name == "accuracy_level" and a.i]
    if not levels:
        yield str(model_path)
        return
    if say is not None:
        say(f"reference: {len(levels)} MatMulNBits with accuracy_level {levels[0].i} run at level 0 (float "
            "activations, as grapec computes; at level 4 onnxruntime's CPU kernel quantizes them to int8)")
    for a in levels:
        a.i = 0
    if not any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
        yield model.SerializeToString()
        return
    fd, path = tempfile.mkstemp(suffix=".onnx", prefix=".grapec-reference-", dir=os.path.dirname(os.path.abspath(model_path)))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(model.SerializeToString())
        yield path
    finally:
        os.unlink(path)


def _onnx_reference(model_path, feeds: dict) -> dict:
    import onnx
    from onnx.reference import ReferenceEvaluator
    from onnx.reference.ops.op_dequantize_linear import DequantizeLinear_19

    class DequantizeLinear(DequantizeLinear_19):   # onnx.reference registers opset 19+ only;
        op_domain = ""                              # 10 and 13 are the same op with fewer types

        def _run(self, x, x_scale, x_zero_point=None, axis=1, block_size=0, output_dtype=None):
            return super()._run(x, x_scale, x_zero_point, axis)
    try:
        model = onnx.load(str(model_path))
        names = [o.name for o in model.graph.output]
        return dict(zip(names, ReferenceEvaluator(model, new_ops=[DequantizeLinear]).run(None, feeds)))
    except Exception as e:  # noqa: BLE001
        raise GrapecError(f"onnx.reference could not run {model_path}: {type(e).__name__}: {str(e).splitlines()[0][:200]}") from None


def check_model(model_path, shapes=None, dims=None, backend="cpu", rtol=None, seed=0, progress=None,
                precision="fp32", atol=None, inputs=None, values=None, calibration_inputs=None,
                precision_tolerance=None, reference="onnxruntime", calibration_dims=None, conv="auto",
                attention="auto", bounds=None):
    """-> (list of OutputCheck, seconds grapec's run took). The reference runs the model in fp32:
    onnxruntime's CPU provider, its CUDA provider (reference="onnxruntime-cuda"), or onnx.reference
    (reference="onnx"). inputs: name -> array for inputs not drawn at random; values: inputs fixed at compile time;
    bounds: upper bounds of data-dependent sizes (--bound)."""
    import grapec
    from ..bundle.format import Bundle
    from ..bundle.inputs import bundle_inputs
    elementwise = precision not in HALF_TOLERANCE or atol is not None or rtol is not None
    atol, rtol, max_rel_l2 = check_limits(precision, precision_tolerance, atol, rtol)
    given = dict(inputs or {})
    shapes = {**{k: np.shape(v) for k, v in given.items()}, **(shapes or {})}
    bundle = grapec.compile(model_path, shapes=shapes, dims=dims, progress=progress, precision=precision,
                            targets=[] if backend == "cpu" else "auto", values=values,
                            calibration_inputs=calibration_inputs, precision_tolerance=precision_tolerance,
                            calibration_dims=calibration_dims, conv=conv, attention=attention, bounds=bounds or None)
    sess = grapec.load(Bundle.from_bytes(bundle.to_bytes()), backend=backend)
    feeds = {**bundle_inputs(bundle.manifest, 0, seed), **given}
    t0 = time.perf_counter()
    outs = sess.run(feeds)
    dt = time.perf_counter() - t0
    refs = reference_outputs(model_path, {**sess.fixed_inputs, **feeds}, reference, progress)
    return [compare(n, outs[n], refs[n], atol, rtol, max_rel_l2, elementwise) for n in outs], dt
