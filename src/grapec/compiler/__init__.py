"""The compiler: an ONNX model in, a bundle out (pipeline.py), with its precision chosen by
calibration (mixed_precision.py: the lowered graphs evaluated by ir/evaluate.py, judged by
accuracy.py) and its buckets spread over processes (fanout.py). It sits above the runtime, whose
devices.py says how much host memory calibration may take."""
from .pipeline import compile_graph, compile_model

__all__ = ["compile_graph", "compile_model"]
