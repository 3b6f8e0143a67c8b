"""Inputs for `run` and `check`: random ones that make sense for the model, or .npy files."""
from __future__ import annotations

import os

import numpy as np
import onnx

from . import dtypes
from .errors import InputError


def index_bounds(model: onnx.ModelProto) -> dict:
    """Integer graph inputs used as Gather indices into a weight: name -> exclusive upper bound
    (a token id must be smaller than the vocabulary)."""
    inits = {t.name: tuple(t.dims) for t in model.graph.initializer}
    bounds: dict = {}
    alias = {}
    for n in model.graph.node:
        if n.op_type in ("Cast", "Identity", "Reshape", "Unsqueeze", "Squeeze", "Flatten") and n.input:
            alias[n.output[0]] = alias.get(n.input[0], n.input[0])
        if n.op_type == "Gather" and len(n.input) > 1 and n.input[0] in inits:
            axis = next((a.i for a in n.attribute if a.name == "axis"), 0)
            src = alias.get(n.input[1], n.input[1])
            dims = inits[n.input[0]]
            if dims:
                bound = dims[axis]
                bounds[src] = min(bounds.get(src, bound), bound)
    return bounds


def bundle_inputs(manifest: dict, bucket: int = 0, seed: int = 0) -> dict:
    """random_inputs for one bucket of a bundle, from its manifest (shapes, dtypes, index bounds)."""
    infos = manifest["inputs"]
    return random_inputs({i["name"]: tuple(i["shapes"][bucket]) for i in infos}, {i["name"]: i["dtype"] for i in infos},
                         {i["name"]: i["index_bound"] for i in infos if i.get("index_bound")}, seed)


def random_inputs(shapes: dict, input_dtypes: dict, bounds: dict, seed: int = 0) -> dict:
    """Fresh random inputs: floats ~ N(0, 1); token ids in range of their embedding table;
    masks (names containing 'mask') all ones but the last position; other ints in [0, 8)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, shape in shapes.items():
        dt = input_dtypes[name]
        npdt = dtypes.np_dtype(dt)
        if dtypes.is_float(dt):
            feeds[name] = rng.standard_normal(shape).astype(npdt)
        elif dt == "bool":
            feeds[name] = rng.random(shape) < 0.5
        elif "mask" in name.lower():
            a = np.ones(shape, npdt)
            if a.ndim >= 1 and a.shape[-1] > 1:
                a[..., -1] = 0
            feeds[name] = a
        else:
            hi = bounds.get(name, 8)
            feeds[name] = rng.integers(0, max(hi, 1), size=shape).astype(npdt)
    return feeds


def load_npy_inputs(items: list) -> dict:
    """['name=path.npy', ...] -> {name: array}."""
    feeds = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep:
            raise InputError(f"--input: expected NAME=FILE.npy, got '{item}'")
        if not os.path.exists(path):
            raise InputError(f"--input {name}: {path}: no such file")
        try:
            feeds[name] = np.load(path, allow_pickle=False)
        except Exception as e:  # noqa: BLE001
            raise InputError(f"--input {name}: {path}: not a .npy array ({type(e).__name__}: {e})") from None
    return feeds


def summarize(name: str, a: np.ndarray) -> str:
    head = ", ".join(f"{x:.5g}" if a.dtype.kind == "f" else str(x) for x in a.reshape(-1)[:5])
    stats = ""
    if a.size and a.dtype.kind in "fiub":
        f = a.astype(np.float64)
        stats = f" min {f.min():.5g} max {f.max():.5g} mean {f.mean():.5g}"
        if a.dtype.kind == "f" and not np.isfinite(f).all():
            stats += f" ({int((~np.isfinite(f)).sum())} non-finite)"
    return f"{name}: {a.dtype}{list(a.shape)}{stats} [{head}{', ...' if a.size > 5 else ''}]"
