"""The .grape bundle, format v1: one file, data only (no pickle, nothing executed on the host).

    b"GRAPEC\\0\\n"            8-byte magic
    u64 little-endian         length of the manifest
    32 bytes                  sha256 of the manifest
    manifest                  UTF-8 JSON: format_version, grapec_version, model, inputs/outputs
                              (dtype, dims with their symbolic names), buckets, targets, sections
    sections                  back to back; the manifest lists each one's offset (from the end of
                              the manifest), size, sha256 and compression:
        weights               raw little-endian bytes, every weight at a 256-byte aligned offset
        kernels               zlib(JSON list of kernel IR), shared by all buckets
        plan.N                zlib(JSON plan) for bucket N (see plan.py)
        cubin.<target>        (GPU code generation, later) machine code per target

Loading checks the magic, the format version, each section's bounds and hash, and then every
buffer, offset and size in every plan against its allocation, so a truncated, corrupted or foreign
file fails with a clear BundleError before anything runs. A bundle may carry GPU machine code:
load only bundles you trust.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import struct
import tempfile
import zlib
from dataclasses import dataclass, field

from .. import __version__, dtypes
from ..errors import BundleError

MAGIC = b"GRAPEC\0\n"
HEADER = 8 + 8 + 32
FORMAT_VERSION = 1


@dataclass
class Bundle:
    manifest: dict
    weights: bytes = b""
    kernels: list = field(default_factory=list)
    plans: list = field(default_factory=list)
    extra_sections: dict = field(default_factory=dict)   # name -> bytes (e.g. cubins)

    # --- writing ---------------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        sections = [("weights", self.weights, "none"),
                    ("kernels", zlib.compress(json.dumps(self.kernels, separators=(",", ":")).encode(), 6), "zlib")]
        for i, p in enumerate(self.plans):
            sections.append((f"plan.{i}", zlib.compress(json.dumps(p, separators=(",", ":")).encode(), 6), "zlib"))
        for name, data in self.extra_sections.items():
            sections.append((name, data, "none"))
        table, off = [], 0
        for name, data, comp in sections:
            table.append({"name": name, "offset": off, "size": len(data), "compression": comp,
                          "sha256": hashlib.sha256(data).hexdigest()})
            off += len(data)
        manifest = dict(self.manifest, format_version=FORMAT_VERSION, sections=table)
        mbytes = json.dumps(manifest, indent=1).encode()
        return (MAGIC + struct.pack("<Q", len(mbytes)) + hashlib.sha256(mbytes).digest() + mbytes
                + b"".join(d for _, d, _ in sections))

    def write(self, path: str):
        """Atomic: a reader sees the old file or the complete new one, never a partial write."""
        data = self.to_bytes()
        d = os.path.dirname(os.path.abspath(path)) or "."
        fd, tmp = tempfile.mkstemp(prefix=".grape-", suffix=".tmp", dir=d)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)   # mkstemp makes 0600; a bundle is an ordinary file
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    # --- reading ---------------------------------------------------------------------------------
    @staticmethod
    def read(path: str) -> "Bundle":
        if not os.path.exists(path):
            raise BundleError(f"{path}: no such file")
        with open(path, "rb") as f:
            data = f.read()
        return Bundle.from_bytes(data, path)

    @staticmethod
    def from_bytes(data: bytes, where: str = "bundle") -> "Bundle":
        if len(data) < HEADER or data[:8] != MAGIC:
            raise BundleError(f"{where}: not a grapec bundle (bad magic; an .onnx file goes to `grapec compile`)"
                              if not data.startswith(b"GRAPEC") else f"{where}: corrupted bundle header")
        (mlen,) = struct.unpack("<Q", data[8:16])
        if HEADER + mlen > len(data):
            raise BundleError(f"{where}: truncated bundle (manifest needs {mlen} bytes, file has {len(data) - HEADER})")
        mbytes = data[HEADER:HEADER + mlen]
        if hashlib.sha256(mbytes).digest() != data[16:HEADER]:
            raise BundleError(f"{where}: corrupted bundle (the manifest fails its sha256 check)")
        try:
            manifest = json.loads(mbytes.decode())
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise BundleError(f"{where}: corrupted manifest ({e})") from None
        if not isinstance(manifest, dict):
            raise BundleError(f"{where}: corrupted manifest")
        ver = manifest.get("format_version")
        if not isinstance(ver, int):
            raise BundleError(f"{where}: corrupted manifest (no format_version)")
        if ver > FORMAT_VERSION:
            raise BundleError(f"{where}: bundle format v{ver} was written by grapec {manifest.get('grapec_version', '?')}; "
                              f"this grapec ({__version__}) reads up to v{FORMAT_VERSION}: upgrade grapec or recompile")
        body = memoryview(data)[HEADER + mlen:]
        sections = {}
        try:
            for s in manifest["sections"]:
                lo, n = int(s["offset"]), int(s["size"])
                if lo < 0 or n < 0 or lo + n > len(body):
                    raise BundleError(f"{where}: truncated bundle (section '{s['name']}' ends at byte "
                                      f"{HEADER + mlen + lo + n}, file has {len(data)})")
                chunk = bytes(body[lo:lo + n])
                if hashlib.sha256(chunk).hexdigest() != s["sha256"]:
                    raise BundleError(f"{where}: corrupted bundle (section '{s['name']}' fails its sha256 check)")
                sections[s["name"]] = zlib.decompress(chunk) if s["compression"] == "zlib" else chunk
            if sum(int(s["size"]) for s in manifest["sections"]) != len(body):
                raise BundleError(f"{where}: corrupted bundle ({len(body)} bytes of sections, manifest lists "
                                  f"{sum(int(s['size']) for s in manifest['sections'])})")
            kernels = json.loads(sections["kernels"])
            plans = [json.loads(sections[f"plan.{i}"]) for i in range(len(manifest["buckets"]))]
        except BundleError:
            raise
        except (KeyError, TypeError, ValueError, zlib.error) as e:
            raise BundleError(f"{where}: corrupted bundle ({type(e).__name__}: {e})") from None
        extra = {k: v for k, v in sections.items() if k not in ("weights", "kernels") and not k.startswith("plan.")}
        b = Bundle(manifest, sections["weights"], kernels, plans, extra)
        b.validate(where)
        return b

    def validate(self, where: str = "bundle"):
        """Every offset and size in every plan against its allocation."""
        nk = len(self.kernels)
        for bi, plan in enumerate(self.plans):
            try:
                _validate_plan(plan, len(self.weights), self.kernels, nk)
            except BundleError as e:
                raise BundleError(f"{where}: bucket {bi}: {e}") from None
            except (KeyError, TypeError, ValueError, IndexError) as e:
                raise BundleError(f"{where}: bucket {bi}: malformed plan ({type(e).__name__}: {e})") from None


def _check_view(view, row, what):
    """A strided operand (passes/strided_operands.py) stays inside its buffer."""
    offset, batch_stride, ld, shape = view
    n = math.prod(row[5])
    if min(offset, batch_stride, ld, *shape) < 0 or len(shape) < 2 or ld < shape[-1]:
        raise BundleError(f"{what}: malformed view {view}")
    batches = math.prod(shape[:-2])
    last = offset + (batches - 1) * batch_stride + (shape[-2] - 1) * ld + shape[-1] - 1
    if math.prod(shape) and last >= n:
        raise BundleError(f"{what}: view {view} reaches element {last} of a buffer of {n}")


def _validate_plan(plan, weight_bytes, kernels, nk):
    arena = int(plan["arena_bytes"])
    bufs = plan["buffers"]
    for i, (name, space, off, nbytes, dt, shape) in enumerate(bufs):
        if dt not in dtypes.SUPPORTED:
            raise BundleError(f"buffer {i} '{name}': unknown dtype {dt!r}")
        if nbytes != math.prod(shape) * dtypes.itemsize(dt):
            raise BundleError(f"buffer {i} '{name}': {nbytes} bytes does not match {dt}{shape}")
        limit = arena if space == "arena" else weight_bytes if space == "weight" else None
        if limit is None:
            raise BundleError(f"buffer {i} '{name}': unknown space {space!r}")
        if off < 0 or off + nbytes > limit:
            raise BundleError(f"buffer {i} '{name}': bytes [{off}, {off + nbytes}) outside its {space} of {limit} bytes")

    def check_buf(b, what, allow_none=False):
        if allow_none and b == -1:
            return
        if not isinstance(b, int) or not 0 <= b < len(bufs):
            raise BundleError(f"{what}: buffer index {b} out of range")

    def check_steps(steps):
        for si, st in enumerate(steps):
            what = f"step {si} ({st['op']})"
            if st["op"] == "kernel":
                k = st["kernel"]
                if not 0 <= k < nk:
                    raise BundleError(f"{what}: kernel {k} out of range")
                for a in st["args"]:
                    check_buf(a, what)
                check_buf(st["out"], what)
                kin = kernels[k]["inputs"]
                if len(kin) != len(st["args"]):
                    raise BundleError(f"{what}: kernel {k} takes {len(kin)} inputs, step gives {len(st['args'])}")
                for (shape, dt), a in zip(kin, st["args"]):
                    if list(shape) != list(bufs[a][5]) or dt != bufs[a][4]:
                        raise BundleError(f"{what}: buffer {a} is {bufs[a][4]}{bufs[a][5]}, kernel expects {dt}{shape}")
                o = bufs[st["out"]]
                if list(kernels[k]["shape"]) != list(o[5]) or kernels[k]["dtype"] != o[4]:
                    raise BundleError(f"{what}: output buffer {st['out']} does not match kernel {k}")
            elif st["op"] == "library":
                for a in st["args"]:
                    check_buf(a, what, allow_none=True)
                check_buf(st["out"], what)
                for key, view in (st["attrs"].get("views") or {}).items():
                    b = st["out"] if key == "out" else st["args"][int(key)]
                    _check_view(view, bufs[b], f"{what} view {key}")
            elif st["op"] in ("if", "loop"):
                for key in ("cond", "trip"):
                    if key in st:
                        check_buf(st[key], what, allow_none=True)
                for key in ("outputs", "init", "scan_outputs"):
                    for b in st.get(key, []):
                        check_buf(b, what)
                for key in ("then", "else", "body"):
                    if key in st:
                        for b in st[key]["inputs"] + st[key]["outputs"]:
                            check_buf(b, what)
                        check_steps(st[key]["steps"])
            else:
                raise BundleError(f"{what}: unknown step kind")
    check_steps(plan["steps"])
    for name, b in plan["inputs"] + plan["outputs"]:
        check_buf(b, f"input/output '{name}'")
