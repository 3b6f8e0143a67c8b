"""A --dynamic range's largest size must compile: where it reads a table past its end (a position
embedding shorter than the range) or meets a shape the model fixes, the error names the largest size
that fits, found by bisection (specializing only, no compile)."""
from __future__ import annotations

from ..errors import ShapeError
from ..ir.graph import Graph
from ..passes.specialize import specialize

# The range check folds what the compile keeps computed (positions): an index past a table's end
# is then found at compile time, where the compile's own kernels would read past it at run time.
RANGE_CHECK_FOLD_BYTES = 1 << 20


def check_range_fits(graph: Graph, fixed: dict, bucket_shapes: list, bucket_dims: list, dynamic: dict):
    """The largest size of a --dynamic range specializes (reads no table past its end, meets no
    shape a model fixed: BERT's token-type buffer of 64 positions), or the message names the largest
    size that does (found by bisection over the sizes, specializing only)."""
    def fits(i: int) -> bool:
        try:
            specialize(graph, bucket_shapes[i], None, fixed, RANGE_CHECK_FOLD_BYTES)
            return True
        except ShapeError:
            return False
    try:
        specialize(graph, bucket_shapes[-1], None, fixed, RANGE_CHECK_FOLD_BYTES)
        return
    except ShapeError as e:
        first = e
    spans = ", ".join(f"{n}={lo}:{hi}" for n, (lo, hi) in dynamic.items())
    if len(dynamic) != 1 or not fits(0):
        raise type(first)(f"--dynamic {spans}: {first}") from None
    good, bad = 0, len(bucket_shapes) - 1    # sizes ascend: bisect for the last one that fits
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    (name, (lo, hi)), = dynamic.items()
    largest = bucket_dims[good][name]
    raise type(first)(f"--dynamic {spans}: at {name}={hi}, {first}. The largest {name} that "
                      f"fits is {largest}: use --dynamic {name}={lo}:{largest}") from None
