"""The compiler: an ONNX model in, a bundle out (pipeline.py), with its precision chosen by
calibration (mixed_precision.py, judged by accuracy.py) and its buckets spread over processes
(fanout.py). It sits above the runtime: calibration runs the model on the CPU backend."""
from .pipeline import compile_graph, compile_model

__all__ = ["compile_graph", "compile_model"]
