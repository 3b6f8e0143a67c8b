"""ONNX op lowerings, one small function per op (onnx.reference style), grouped by family:

    elementwise.py   unary/binary/variadic math, comparisons, logic, activations, Cast, Where
    reduce.py        Reduce*, ArgMax/ArgMin, Softmax family, normalizations, CumSum, LRN, losses
    movement.py      Reshape, Transpose, Slice, Concat, Split, Pad, Expand, Tile, DepthToSpace...
    gather.py        Gather, GatherElements, GatherND, Compress, Scatter, ScatterElements, ScatterND
    resize.py        Resize, Upsample
    indexing.py      what the index-remapping ops share: index tests, clamps, masked reads, tables
    shape.py         Shape, Size, ConstantOfShape, Range, Constant, EyeLike, OneHot...
    selection.py     NonZero, NonMaxSuppression, Compress on run-time data: sizes the data decides
    counted.py       how those sizes travel through the other ops (predication, issue 36)
    nn.py            MatMul, Gemm (Library nodes), TopK, Einsum, Attention, RotaryEmbedding
    conv.py          Conv (channels-last `conv` or im2col + `matmul`), ConvTranspose (Library nodes)
    pool.py          MaxPool, AveragePool, LpPool, Global*Pool
    window.py        what windowed ops share: strides, dilations, pads, masked reads
    sample.py        GridSample, AffineGrid, RoiAlign
    spectral.py      DFT, STFT, Hann/Hamming/BlackmanWindow
    quant.py         QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, MatMulInteger, QLinearMatMul, ConvInteger,
                     com.microsoft:MatMulNBits
    control.py       If, Loop (regions)

Each is registered with `@op("OpName")` (`@op("domain:OpName")` outside the standard domain) and
receives a LowerCtx (ops/context.py).
"""
from __future__ import annotations

from typing import Callable

REGISTRY: dict[str, Callable] = {}


def op(*names: str):
    def register(fn):
        for n in names:
            assert n not in REGISTRY, f"op {n} registered twice"
            REGISTRY[n] = fn
        return fn
    return register


def lowering(op_type: str, domain: str = "") -> Callable | None:
    """The lowering of op_type; an op of another domain is registered as "domain:Name"
    (onnxruntime's com.microsoft ops that are lowered, not rewritten by frontend/contrib.py)."""
    _load_all()
    return REGISTRY.get(op_type if domain in ("", "ai.onnx") else f"{domain}:{op_type}")


_loaded = False


def _load_all():
    global _loaded
    if _loaded:
        return
    _loaded = True
    import importlib
    for mod in ("elementwise", "reduce", "movement", "gather", "resize", "shape", "nn", "conv", "pool", "quant",
                "sample", "spectral", "control", "selection"):
        try:
            importlib.import_module(f"{__name__}.{mod}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{mod}":
                raise


def supported_ops() -> list:
    _load_all()
    return sorted(REGISTRY)
