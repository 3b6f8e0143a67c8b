"""ValueRange: the values an integer model input may take. The compiler finds them (inputs.value_ranges),
the manifest stores them, and a Session checks each run's inputs against them before anything runs."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InputError


@dataclass
class ValueRange:
    """The values an integer graph input may take, and why: lo..hi inclusive, None = unbounded."""
    lo: int | None
    hi: int | None
    source: str

    def to_json(self) -> dict:
        return {"lo": self.lo, "hi": self.hi, "source": self.source}

    @staticmethod
    def from_json(d) -> "ValueRange | None":
        """None for None; ValueError for anything but {"lo": int|None, "hi": int|None, "source": str}."""
        if d is None:
            return None
        ok = isinstance(d, dict) and isinstance(d.get("source", ""), str) and all(
            d.get(k) is None or (isinstance(d.get(k), int) and not isinstance(d.get(k), bool)) for k in ("lo", "hi"))
        if not ok:
            raise ValueError(f"malformed value_range {d!r}")
        return ValueRange(d.get("lo"), d.get("hi"), d.get("source", ""))

    def text(self) -> str:
        lo = "-inf" if self.lo is None else self.lo
        hi = "inf" if self.hi is None else self.hi
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
