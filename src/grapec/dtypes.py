"""Element types: ONNX enum <-> numpy dtype <-> CUDA C type, in one table."""
from __future__ import annotations

import ml_dtypes
import numpy as np
from onnx import TensorProto

# name -> (onnx enum, numpy dtype, C type)
_TABLE = {
    "float32": (TensorProto.FLOAT, np.float32, "float"),
    "float64": (TensorProto.DOUBLE, np.float64, "double"),
    "float16": (TensorProto.FLOAT16, np.float16, "__half"),
    "bfloat16": (TensorProto.BFLOAT16, ml_dtypes.bfloat16, "__nv_bfloat16"),
    "int8": (TensorProto.INT8, np.int8, "signed char"),
    "int16": (TensorProto.INT16, np.int16, "short"),
    "int32": (TensorProto.INT32, np.int32, "int"),
    "int64": (TensorProto.INT64, np.int64, "long long"),
    "uint8": (TensorProto.UINT8, np.uint8, "unsigned char"),
    "uint16": (TensorProto.UINT16, np.uint16, "unsigned short"),
    "uint32": (TensorProto.UINT32, np.uint32, "unsigned int"),
    "uint64": (TensorProto.UINT64, np.uint64, "unsigned long long"),
    "bool": (TensorProto.BOOL, np.bool_, "bool"),
}

_BY_ONNX = {v[0]: k for k, v in _TABLE.items()}

SUPPORTED = tuple(_TABLE)


def from_onnx(elem_type: int) -> str:
    """ONNX TensorProto enum -> dtype name; raises KeyError for types grapec does not run."""
    return _BY_ONNX[elem_type]


def onnx_name(elem_type: int) -> str:
    return TensorProto.DataType.Name(elem_type).lower()


def to_onnx(name: str) -> int:
    return _TABLE[name][0]


def np_dtype(name: str) -> np.dtype:
    return np.dtype(_TABLE[name][1])


def from_numpy(dt) -> str:
    dt = np.dtype(dt)
    for name, (_, npt, _) in _TABLE.items():
        if np.dtype(npt) == dt:
            return name
    raise KeyError(str(dt))


def c_type(name: str) -> str:
    return _TABLE[name][2]


def itemsize(name: str) -> int:
    return np_dtype(name).itemsize


def is_float(name: str) -> bool:
    return name.startswith(("float", "bfloat"))


# 16-bit floats: held in float32 registers, rounded when stored; sums accumulate in float32.
HALF = ("float16", "bfloat16")


def is_half(name: str) -> bool:
    return name in HALF


def accumulation(name: str) -> str:
    """The dtype a value of this dtype is computed and accumulated in."""
    return "float32" if name in HALF else name


def is_int(name: str) -> bool:
    return name.startswith(("int", "uint"))


def is_signed(name: str) -> bool:
    return name.startswith(("int", "float", "bfloat"))
