"""What a bundle's manifest must hold, checked at load before anything reads it: each field the
runtime and `grapec inspect` use, with its type, and sizes that fit in 64 bits. A hand-edited
manifest (its hash recomputed) then fails here with the field named, not later inside the runtime.

    check_manifest(m)     raises ValueError("<field path>: <what is wrong>")
    json_depth(text)      the deepest nesting of [ and { in a JSON text (strings skipped)
"""
from __future__ import annotations

import math
import re

import numpy as np

from .. import dtypes

MAX_JSON_DEPTH = 64   # grapec writes at most ~10 (an If inside a Loop adds 3); Python's parser recurses
MAX_BYTES = 1 << 62   # a size or offset beyond this is no size of this world
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')


def json_depth(text: bytes) -> int:
    a = np.frombuffer(_STRING.sub(b'""', text), np.uint8)
    step = np.zeros(a.size, np.int8)
    step[(a == ord("[")) | (a == ord("{"))] = 1
    step[(a == ord("]")) | (a == ord("}"))] = -1
    return int(np.cumsum(step, dtype=np.int64).max(initial=0))


def _fail(path: str, what: str):
    raise ValueError(f"{path}: {what}")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _count(x, path: str, upto: int = MAX_BYTES) -> int:
    """A non-negative integer (a size, a dim, an offset)."""
    if not _is_int(x) or not 0 <= x <= upto:
        _fail(path, f"expected an integer in [0, {upto}], got {x!r}")
    return x


def _of(x, kind: type, path: str):
    if not isinstance(x, kind):
        _fail(path, f"expected {kind.__name__}, got {type(x).__name__}")
    return x


def _shape(x, path: str) -> list:
    dims = [_count(d, f"{path}[{i}]") for i, d in enumerate(_of(x, list, path))]
    if math.prod(dims) > MAX_BYTES:
        _fail(path, f"{dims} has more than 2**62 elements")
    return dims


def _dtype(x, path: str) -> str:
    if x not in dtypes.SUPPORTED:
        _fail(path, f"unknown dtype {x!r}")
    return x


def _io(entries, path: str, buckets: int, with_shapes: bool):
    names = set()
    for i, e in enumerate(_of(entries, list, path)):
        p = f"{path}[{i}]"
        _of(e, dict, p)
        name = _of(e.get("name"), str, f"{p}.name")
        if name in names:
            _fail(f"{p}.name", f"'{name}' appears twice")
        names.add(name)
        _dtype(e.get("dtype"), f"{p}.dtype")
        for j, d in enumerate(_of(e.get("dims"), list, f"{p}.dims")):
            if not (d is None or isinstance(d, str)):
                _count(d, f"{p}.dims[{j}]")
        if with_shapes:
            shapes = _of(e.get("shapes"), list, f"{p}.shapes")
            if len(shapes) != buckets:
                _fail(f"{p}.shapes", f"{len(shapes)} shapes for {buckets} buckets")
            for j, s in enumerate(shapes):
                _shape(s, f"{p}.shapes[{j}]")
    return names


def check_manifest(m: dict):
    for i, sec in enumerate(_of(m.get("sections"), list, "sections")):
        p = f"sections[{i}]"
        _of(sec, dict, p)
        for k in ("name", "sha256", "compression"):
            _of(sec.get(k), str, f"{p}.{k}")
        _count(sec.get("offset"), f"{p}.offset")
        _count(sec.get("size"), f"{p}.size")
    buckets = _of(m.get("buckets"), list, "buckets")
    if not buckets:
        _fail("buckets", "no bucket")
    inputs = _io(m.get("inputs"), "inputs", len(buckets), with_shapes=True)
    _io(m.get("outputs"), "outputs", len(buckets), with_shapes=False)
    for i, b in enumerate(buckets):
        p = f"buckets[{i}]"
        _of(b, dict, p)
        _count(b.get("arena_bytes"), f"{p}.arena_bytes")
        shapes = _of(b.get("shapes"), dict, f"{p}.shapes")
        if set(shapes) != inputs:
            _fail(f"{p}.shapes", f"names {sorted(shapes)}, the inputs are {sorted(inputs)}")
        for name, s in shapes.items():
            _shape(s, f"{p}.shapes.{name}")
        for k, v in _of(b.get("steps", {}), dict, f"{p}.steps").items():
            _count(v, f"{p}.steps.{k}")
    for i, f in enumerate(_of(m.get("fixed_inputs", []), list, "fixed_inputs")):
        p = f"fixed_inputs[{i}]"
        _of(f, dict, p)
        _of(f.get("name"), str, f"{p}.name")
        dt = _dtype(f.get("dtype"), f"{p}.dtype")
        shape = _shape(f.get("shape"), f"{p}.shape")
        try:
            value = np.array(f.get("value"), dtypes.np_dtype(dt))
        except (TypeError, ValueError, OverflowError) as e:
            _fail(f"{p}.value", f"not {dt} values ({e})")
        if value.size != math.prod(shape):
            _fail(f"{p}.value", f"{value.size} values for shape {shape}")
    dynamic = m.get("dynamic")
    if dynamic is not None:
        for name, r in _of(dynamic, dict, "dynamic").items():
            if not (isinstance(r, list) and len(r) == 2 and all(_is_int(x) for x in r) and 0 <= r[0] <= r[1]):
                _fail(f"dynamic.{name}", f"expected [lo, hi] with 0 <= lo <= hi, got {r!r}")
    for k in ("precision", "model", "fusion", "device_profile", "grapec_version"):
        if m.get(k) is not None:
            _of(m[k], str, k)
    for i, t in enumerate(_of(m.get("targets", []), list, "targets")):
        _of(t, str, f"targets[{i}]")
    for i, n in enumerate(_of(m.get("notes", []), list, "notes")):
        _of(n, str, f"notes[{i}]")
    for k, v in _of(m.get("onnx_ops") or {}, dict, "onnx_ops").items():
        _count(v, f"onnx_ops.{k}")
    for k in ("weights_bytes", "kernels"):
        if m.get(k) is not None:
            _count(m[k], k)
    for k in ("cuda", "mixed_precision", "metadata"):
        if m.get(k) is not None:
            _of(m[k], dict, k)
