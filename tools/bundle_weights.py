"""Move a bundle between machines without its weights, and prove it arrived byte for byte.

Used to show that bundles compiled on the CPU-only machine run on the GPU machine unchanged when a
transport between them caps the size (the device tool carries at most 64 MiB; full GPT-2 in fp16 is
250 MB of weights):

    here:   python tools/bundle_weights.py strip gpt2.grape gpt2.noweights     (kilobytes to megabytes)
    there:  grapec compile ... -o donor.grape --no-gpu                          (same model, same flags)
            python tools/bundle_weights.py restore gpt2.noweights donor.grape gpt2.grape

`strip` keeps every byte of the bundle except its weights section and records the whole file's
sha256. `restore` takes the weights section from the donor, checks it against the sha256 that the
stripped bundle's own manifest lists for it, splices it in and checks the whole file's sha256: the
result is the bundle compiled here, not a recompiled one. Only the weights come from the donor, and
they are what the manifest (written here) says they must be.
"""
from __future__ import annotations

import hashlib
import json
import struct
import sys

sys.path.insert(0, __file__.rsplit("/tools/", 1)[0] + "/src")
from grapec.bundle.format import HEADER, MAGIC  # noqa: E402

STRIPPED = b"GRAPEC-STRIPPED\n"


def _weights_span(data: bytes) -> tuple:
    """(start, end, sha256) of the weights section in a bundle's bytes."""
    if data[:8] != MAGIC:
        raise SystemExit("not a grapec bundle")
    (mlen,) = struct.unpack("<Q", data[8:16])
    manifest = json.loads(data[HEADER:HEADER + mlen])
    s = next(s for s in manifest["sections"] if s["name"] == "weights")
    start = HEADER + mlen + s["offset"]
    return start, start + s["size"], s["sha256"]


def strip(src: str, dst: str):
    data = open(src, "rb").read()
    start, end, _ = _weights_span(data)
    head = json.dumps({"sha256": hashlib.sha256(data).hexdigest(), "weights_at": start,
                       "weights_bytes": end - start}).encode()
    with open(dst, "wb") as f:
        f.write(STRIPPED + struct.pack("<Q", len(head)) + head + data[:start] + data[end:])
    print(f"{dst}: {len(data) - (end - start)} of {len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()[:16]}")


def restore(stripped: str, donor: str, dst: str):
    raw = open(stripped, "rb").read()
    if not raw.startswith(STRIPPED):
        raise SystemExit(f"{stripped}: not a stripped bundle")
    n = len(STRIPPED)
    (hlen,) = struct.unpack("<Q", raw[n:n + 8])
    head = json.loads(raw[n + 8:n + 8 + hlen])
    rest = raw[n + 8 + hlen:]
    at = head["weights_at"]
    _, _, want_weights = _weights_span(rest[:at])   # the manifest written on the compiling machine
    d = open(donor, "rb").read()
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
    cmd, *args = sys.argv[1:] or ["-h"]
    if cmd == "strip" and len(args) == 2:
        strip(*args)
    elif cmd == "restore" and len(args) == 3:
        restore(*args)
    else:
        raise SystemExit(__doc__)
