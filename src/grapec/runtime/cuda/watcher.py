"""A watched buffer (runtime/watch.py) on the GPU: read while the graph runs, on a stream of its own.

The runner's stream holds the launched graph; a copy on another stream (non-blocking, so it waits for
nothing on the runner's) runs beside it on a copy engine and reads what the graph's kernels have
written so far. An event recorded after the launch says when the run is done; the copy after that is
the last. A copy of an int64 element is never torn, and a generation's tokens only ever go from -1
to their value, so any copy is a prefix of what the run will give.
"""
from __future__ import annotations

import ctypes
import time

import numpy as np

from ... import dtypes
from ...errors import BackendError
from .driver import call, capture_stream, event_done


def fill(runner, bucket: int, watch):
    """Set the watched buffer's bytes to watch.fill, on the runner's stream before its launch."""
    buf = runner.plan(bucket).buffers[watch.buffer]
    if buf.pitch:
        raise BackendError(f"buffer '{buf.name}' has padded rows; it cannot be watched as the run goes")
    call("cuMemsetD8Async", runner.ptr(bucket, watch.buffer), watch.fill, buf.nbytes, runner.stream)


def follow(runner, bucket: int, watch):
    """Hand copies of the watched buffer to watch.on_value until the runner's launched work is done
    (this thread polls: every watch.interval_s)."""
    from cuda.bindings import driver
    buf = runner.plan(bucket).buffers[watch.buffer]
    src = runner.ptr(bucket, watch.buffer)
    side = capture_stream()
    host = call("cuMemAllocHost", max(buf.nbytes, 1))   # pinned: the copy runs while the graph does
    done = call("cuEventCreate", int(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING))
    view = np.ctypeslib.as_array((ctypes.c_ubyte * buf.nbytes).from_address(int(host)))
    try:
        call("cuEventRecord", done, runner.stream)
        while True:
            finished = event_done(done)
            call("cuMemcpyDtoHAsync", host, src, buf.nbytes, side)
            call("cuStreamSynchronize", side)
            watch.on_value(view.view(dtypes.np_dtype(buf.dtype)).reshape(buf.shape).copy())
            if finished:
                return
            time.sleep(watch.interval_s)
    finally:
        call("cuEventDestroy", done)
        call("cuMemFreeHost", host)
        call("cuStreamDestroy", side)
