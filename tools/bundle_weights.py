"""Move a bundle between machines without its weights, and prove it arrived byte for byte.

Used to show that bundles compiled on the CPU-only machine run on the GPU machine unchanged when a
transport between them caps the size (the device tool carries at most 64 MiB; full GPT-2 in fp16 is
250 MB of weights):

    here:   python tools/bundle_weights.py strip gpt2.grape gpt2.noweights     (kilobytes to megabytes)
    there:  python tools/bundle_weights.py restore gpt2.noweights gpt2.grape --models models/full
       or:  python tools/bundle_weights.py restore gpt2.noweights gpt2.grape --donor donor.grape

`strip` keeps every byte of the bundle except its weights section and records the whole file's
sha256. `restore` takes the weights section from a donor bundle -- given, or compiled there without
GPU code from the same ONNX file with the shapes and precision the stripped manifest records --,
checks it against the sha256 that the stripped bundle's own manifest lists for it, splices it in and
checks the whole file's sha256: the result is the bundle compiled here, not a recompiled one. Only
the weights come from the donor, and they are what the manifest (written here) says they must be.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
import sys

sys.path.insert(0, __file__.rsplit("/tools/", 1)[0] + "/src")
from grapec.bundle.format import HEADER, MAGIC  # noqa: E402

STRIPPED = b"GRAPEC-STRIPPED\n"


def _manifest(data: bytes) -> tuple:
    """(manifest, its end offset) of a bundle's bytes."""
    if data[:8] != MAGIC:
        raise SystemExit("not a grapec bundle")
    (mlen,) = struct.unpack("<Q", data[8:16])
    return json.loads(data[HEADER:HEADER + mlen]), HEADER + mlen


def _weights_span(data: bytes) -> tuple:
    """(start, end, sha256) of the weights section in a bundle's bytes."""
    manifest, end = _manifest(data)
    s = next(s for s in manifest["sections"] if s["name"] == "weights")
    start = end + s["offset"]
    return start, start + s["size"], s["sha256"]


def _full_manifest(rest: bytes, weights_at: int, weights_bytes: int) -> dict:
    """The manifest of a stripped bundle's bytes, its tables section put back (bundle/tables.py)."""
    import zlib
    from grapec.bundle.tables import join_tables
    manifest, end = _manifest(rest)
    if not manifest.get("tables"):
        return manifest
    s = next(s for s in manifest["sections"] if s["name"] == "tables")
    start = end + s["offset"] - (weights_bytes if end + s["offset"] >= weights_at else 0)
    return join_tables(manifest, json.loads(zlib.decompress(rest[start:start + s["size"]])))


def _compile_donor(manifest: dict, models: str) -> bytes:
    """The bundle's model, shapes and precision, compiled without GPU code (only its weights are used):
    a --dynamic range as the same range (its sampled sizes' per-size constants are among the weights)."""
    import grapec
    path = os.path.join(models, manifest["model"])
    if manifest.get("dynamic"):
        dynamic = {n: tuple(r) for n, r in manifest["dynamic"].items()}
        dims = {d: i["shapes"][0][a] for i in manifest["inputs"] for a, d in enumerate(i["dims"] or [])
                if isinstance(d, str) and d not in dynamic}
        print(f"compiling the donor {path} ({manifest['precision']}, --dynamic {dynamic})", flush=True)
        return grapec.compile(path, dims=dims, dynamic=dynamic, precision=manifest["precision"], targets=[]).to_bytes()
    buckets = [{i["name"]: i["shapes"][b] for i in manifest["inputs"]} for b in range(len(manifest["buckets"]))]
    print(f"compiling the donor {path} ({manifest['precision']}, {len(buckets)} bucket(s))", flush=True)
    return grapec.compile(path, buckets=buckets, precision=manifest["precision"], targets=[]).to_bytes()


def strip(src: str, dst: str):
    data = open(src, "rb").read()
    start, end, _ = _weights_span(data)
    head = json.dumps({"sha256": hashlib.sha256(data).hexdigest(), "weights_at": start,
                       "weights_bytes": end - start}).encode()
    with open(dst, "wb") as f:
        f.write(STRIPPED + struct.pack("<Q", len(head)) + head + data[:start] + data[end:])
    print(f"{dst}: {len(data) - (end - start)} of {len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()[:16]}")


def restore(stripped: str, dst: str, donor: str | None = None, models: str | None = None):
    raw = open(stripped, "rb").read()
    if not raw.startswith(STRIPPED):
        raise SystemExit(f"{stripped}: not a stripped bundle")
    n = len(STRIPPED)
    (hlen,) = struct.unpack("<Q", raw[n:n + 8])
    head = json.loads(raw[n + 8:n + 8 + hlen])
    rest = raw[n + 8 + hlen:]
    at = head["weights_at"]
    _, _, want_weights = _weights_span(rest[:at])   # the manifest written on the compiling machine
    d = open(donor, "rb").read() if donor else _compile_donor(_full_manifest(rest, at, head["weights_bytes"]), models)
    donor = donor or "the donor compiled here"
    ds, de, _ = _weights_span(d)
    weights = d[ds:de]
    if hashlib.sha256(weights).hexdigest() != want_weights:
        raise SystemExit(f"{donor}: its weights are not the ones {stripped} was compiled with")
    data = rest[:at] + weights + rest[at:]
    got = hashlib.sha256(data).hexdigest()
    if got != head["sha256"]:
        raise SystemExit(f"restored bundle sha256 {got} != original {head['sha256']}")
    with open(dst, "wb") as f:
        f.write(data)
    print(f"{dst}: byte-identical to the bundle compiled on the other machine (sha256 {got[:16]})")


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("strip")
    p.add_argument("bundle")
    p.add_argument("stripped")
    p = sub.add_parser("restore")
    p.add_argument("stripped")
    p.add_argument("bundle")
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--donor", help="a bundle of the same model, shapes and precision")
    how.add_argument("--models", help="folder holding the ONNX model, to compile the donor from")
    a = ap.parse_args()
    if a.cmd == "strip":
        strip(a.bundle, a.stripped)
    else:
        restore(a.stripped, a.bundle, a.donor, a.models)
