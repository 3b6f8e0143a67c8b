"""Concrete input shapes for one bucket, from trtexec-style `--shapes` and named `--dim` values."""
from __future__ import annotations

from ..errors import GrapecError, ShapeError
from ..ir.graph import Graph


def parse_shapes(text: str | None) -> dict:
    """'input_ids=1x128,pixels=1x3x224x224' -> {'input_ids': (1, 128), ...}; 'x=' or 'x=scalar' is rank 0."""
    out: dict = {}
    if not text:
        return out
    for item in _split_items(text):
        name, sep, dims = item.rpartition("=")
        if not sep or not name:
            raise GrapecError(f"--shapes: expected NAME=DxDx..., got '{item}'")
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
        raise ShapeError(f"--dim names {', '.join(repr(u) for u in unused)}, which no input of the model uses "
                         f"(its dynamic dims: {', '.join(sorted(_all_dim_params(graph))) or 'none'})")
    return resolved


def _all_dim_params(graph):
    return {d for n in graph.inputs for d in (graph.values[n].shape or ()) if isinstance(d, str)}
