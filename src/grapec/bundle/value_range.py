"""ValueRange: the values an integer model input may take. The compiler finds them (inputs.value_ranges),
the manifest stores them, and a Session checks each run's inputs against them before anything runs."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InputError


@dataclass
class ValueRange:
    """The values an integer graph input may take, and why: lo..hi inclusive, None = unbounded; hi_dim
    (input, axis): at most that input's size along axis in the same run (a generation's prompt
    lengths, at most the width of its prompt_ids), whatever bucket runs."""
    lo: int | None
    hi: int | None
    source: str
    hi_dim: tuple | None = None

    def to_json(self) -> dict:
        d = {"lo": self.lo, "hi": self.hi, "source": self.source}
        if self.hi_dim is not None:
            d["hi_dim"] = list(self.hi_dim)
        return d

    @staticmethod
    def from_json(d) -> "ValueRange | None":
        """None for None; ValueError for anything but {"lo": int|None, "hi": int|None, "source": str,
        optionally "hi_dim": [input name, axis]}."""
        if d is None:
            return None
        ok = isinstance(d, dict) and isinstance(d.get("source", ""), str) and all(
            d.get(k) is None or (isinstance(d.get(k), int) and not isinstance(d.get(k), bool)) for k in ("lo", "hi"))
        dim = d.get("hi_dim") if isinstance(d, dict) else None
        if dim is not None and not (isinstance(dim, list) and len(dim) == 2 and isinstance(dim[0], str)
                                    and isinstance(dim[1], int) and not isinstance(dim[1], bool) and dim[1] >= 0):
            ok = False
        if not ok:
            raise ValueError(f"malformed value_range {d!r}")
        return ValueRange(d.get("lo"), d.get("hi"), d.get("source", ""), None if dim is None else (dim[0], dim[1]))

    def bounded(self, shapes: dict) -> "ValueRange":
        """This range with hi_dim read from the run's input shapes (name -> shape)."""
        if self.hi_dim is None or self.hi_dim[0] not in shapes or self.hi_dim[1] >= len(shapes[self.hi_dim[0]]):
            return self
        name, axis = self.hi_dim
        size = int(shapes[name][axis])
        return ValueRange(self.lo, size if self.hi is None else min(self.hi, size),
                          f"{self.source}: at most the size of dim {axis} of '{name}', {size} in this run")

    def text(self) -> str:
        lo = "-inf" if self.lo is None else self.lo
        hi = "inf" if self.hi is None else self.hi
        if self.hi_dim is not None:
            hi = f"{self.hi_dim[0]}'s dim {self.hi_dim[1]}" if self.hi is None else f"min({hi}, {self.hi_dim[0]}'s dim {self.hi_dim[1]})"
        return f"{lo}..{hi} ({self.source})"


def manifest_ranges(manifest: dict) -> dict:
    """input name -> ValueRange, from a bundle manifest."""
    out = {}
    for i in manifest["inputs"]:
        r = ValueRange.from_json(i.get("value_range"))
        if r is not None:
            out[i["name"]] = r
    return out


def check_value_range(name: str, a: np.ndarray, r: ValueRange):
    """InputError naming the input, the offending value and the range's source."""
    if a.size == 0 or a.dtype.kind not in "iu":
        return
    lo, hi = int(a.min()), int(a.max())
    if r.lo is not None and lo < r.lo:
        bad = lo
    elif r.hi is not None and hi > r.hi:
        bad = hi
    else:
        return
    what = f"= {bad}" if a.size == 1 else f"holds {bad}"
    raise InputError(f"input '{name}' {what}, outside the valid range {r.text()}")
