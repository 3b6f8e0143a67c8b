"""A buffer of the plan that a caller reads while a run goes on: how a generation streams its tokens
out of one launch (runtime/generation.py). Both runners take one in `run(..., watch=)`:
    - the CPU runner hands over a copy each time a top-level Loop has set its carried values and
      after each of its steps (runtime/walker.py's progress);
    - the CUDA runner copies the buffer on a stream of its own while the graph runs (the WHILE node's
      steps are not visible to the host one by one): a copy may hold several new steps or none, and
      the last copy is taken once the run is done.
Before the run the buffer's bytes are set to `fill`, so no copy can show what an earlier run left
there (the memory plan gives a watched output its own bytes from the first step: plan_memory's held).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass
class Watch:
    buffer: int                              # the plan's buffer index
    on_value: Callable[[np.ndarray], None]   # gets a copy of its elements, in the runner's thread
    fill: int = 0xFF                         # its every byte before the run (int64 -1: no token yet)
    interval_s: float = 200e-6               # CUDA: between copies while the graph runs
