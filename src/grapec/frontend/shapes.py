"""Concrete input shapes for one bucket, from trtexec-style `--shapes` and named `--dim` values."""
from __future__ import annotations

import math

from ..errors import GrapecError, ShapeError
from ..ir.graph import Graph


def parse_shapes(text: str | None) -> dict:
    """'input_ids=1x128,pixels=1x3x224x224' -> {'input_ids': (1, 128), ...}; 'x=' or 'x=scalar' is rank 0.
    trtexec's 'input_ids:1x128' is read too (the last ':' splits, so tf2onnx's 'x:0:1x8' names 'x:0')."""
    out: dict = {}
    if not text:
        return out
    for item in _split_items(text):
        name, sep, dims = item.rpartition("=")
        if not sep:
            name, sep, dims = item.rpartition(":")
        if not sep or not name:
            raise GrapecError(f"--shapes: expected NAME=DxDx... (or trtexec's NAME:DxDx...), got '{item}'")
        dims = dims.strip()
        try:
            out[name.strip()] = () if dims in ("", "scalar") else tuple(int(d) for d in dims.lower().split("x"))
        except ValueError:
            raise GrapecError(f"--shapes: '{item}': dims must be integers separated by 'x' (e.g. {name}=1x3x224x224)") from None
        if any(d < 0 for d in out[name.strip()]):
            raise GrapecError(f"--shapes: '{item}': dims must be >= 0")
    return out


def parse_dims(text: str | None, flag: str = "--dim") -> dict:
    """'batch=1,seq=128' -> {'batch': 1, 'seq': 128}."""
    out: dict = {}
    if not text:
        return out
    for item in _split_items(text):
        name, sep, val = item.partition("=")
        try:
            out[name.strip()] = int(val)
            if not sep or not name.strip() or out[name.strip()] < 0:
                raise ValueError
        except ValueError:
            raise GrapecError(f"{flag}: expected NAME=N with N >= 0, got '{item}'") from None
    return out


MAX_RANGE_SIZES = 1 << 18   # Wav2Vec2 samples 1600:160000 (158401); a sampled range stores most sizes as formulas (bundle/families.py)


def parse_ranges(text, flag: str = "--dynamic") -> dict:
    """'seq=1:512,batch=1:4' -> {'seq': (1, 512), 'batch': (1, 4)}: every value from LO to HI, both included."""
    out: dict = {}
    for item in _split_items(text or ()):
        name, sep, val = item.partition("=")
        lo, colon, hi = val.partition(":")
        try:
            lo, hi = int(lo), int(hi)
            if not sep or not colon or not name.strip() or lo < 1 or hi < lo:
                raise ValueError
        except ValueError:
            raise GrapecError(f"{flag}: expected NAME=LO:HI with 1 <= LO <= HI (e.g. seq=1:512), got '{item}'") from None
        out[name.strip()] = (lo, hi)
    return out


def range_buckets(ranges: dict) -> list:
    """Every combination of the ranges' values, as dims dicts (the last dim varies fastest)."""
    count = 1
    for lo, hi in ranges.values():
        count *= hi - lo + 1
    if count > MAX_RANGE_SIZES:
        spans = ", ".join(f"{n}={lo}:{hi}" for n, (lo, hi) in ranges.items())
        raise GrapecError(f"--dynamic {spans} spans {count} shapes; at most {MAX_RANGE_SIZES} fit in one bundle "
                          "(narrow the range, or compile one bundle per part of it)")
    combos = [{}]
    for name, (lo, hi) in ranges.items():
        combos = [dict(c, **{name: v}) for c in combos for v in range(lo, hi + 1)]
    return combos


def _split_items(text):
    if isinstance(text, (list, tuple)):
        items = [i for t in text for i in str(t).split(",")]
    else:
        items = str(text).split(",")
    return [i.strip() for i in items if i.strip()]


def resolve_input_shapes(graph: Graph, shapes: dict, dims: dict) -> dict:
    """Concrete shape of every graph input; one error lists every dim still unknown."""
    unknown_names = sorted(set(shapes) - set(graph.inputs))
    if unknown_names:
        raise ShapeError(f"--shapes names {', '.join(repr(n) for n in unknown_names)}, but the model's inputs are "
                         f"{', '.join(repr(n) for n in graph.inputs)}")
    resolved, missing, used = {}, [], set()
    for name in graph.inputs:
        v = graph.values[name]
        if name in shapes:
            given = shapes[name]
            if v.shape is not None:
                if len(given) != len(v.shape):
                    raise ShapeError(f"input '{name}': --shapes gives rank {len(given)} {list(given)}, the model "
                                     f"declares rank {len(v.shape)} {list(v.shape)}")
                for i, (g, d) in enumerate(zip(given, v.shape)):
                    if isinstance(d, int) and d > 0 and g != d:
                        raise ShapeError(f"input '{name}' dim {i}: --shapes gives {g}, the model fixes it to {d}")
            resolved[name] = tuple(given)
            continue
        if v.shape is None:
            missing.append(f"input '{name}': no shape in the model (give --shapes {name}=...)")
            continue
        dims_out = []
        for i, d in enumerate(v.shape):
            if isinstance(d, int) and d > 0:
                dims_out.append(d)
            elif isinstance(d, str) and d in dims:
                dims_out.append(dims[d])
                used.add(d)
            else:
                label = f"'{d}'" if isinstance(d, str) and d != "?" else "unnamed"
                hint = f"--dim {d}=N or " if isinstance(d, str) and d != "?" else ""
                missing.append(f"input '{name}' dim {i} ({label}): give {hint}--shapes {name}=...")
                dims_out.append(None)
        resolved[name] = tuple(dims_out)
    if missing:
        raise ShapeError("dynamic dims without a value:\n  - " + "\n  - ".join(missing))
    unused = sorted(set(dims) - used - _all_dim_params(graph))
    if unused:
        raise ShapeError(f"--dim (or --dynamic) names {', '.join(repr(u) for u in unused)}, which no input of the model uses "
                         f"(its dynamic dims: {', '.join(sorted(_all_dim_params(graph))) or 'none'})")
    return resolved


def _all_dim_params(graph):
    return {d for n in graph.inputs for d in (graph.values[n].shape or ()) if isinstance(d, str)}


def parse_values(items) -> dict:
    """['axes=0,1', 'shape=x.npy', 'n=5'] -> {'axes': [0, 1], 'shape': array from x.npy, 'n': [5]}."""
    import numpy as np
    out: dict = {}
    for item in items or ():
        name, sep, text = str(item).partition("=")
        name, text = name.strip(), text.strip()
        if not sep or not name or not text:
            raise GrapecError(f"--value: expected NAME=V1,V2,... or NAME=file.npy, got '{item}'")
        if text.endswith(".npy"):
            try:
                out[name] = np.load(text, allow_pickle=False)
            except (OSError, ValueError) as e:
                raise GrapecError(f"--value {name}: cannot read {text}: {e}") from None
            continue
        try:
            out[name] = [float(x) if any(c in x for c in ".eEn") else int(x) for x in text.split(",")]
        except ValueError:
            raise GrapecError(f"--value {name}: '{text}' is not a comma-separated list of numbers") from None
    return out


def parse_bounds(items) -> dict:
    """['n_boxes=512', 'steps=64'] -> {'n_boxes': 512, 'steps': 64} (--bound; a name may hold '=')."""
    out: dict = {}
    for item in items or ():
        name, sep, text = str(item).rpartition("=")
        name, text = name.strip(), text.strip()
        if not sep or not name or not text.isdigit():
            raise GrapecError(f"--bound: expected NAME=N with N a whole number >= 0, got '{item}'")
        out[name] = int(text)
    return out


def resolve_input_values(graph: Graph, values: dict) -> dict:
    """Graph inputs fixed at compile time -> numpy arrays of the input's dtype and declared rank."""
    import numpy as np

    from .. import dtypes
    out = {}
    for name, given in (values or {}).items():
        if name not in graph.inputs:
            raise ShapeError(f"--value names '{name}', but the model's inputs are "
                             f"{', '.join(repr(n) for n in graph.inputs)}")
        v = graph.values[name]
        arr = np.asarray(given)
        if v.shape is not None and arr.ndim != len(v.shape):
            if arr.size == 1 and len(v.shape) == 0:
                arr = arr.reshape(())
            elif arr.ndim != 1 or any(not isinstance(d, int) for d in v.shape) or arr.size != math.prod(v.shape):
                raise ShapeError(f"input '{name}': --value gives shape {list(arr.shape)}, the model declares "
                                 f"{list(v.shape)}")
            else:
                arr = arr.reshape(v.shape)
        if v.shape is not None:
            for i, (g, d) in enumerate(zip(arr.shape, v.shape)):
                if isinstance(d, int) and d > 0 and g != d:
                    raise ShapeError(f"input '{name}' dim {i}: --value has {g}, the model fixes it to {d}")
        want = dtypes.np_dtype(v.dtype)
        cast = arr.astype(want)
        if arr.dtype.kind in "fiub" and not np.array_equal(cast.astype(arr.dtype), arr):
            raise ShapeError(f"input '{name}': --value {arr.reshape(-1).tolist()} does not fit its type {v.dtype}")
        out[name] = np.array(cast, order="C")
    return out

