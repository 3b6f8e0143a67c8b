"""A view of device memory a run returns (`on_device=True`, IOBinding): the arena's bytes of one output, for
zero-copy interop through __cuda_array_interface__."""
from __future__ import annotations

from ... import dtypes


class DeviceArray:
    """A view of device memory in the arena, for zero-copy interop (__cuda_array_interface__);
    `stream`: the stream of the runner whose arena it is (the work that writes it runs there)."""

    def __init__(self, ptr: int, shape, dtype: str, stream=None, strides: tuple | None = None):
        self.ptr, self.shape, self.dtype, self.stream = ptr, tuple(shape), dtype, stream
        self.strides = strides   # bytes per dim, where the rows are padded (as torch's own padded logits)

    @staticmethod
    def of(ptr: int, buf, stream=None) -> "DeviceArray":
        """A plan buffer's bytes at ptr, with its padded rows' strides."""
        isz = dtypes.itemsize(buf.dtype)
        strides = tuple(s * isz for s in buf.strides) if buf.pitch else None
        return DeviceArray(ptr, buf.shape, buf.dtype, stream, strides)

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": dtypes.np_dtype(self.dtype).str, "data": (self.ptr, False),
                "version": 3, "strides": self.strides}
