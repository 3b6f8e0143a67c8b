"""Inputs for `run` and `check`: random ones that make sense for the model, or .npy files."""
from __future__ import annotations

import os
import re

import numpy as np
import onnx

from .. import dtypes
from ..errors import InputError
from .value_range import ValueRange, manifest_ranges


RANGE_KEY = "grapec.input_range."   # model metadata: grapec.input_range.<input> = "lo:hi" (inclusive)
_ALIASING_OPS = ("Cast", "Identity", "Reshape", "Unsqueeze", "Squeeze", "Flatten")


def value_ranges(model: onnx.ModelProto, bounds: list = ()) -> dict:
    """Integer graph inputs whose values the model constrains: name -> ValueRange.

    - the model's own word: metadata ``grapec.input_range.<name> = "lo:hi"`` (either side may be empty);
    - a Gather index into a weight (a token id must be smaller than the vocabulary);
    - a Loop's trip count (it must not be negative);
    - the user's --bound of an input (`bounds`: the manifest's records, passes/bounds.py), 0 to it.
    Where several apply, their intersection."""
    g = model.graph
    int_inputs = {v.name for v in g.input if v.type.tensor_type.elem_type in _INT_TYPES}
    found: dict = {}
    for name, rng in _declared_ranges(model, {v.name for v in g.input}).items():
        _narrow(found, name, rng)
    inits = {t.name: tuple(t.dims) for t in g.initializer}
    alias = {}
    for n in g.node:
        if n.op_type in _ALIASING_OPS and n.input:
            alias[n.output[0]] = alias.get(n.input[0], n.input[0])
        if n.op_type == "Gather" and len(n.input) > 1 and inits.get(n.input[0]):
            axis = next((a.i for a in n.attribute if a.name == "axis"), 0)
            rows = inits[n.input[0]][axis]
            _narrow(found, alias.get(n.input[1], n.input[1]),   # ONNX counts negative indices from the end
                    ValueRange(-rows, rows - 1, f"index into '{n.input[0]}' with {rows} rows"))
        if n.op_type == "Loop" and n.input and n.input[0]:
            _narrow(found, alias.get(n.input[0], n.input[0]),
                    ValueRange(0, None, f"trip count of Loop '{n.name or n.output[0]}'"))
    for b in bounds:
        _narrow(found, b["value"], ValueRange(0, b["bound"], f"--bound {b['value']}={b['bound']}, which sizes "
                                              f"{', '.join(b['read_by'][:4])}; compile with a larger bound to raise it"))
    return {k: v for k, v in found.items() if k in int_inputs}


_INT_TYPES = {onnx.TensorProto.INT8, onnx.TensorProto.INT16, onnx.TensorProto.INT32, onnx.TensorProto.INT64,
              onnx.TensorProto.UINT8, onnx.TensorProto.UINT16, onnx.TensorProto.UINT32, onnx.TensorProto.UINT64}


def _declared_ranges(model: onnx.ModelProto, inputs: set) -> dict:
    out = {}
    for p in model.metadata_props:
        if not p.key.startswith(RANGE_KEY):
            continue
        name = p.key[len(RANGE_KEY):]
        if name not in inputs:
            raise InputError(f"model metadata '{p.key}' names no graph input (inputs: {', '.join(sorted(inputs))})")
        lo, sep, hi = p.value.partition(":")
        dim = _DIM_BOUND.fullmatch(hi.strip())
        try:
            lo_v, hi_v = (int(lo) if lo.strip() else None), (int(hi) if hi.strip() and not dim else None)
        except ValueError:
            lo_v = hi_v = None
            sep = ""
        if dim and dim.group(1) not in inputs:
            sep = ""
        if not sep or (lo_v is not None and hi_v is not None and lo_v > hi_v):
            raise InputError(f"model metadata '{p.key}' = '{p.value}': expected 'lo:hi' with integers lo <= hi, hi "
                             "possibly an input's dim as NAME[axis]")
        out[name] = ValueRange(lo_v, hi_v, f"model metadata {p.key}",
                               (dim.group(1), int(dim.group(2))) if dim else None)
    return out


_DIM_BOUND = re.compile(r"(.+)\[(\d+)\]")   # "prompt_ids[1]": at most that input's size along axis 1


def _narrow(found: dict, name: str, r: ValueRange):
    old = found.get(name)
    if old is None:
        found[name] = r
        return
    lo = r.lo if old.lo is None else old.lo if r.lo is None else max(old.lo, r.lo)
    hi = r.hi if old.hi is None else old.hi if r.hi is None else min(old.hi, r.hi)
    found[name] = ValueRange(lo, hi, f"{old.source}; {r.source}", old.hi_dim or r.hi_dim)


def bundle_inputs(manifest: dict, bucket: int = 0, seed: int = 0) -> dict:
    """random_inputs for one bucket of a bundle, from its manifest (shapes, dtypes, value ranges)."""
    infos = manifest["inputs"]
    return random_inputs({i["name"]: tuple(i["shapes"][bucket]) for i in infos}, {i["name"]: i["dtype"] for i in infos},
                         manifest_ranges(manifest), seed)


def random_inputs(shapes: dict, input_dtypes: dict, ranges: dict, seed: int = 0, run_shapes: dict | None = None) -> dict:
    """Fresh random inputs: floats ~ N(0, 1); integers within their ValueRange (token ids within the
    vocabulary), else in [0, 8); masks (names containing 'mask') all ones but the last position.
    run_shapes: every input's shape in the run, where `shapes` (what to make) leaves some out (a range
    bounded by another input's dim reads it there)."""
    rng = np.random.default_rng(seed)
    run_shapes = shapes if run_shapes is None else run_shapes
    feeds = {}
    for name, shape in shapes.items():
        dt = input_dtypes[name]
        npdt = dtypes.np_dtype(dt)
        r = ranges.get(name)
        r = None if r is None else r.bounded(run_shapes)
        if dtypes.is_float(dt):
            feeds[name] = rng.standard_normal(shape).astype(npdt)
        elif dt == "bool":
            feeds[name] = rng.random(shape) < 0.5
        elif "mask" in name.lower() and r is None:
            a = np.ones(shape, npdt)
            if a.ndim >= 1 and a.shape[-1] > 1:
                a[..., -1] = 0
            feeds[name] = a
        else:
            # non-negative where the range allows: an index or a count, as a user would feed it
            lo = 0 if r is None or r.lo is None or (r.lo < 0 and (r.hi is None or r.hi >= 0)) else r.lo
            hi = lo + 7 if r is None or r.hi is None else r.hi
            feeds[name] = rng.integers(lo, hi + 1, size=shape).astype(npdt)
    return feeds


def load_npy_inputs(items: list, input_dtypes: dict | None = None) -> dict:
    """['name=path.npy' or 'name=NUMBER', ...] -> {name: array}. A number is a scalar input's value,
    in the input's dtype where input_dtypes names it."""
    feeds = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep:
            raise InputError(f"--input: expected NAME=FILE.npy or NAME=NUMBER, got '{item}'")
        number = _number(path) if not os.path.exists(path) else None
        if number is not None:
            dt = (input_dtypes or {}).get(name)
            feeds[name] = np.array(number, dtypes.np_dtype(dt) if dt else None)
            continue
        if not os.path.exists(path):
            raise InputError(f"--input {name}: {path}: no such file")
        try:
            feeds[name] = np.load(path, allow_pickle=False)
        except Exception as e:  # noqa: BLE001
            raise InputError(f"--input {name}: {path}: not a .npy array ({type(e).__name__}: {e})") from None
    return feeds


def load_calibration_inputs(paths) -> list:
    """--calibration-inputs: .npz files, each one sample {input name: array}."""
    samples = []
    for path in paths:
        if not os.path.exists(path):
            raise InputError(f"--calibration-inputs {path}: no such file")
        try:
            with np.load(path, allow_pickle=False) as z:
                samples.append({k: z[k] for k in z.files})
        except Exception as e:  # noqa: BLE001
            raise InputError(f"--calibration-inputs {path}: not an .npz of arrays ({type(e).__name__}: {e})") from None
    return samples


def _number(text: str):
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            pass
    return None


def summarize(name: str, a: np.ndarray) -> str:
    head = ", ".join(f"{x:.5g}" if a.dtype.kind == "f" else str(x) for x in a.reshape(-1)[:5])
    stats = ""
    if a.size and a.dtype.kind in "fiub":
        f = a.astype(np.float64)
        stats = f" min {f.min():.5g} max {f.max():.5g} mean {f.mean():.5g}"
        if a.dtype.kind == "f" and not np.isfinite(f).all():
            stats += f" ({int((~np.isfinite(f)).sum())} non-finite)"
    return f"{name}: {a.dtype}{list(a.shape)}{stats} [{head}{', ...' if a.size > 5 else ''}]"
