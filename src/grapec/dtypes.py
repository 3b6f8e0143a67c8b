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
    # Narrow types: one element per byte (ml_dtypes' layout; ONNX's packing of the 4- and 2-bit types
    # into bytes is undone by onnx.numpy_helper), decoded when loaded and encoded when stored.
    "float8e4m3fn": (TensorProto.FLOAT8E4M3FN, ml_dtypes.float8_e4m3fn, "unsigned char"),
    "float8e4m3fnuz": (TensorProto.FLOAT8E4M3FNUZ, ml_dtypes.float8_e4m3fnuz, "unsigned char"),
    "float8e5m2": (TensorProto.FLOAT8E5M2, ml_dtypes.float8_e5m2, "unsigned char"),
    "float8e5m2fnuz": (TensorProto.FLOAT8E5M2FNUZ, ml_dtypes.float8_e5m2fnuz, "unsigned char"),
    "float4e2m1": (TensorProto.FLOAT4E2M1, ml_dtypes.float4_e2m1fn, "unsigned char"),
    "int4": (TensorProto.INT4, ml_dtypes.int4, "unsigned char"),
    "uint4": (TensorProto.UINT4, ml_dtypes.uint4, "unsigned char"),
    "int2": (TensorProto.INT2, ml_dtypes.int2, "unsigned char"),
    "uint2": (TensorProto.UINT2, ml_dtypes.uint2, "unsigned char"),
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
# 8- and 4-bit floats: held in float32 registers too, with no arithmetic of their own.
MINIFLOAT = ("float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz", "float4e2m1")
# 4- and 2-bit integers: held in 8-bit registers; a value stored wraps to its bits, as a C cast does.
SUBBYTE_INT = {"int4": "int8", "uint4": "uint8", "int2": "int8", "uint2": "uint8"}
# Stored in another form than they are computed in: a cast to one rounds (or wraps) at once.
ENCODED = HALF + MINIFLOAT + tuple(SUBBYTE_INT)


def is_half(name: str) -> bool:
    return name in HALF


def is_encoded(name: str) -> bool:
    return name in ENCODED


def accumulation(name: str) -> str:
    """The dtype a value of this dtype is computed and accumulated in."""
    if name in HALF or name in MINIFLOAT:
        return "float32"
    return SUBBYTE_INT.get(name, name)


def int_range(name: str) -> tuple:
    """(min, max) of an integer dtype, sub-byte ones included."""
    info = ml_dtypes.iinfo(np_dtype(name))
    return int(info.min), int(info.max)


def float_max(name: str) -> float:
    """The largest finite value of a float dtype (what a saturating cast clamps to)."""
    return float(ml_dtypes.finfo(np_dtype(name)).max)


def is_int(name: str) -> bool:
    return name.startswith(("int", "uint"))


def is_signed(name: str) -> bool:
    return name.startswith(("int", "float", "bfloat"))
