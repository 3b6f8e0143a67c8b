"""IOBinding: inputs and outputs bound to the caller's buffers, as onnxruntime's IOBinding.

    binding = sess.io_binding()
    binding.bind_input("input_ids", ids)       # a device array (torch, cupy, anything with
                                               # __cuda_array_interface__ or DLPack) or a host array
    binding.bind_output("logits", logits)      # a device array to write into; or no array: the
                                               # output stays in the session's arena
    sess.run_with_iobinding(binding)
    binding.get_outputs()                      # {name: the bound array or a device view}
    binding.copy_outputs_to_cpu()              # [numpy arrays]
    sess.io_report()                           # per bound name: patched or copied, and why

On the CUDA backend a bound device buffer is patched into the graph nodes that read or write it
where that is cheaper than a copy (runtime/cuda/binding.py); the report says which, and the copy
saved. The bindings stay until cleared, so a serving loop binds once and runs many times.
"""
from __future__ import annotations

import ctypes

import numpy as np

from ..errors import InputError


class DeviceBuffer:
    """A caller's device array as grapec sees it: pointer, shape, dtype (and the object, kept alive)."""

    def __init__(self, obj, ptr: int, shape: tuple, dtype: np.dtype):
        self.obj, self.ptr, self.shape, self.dtype = obj, ptr, tuple(int(d) for d in shape), np.dtype(dtype)

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False), "version": 3,
                "strides": None}


def device_buffer(obj, what: str) -> DeviceBuffer | None:
    """A contiguous device array behind obj (__cuda_array_interface__, else DLPack on a CUDA device);
    None for a host array. Strided views are refused by name."""
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        dtype = np.dtype(cai["typestr"])
        strides = cai.get("strides")
        if strides not in (None, ()) and tuple(strides) != contiguous_strides(cai["shape"], dtype.itemsize):
            raise InputError(f"{what}: a device array bound must be contiguous (got strides {list(strides)})")
        return DeviceBuffer(obj, int(cai["data"][0]), cai["shape"], dtype)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        device_type, _ = obj.__dlpack_device__()
        if int(device_type) in (_DL_CUDA, _DL_CUDA_MANAGED):
            return _from_dlpack(obj, what)
    return None


def contiguous_strides(shape, itemsize: int) -> tuple:
    """Byte strides of a C-contiguous array."""
    strides, acc = [], itemsize
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


# DLPack (dlpack.h): a capsule named "dltensor" holding a DLManagedTensor, read without consuming it
_DL_CUDA, _DL_CUDA_MANAGED = 2, 13
_DL_TYPES = {(0, 8): "int8", (0, 16): "int16", (0, 32): "int32", (0, 64): "int64", (1, 8): "uint8",
             (1, 16): "uint16", (1, 32): "uint32", (1, 64): "uint64", (2, 16): "float16", (2, 32): "float32",
             (2, 64): "float64", (6, 8): "bool"}


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


def _from_dlpack(obj, what: str) -> DeviceBuffer:
    capsule = obj.__dlpack__()
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    t = _DLTensor.from_address(get(capsule, b"dltensor"))   # DLManagedTensor starts with its DLTensor
    dtype = _DL_TYPES.get((t.dtype.code, t.dtype.bits))
    if dtype is None or t.dtype.lanes != 1:
        raise InputError(f"{what}: DLPack dtype code {t.dtype.code}, {t.dtype.bits} bits has no grapec type")
    shape = tuple(t.shape[i] for i in range(t.ndim))
    if t.strides:
        strides = tuple(t.strides[i] * np.dtype(dtype).itemsize for i in range(t.ndim))
        if strides != contiguous_strides(shape, np.dtype(dtype).itemsize) and 0 not in shape:
            raise InputError(f"{what}: a device array bound must be contiguous")
    # the capsule (not consumed: no one renamed it "used_dltensor") frees the tensor; obj keeps the memory
    return DeviceBuffer(obj, int(t.data or 0) + int(t.byte_offset), shape, np.dtype(dtype))


class IOBinding:
    """Inputs and outputs bound to caller arrays for Session.run_with_iobinding."""

    def __init__(self, session):
        self._session = session
        self.inputs: dict = {}     # name -> DeviceBuffer | numpy array
        self.outputs: dict = {}    # name -> DeviceBuffer | numpy array | None (the session's own buffer)
        self._results: dict = {}

    def bind_input(self, name: str, array):
        known = [i.name for i in self._session.get_inputs()]
        if name not in known:
            raise InputError(f"bind_input: unknown input '{name}' (the model's inputs: {', '.join(known)})")
        buf = device_buffer(array, f"input '{name}'")
        self.inputs[name] = buf if buf is not None else np.asarray(array)

    def bind_cpu_input(self, name: str, array: np.ndarray):
        """onnxruntime's name for binding a host array (bind_input takes host and device arrays alike)."""
        self.bind_input(name, np.asarray(array))

    def bind_output(self, name: str, array=None):
        known = [o.name for o in self._session.get_outputs()]
        if name not in known:
            raise InputError(f"bind_output: unknown output '{name}' (the model's outputs: {', '.join(known)})")
        if array is None:
            self.outputs[name] = None
            return
        buf = device_buffer(array, f"output '{name}'")
        if buf is None:
            if not isinstance(array, np.ndarray) or not array.flags.c_contiguous or not array.flags.writeable:
                raise InputError(f"output '{name}': bind a writable, contiguous numpy array or a device array")
            buf = array
        self.outputs[name] = buf

    def clear_binding_inputs(self):
        self.inputs.clear()

    def clear_binding_outputs(self):
        self.outputs.clear()

    def get_outputs(self) -> dict:
        """name -> the array the last run wrote: the bound one, or a device view of the session's."""
        return dict(self._results)

    def copy_outputs_to_cpu(self) -> list:
        return [self._session.to_host(a) for a in self._results.values()]
