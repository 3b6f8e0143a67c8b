"""The manifest's per-bucket and per-kernel rows, stored in a zlib section of their own ("tables") as
templates plus deltas (templates.py), not in the manifest's plain JSON: a range of 4096 sizes has
4096 bucket records and tens of thousands of kernel launch rows, 2.6 MB of manifest text for 2048
sizes of tiny GPT-2 before they moved. A read bundle's manifest has them back where they were.

    lean, tables = split_tables(manifest)    # written: lean manifest + the "tables" section's JSON
    manifest = join_tables(lean, tables)     # read: the manifest as it was
"""
from __future__ import annotations

from . import templates

CUDA_ROWS = ("kernels", "launch", "scalars")   # manifest["cuda"]: one entry per bundle kernel each


def split_tables(manifest: dict) -> tuple:
    m = dict(manifest)
    buckets = m.pop("buckets")
    shapes = [[i["shapes"] for i in m["inputs"]]]   # one document: a row of ints per bucket would not share a template
    m["inputs"] = [{k: v for k, v in i.items() if k != "shapes"} for i in m["inputs"]]
    tables = {"buckets": templates.encode(buckets), "input_shapes": templates.encode(shapes)}
    cuda = m.get("cuda")
    if cuda and all(k in cuda for k in CUDA_ROWS):
        rows = [[n, la, sc] for n, la, sc in zip(*(cuda[k] for k in CUDA_ROWS))]
        tables["cuda_rows"] = templates.encode(rows)
        m["cuda"] = {k: v for k, v in cuda.items() if k not in CUDA_ROWS}
    m["tables"] = True
    return m, tables


def join_tables(lean: dict, tables: dict) -> dict:
    """Raises KeyError/TypeError/ValueError/IndexError on malformed tables."""
    m = dict(lean)
    del m["tables"]
    m["buckets"] = templates.decode(tables["buckets"])
    (shapes,) = templates.decode(tables["input_shapes"])
    if len(shapes) != len(m["inputs"]):
        raise ValueError(f"{len(shapes)} inputs' shapes for {len(m['inputs'])} inputs")
    m["inputs"] = [dict(i, shapes=s) for i, s in zip(m["inputs"], shapes)]
    if "cuda_rows" in tables:
        rows = templates.decode(tables["cuda_rows"])
        m["cuda"] = dict(m["cuda"], **{k: [r[j] for r in rows] for j, k in enumerate(CUDA_ROWS)})
    return m
