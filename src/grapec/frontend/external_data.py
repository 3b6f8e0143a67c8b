"""A model's external data (weights beside the .onnx file, as every model over 2 GB has them) mapped
from its files, not read into memory.

onnx.load reads every external tensor into the protobuf, and the import then copies it into numpy:
twice the weights resident before compiling starts (5 GB for a 1.2 B fp16 decoder). Instead the
model is loaded without its data (`bind_external_data`): each external tensor's location is checked
(inside the model's folder, in bounds of its file) and made absolute, and `tensor_array` gives a
read-only numpy view of the file's bytes (np.memmap) for the types whose bytes numpy reads as they
are, or reads the bytes for the rest (bfloat16, 4-bit and 8-bit floats: onnx's own conversion).
The pages are the file's: the kernel reads them when the compile touches them and may drop them
again, so a weight used as it is (fp16 into an fp16 bundle) is never copied before it is written.
"""
from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper
from onnx.external_data_helper import ExternalDataInfo

from ..errors import ModelError

# element types whose bytes in the file are numpy's array bytes, as they are (little-endian)
_MAPPED = {TensorProto.FLOAT: np.float32, TensorProto.DOUBLE: np.float64, TensorProto.FLOAT16: np.float16,
           TensorProto.INT8: np.int8, TensorProto.UINT8: np.uint8, TensorProto.INT16: np.int16,
           TensorProto.UINT16: np.uint16, TensorProto.INT32: np.int32, TensorProto.UINT32: np.uint32,
           TensorProto.INT64: np.int64, TensorProto.UINT64: np.uint64, TensorProto.BOOL: np.bool_}


def _all_tensors(g: onnx.GraphProto):
    """Every tensor of g: initializers and tensor attributes, of its subgraphs too."""
    yield from g.initializer
    for n in g.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                yield a.t
            elif a.type == onnx.AttributeProto.TENSORS:
                yield from a.tensors
            elif a.type == onnx.AttributeProto.GRAPH:
                yield from _all_tensors(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for body in a.graphs:
                    yield from _all_tensors(body)


def uses_external_data(t: TensorProto) -> bool:
    return t.HasField("data_location") and t.data_location == TensorProto.EXTERNAL


def bind_external_data(model: onnx.ModelProto, base_dir: str, where: str):
    """Point every external tensor of a model loaded without its data at its file by absolute path,
    after checking that the file is inside base_dir (as onnx's loader requires), exists, and holds
    the tensor's bytes."""
    root = os.path.realpath(base_dir)
    sizes: dict = {}
    for t in _all_tensors(model.graph):
        if not uses_external_data(t):
            continue
        info = ExternalDataInfo(t)
        if not info.location or os.path.isabs(info.location):
            raise ModelError(f"{where}: tensor '{t.name}': external data location {info.location!r} must be a path "
                             "relative to the model's folder")
        path = os.path.realpath(os.path.join(root, info.location))
        if os.path.commonpath([root, path]) != root:
            raise ModelError(f"{where}: tensor '{t.name}': external data location {info.location!r} is outside the "
                             f"model's folder {root}")
        if path not in sizes:
            if not os.path.isfile(path):
                raise ModelError(f"{where}: external data file missing: {path} (tensor '{t.name}')")
            sizes[path] = os.path.getsize(path)
        offset = int(info.offset or 0)
        length = int(info.length) if info.length is not None else sizes[path] - offset
        if offset < 0 or length < 0 or offset + length > sizes[path]:
            raise ModelError(f"{where}: tensor '{t.name}': external data at offset {offset}, {length} bytes, is past "
                             f"the end of {path} ({sizes[path]} bytes)")
        for entry in t.external_data:
            if entry.key == "location":
                entry.value = path


def tensor_array(t: TensorProto) -> np.ndarray:
    """A tensor's values: a read-only view of its external file's bytes where they map as they are,
    else an array of its own."""
    if not uses_external_data(t):
        return numpy_helper.to_array(t)
    info = ExternalDataInfo(t)
    if not os.path.isabs(info.location):
        raise ModelError(f"tensor '{t.name}': its data is in an external file ({info.location}) that was not loaded: "
                         "pass the model's path, not a ModelProto loaded without its external data")
    offset = int(info.offset or 0)
    shape = tuple(int(d) for d in t.dims)
    dtype = _MAPPED.get(t.data_type)
    if dtype is not None:
        count = int(np.prod(shape, dtype=np.int64))
        nbytes = count * np.dtype(dtype).itemsize
        if info.length is not None and int(info.length) != nbytes:
            raise ModelError(f"tensor '{t.name}': its external data is {info.length} bytes; {list(shape)} of "
                             f"{np.dtype(dtype).name} takes {nbytes}")
        if count == 0:
            return np.empty(shape, dtype)
        return np.asarray(np.memmap(info.location, dtype, "r", offset, (count,))).reshape(shape)
    with open(info.location, "rb") as f:   # types numpy does not read as bytes: onnx's conversion
        f.seek(offset)
        data = f.read(int(info.length)) if info.length is not None else f.read()
    inline = TensorProto(name=t.name, data_type=t.data_type, dims=t.dims, raw_data=data)
    return numpy_helper.to_array(inline)
