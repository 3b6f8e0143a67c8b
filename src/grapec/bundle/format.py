"""The .grape bundle, format v1: one file, data only (no pickle, nothing executed on the host).

    b"GRAPEC\\0\\n"            8-byte magic
    u64 little-endian         length of the manifest
    32 bytes                  sha256 of the manifest
    manifest                  UTF-8 JSON: format_version, grapec_version, model, inputs/outputs
                              (dtype, dims with their symbolic names), buckets, targets, sections
    sections                  back to back; the manifest lists each one's offset (from the end of
                              the manifest), size, sha256 and compression:
        weights               raw little-endian bytes, every weight at a 256-byte aligned offset
        kernels               zlib(JSON) of the kernel IR list, shared by all buckets, as templates plus
                              deltas (templates.py)
        plans                 zlib(JSON) of every bucket's plan (plan.py: typed records, stored as JSON),
                              as templates plus deltas: a range's hundreds of sizes cost little more
                              than one
        cubin.<target>        machine code per target (codegen/build.py); ptx.<arch>, cuda.source (these
                              code sections zlib-compressed: PTX is text, 8 of full GPT-2 2-D range's 15 MiB)
        control.<target>      the conditional-node setter kernels, linked with the device runtime
        families              zlib(JSON) of a range's sizes stored as their launch structure's template and
                              formulas (families.py): the buckets the plans section holds, and per
                              family its templates, formulas, sizes and buckets; absent otherwise
        tables                zlib(JSON) of the manifest's per-bucket records, the inputs' shapes per bucket and
                              the CUDA entry's per-kernel rows (tables.py), put back into the
                              manifest when read

Loading checks the magic, the format version, each section's bounds and hash, and then every
buffer, offset and size in every plan against its allocation, so a truncated, corrupted or foreign
file fails with a clear BundleError before anything runs. A bundle of many buckets checks each plan
when it is first used (before it runs), so loading stays quick. A bundle may carry GPU machine code:
load only bundles you trust.
"""
from __future__ import annotations

import hashlib
import json
import math
import mmap
import os
import struct
import tempfile
import zlib
from dataclasses import dataclass, field

from .. import __version__
from ..passes.build_plan import WeightParts
from .. import dtypes
from ..plan import IfStep, KernelStep, LibraryStep, LoopStep, Plan, ScanStoreStep
from ..errors import BundleError
from . import templates
from .value_range import manifest_ranges
from .schema import MAX_JSON_DEPTH, check_manifest, json_depth
from .tables import split_tables, join_tables
from .families import BucketDocs, Family

MAGIC = b"GRAPEC\0\n"
HEADER = 8 + 8 + 32
FORMAT_VERSION = 4   # v4: per-bucket and per-kernel manifest rows in a "tables" section, families; v3: plans and kernels as templates plus deltas; v2: typed plan steps, If/Loop regions
EAGER_CHECK_UP_TO = 16   # plans checked at load; beyond, each when first used
MAX_INFLATED = 1 << 30   # a JSON section's bytes once inflated (512 sizes of GPT-2 take 2 MiB)


def check_writable(path: str) -> str:
    """The directory a bundle at `path` goes in, refused by name where it cannot be written."""
    d = os.path.dirname(os.path.abspath(path)) or "."
    if os.path.isdir(path):
        raise BundleError(f"{path} is a directory; give the bundle's file name (e.g. {os.path.join(path, 'model.grape')})")
    if not os.path.isdir(d):
        raise BundleError(f"cannot write {path}: the directory {d} does not exist")
    if not os.access(d, os.W_OK | os.X_OK):
        raise BundleError(f"cannot write {path}: no permission to write in {d}")
    return d


@dataclass
class Bundle:
    manifest: dict
    _weights: object = b""   # bytes, or WeightParts joined on first use (Bundle.weights)
    kernels: list = field(default_factory=list)
    plans: list = field(default_factory=list)
    extra_sections: dict = field(default_factory=dict)   # name -> bytes (e.g. cubins)

    @property
    def weights(self) -> bytes:
        if isinstance(self._weights, WeightParts):
            self._weights = self._weights.join()
        return self._weights

    @weights.setter
    def weights(self, value):
        self._weights = value

    @property
    def weights_nbytes(self) -> int:
        w = self._weights
        return w.size if isinstance(w, WeightParts) else len(w)

    # --- writing ---------------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        return b"".join(self._parts())

    def _parts(self) -> list:
        """The file as a list of byte strings (header, then each section): write() sends them one by
        one, so the weights are never copied into one whole-file buffer."""
        docs = getattr(self.plans, "docs", None)
        if isinstance(docs, BucketDocs):   # a family's members joined since: not written (their formulas are)
            # a read bundle's stored plans are written back as read (their Plan objects are built from them)
            packed = getattr(docs.stored, "packed", None)
            plans, nk, manifest = packed or _packed(docs.stored_docs()), docs.stored_kernels, docs.stored_manifest()
        else:
            plans, nk, manifest = _packed([p.to_json() for p in self.plans]), len(self.kernels), self.manifest
        lean, tables = split_tables(manifest)
        sections = [("weights", self._weights, "none"), ("kernels", _kernel_section(self.kernels, nk), "zlib"),
                    ("plans", plans, "zlib"),
                    ("tables", _zipped(tables), "zlib")]
        if isinstance(docs, BucketDocs):
            sections.append(("families", _zipped(docs.families_json()), "zlib"))
        for name, data in self.extra_sections.items():   # code: PTX and CUDA C are text, most of a range's non-weight bytes
            sections.append((name, zlib.compress(bytes(data), 6), "zlib"))
        table, off = [], 0
        for name, data, comp in sections:
            parts = isinstance(data, WeightParts)
            size = data.size if parts else len(data)
            table.append({"name": name, "offset": off, "size": size, "compression": comp,
                          "sha256": data.sha256() if parts else hashlib.sha256(data).hexdigest()})
            off += size
        manifest = dict(lean, format_version=FORMAT_VERSION, sections=table)
        mbytes = json.dumps(manifest, indent=1, sort_keys=True).encode()   # a read manifest lists its keys in another order
        out = [MAGIC + struct.pack("<Q", len(mbytes)) + hashlib.sha256(mbytes).digest() + mbytes]
        for _, d, _ in sections:
            out += list(d.pieces()) if isinstance(d, WeightParts) else [d]
        return out

    def write(self, path: str):
        """Atomic: a reader sees the old file or the complete new one, never a partial write."""
        parts = self._parts()
        d = check_writable(path)
        try:
            fd, tmp = tempfile.mkstemp(prefix=".grape-", suffix=".tmp", dir=d)
        except OSError as e:
            raise BundleError(f"cannot write {path}: {e.strerror}") from None
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)   # mkstemp makes 0600; a bundle is an ordinary file
        try:
            with os.fdopen(fd, "wb") as f:
                for part in parts:
                    f.write(part)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException as e:
            if os.path.exists(tmp):
                os.unlink(tmp)
            if isinstance(e, OSError):   # a full disk, a quota: the old file, if any, is left as it was
                raise BundleError(f"cannot write {path}: {e.strerror or e}") from None
            raise

    # --- reading ---------------------------------------------------------------------------------
    @staticmethod
    def read(path: str) -> "Bundle":
        if not os.path.exists(path):
            raise BundleError(f"{path}: no such file")
        with open(path, "rb") as f:
            try:   # mapped, not read: the weights section stays the file's pages (from_bytes keeps it a view)
                data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except (ValueError, OSError):   # an empty file, or one that cannot be mapped
                data = f.read()
        return Bundle.from_bytes(data, path)

    @staticmethod
    def from_bytes(data, where: str = "bundle") -> "Bundle":
        """data: the bundle's bytes (bytes, or a read-only mmap of its file). The weights section stays a
        view of data (no copy: a 2.5 GB model loads without another 2.5 GB), every other section is
        copied out."""
        if len(data) < HEADER or data[:8] != MAGIC:
            raise BundleError(f"{where}: not a grapec bundle (bad magic; an .onnx file goes to `grapec compile`)"
                              if data[:6] != b"GRAPEC" else f"{where}: corrupted bundle header")
        (mlen,) = struct.unpack("<Q", data[8:16])
        if HEADER + mlen > len(data):
            raise BundleError(f"{where}: truncated bundle (manifest needs {mlen} bytes, file has {len(data) - HEADER})")
        mbytes = data[HEADER:HEADER + mlen]
        if hashlib.sha256(mbytes).digest() != data[16:HEADER]:
            raise BundleError(f"{where}: corrupted bundle (the manifest fails its sha256 check)")
        try:
            manifest = _json(mbytes, "the manifest")
        except (UnicodeDecodeError, ValueError) as e:
            raise BundleError(f"{where}: corrupted manifest ({e})") from None
        if not isinstance(manifest, dict):
            raise BundleError(f"{where}: corrupted manifest")
        ver = manifest.get("format_version")
        if not isinstance(ver, int):
            raise BundleError(f"{where}: corrupted manifest (no format_version)")
        if ver > FORMAT_VERSION:
            raise BundleError(f"{where}: bundle format v{ver} was written by grapec {manifest.get('grapec_version', '?')}; "
                              f"this grapec ({__version__}) reads up to v{FORMAT_VERSION}: upgrade grapec or recompile")
        if ver < FORMAT_VERSION:
            raise BundleError(f"{where}: bundle format v{ver} was written by an older grapec "
                              f"({manifest.get('grapec_version', '?')}); this grapec reads v{FORMAT_VERSION}: recompile the model")
        if not isinstance(manifest.get("sections"), list):
            raise BundleError(f"{where}: corrupted manifest (no sections)")
        body = memoryview(data)[HEADER + mlen:]
        sections, packed = {}, {}
        try:
            for s in manifest["sections"]:
                lo, n = s["offset"], s["size"]
                if lo + n > len(body):
                    raise BundleError(f"{where}: truncated bundle (section '{s['name']}' ends at byte "
                                      f"{HEADER + mlen + lo + n}, file has {len(data)})")
                chunk = body[lo:lo + n] if s["name"] == "weights" and s["compression"] == "none" else bytes(body[lo:lo + n])
                if hashlib.sha256(chunk).hexdigest() != s["sha256"]:
                    raise BundleError(f"{where}: corrupted bundle (section '{s['name']}' fails its sha256 check)")
                sections[s["name"]] = _inflate(chunk, s["name"]) if s["compression"] == "zlib" else chunk
                if s["name"] in ("kernels", "plans") and s["compression"] == "zlib":
                    packed[s["name"]] = chunk
            listed = sum(s["size"] for s in manifest["sections"])
            if listed != len(body):
                raise BundleError(f"{where}: corrupted bundle ({len(body)} bytes of sections, manifest lists {listed})")
            missing = [n for n in ("weights", "kernels", "plans") if n not in sections]
            if missing:
                raise ValueError(f"no section {missing}")
            manifest = join_tables(manifest, _json(sections.pop("tables"), "the tables")) if manifest.get("tables") else manifest
            try:
                check_manifest(manifest)
            except ValueError as e:
                raise BundleError(f"{where}: corrupted manifest ({e})") from None
            kernels = templates.LazyDocuments(_json(sections["kernels"], "the kernels"), packed.get("kernels"))
            docs = templates.TemplatedDocs(_json(sections["plans"], "the plans"))
            docs.packed = packed.get("plans")
            families = _json(sections.pop("families"), "the families") if "families" in sections else None
        except BundleError:
            raise
        except (KeyError, TypeError, ValueError, IndexError, OverflowError, AttributeError, zlib.error) as e:
            raise BundleError(f"{where}: corrupted bundle ({type(e).__name__}: {e})") from None
        extra = {k: v for k, v in sections.items() if k not in ("weights", "kernels", "plans", "tables")}
        b = Bundle(manifest, sections["weights"], kernels, [], extra)
        try:
            if families is not None:
                docs = BucketDocs(docs, families["buckets"], [Family.from_json(f) for f in families["families"]], b)
            if len(docs) != len(manifest["buckets"]):
                raise ValueError(f"{len(docs)} plans for {len(manifest['buckets'])} buckets")
        except (KeyError, TypeError, ValueError, IndexError, OverflowError, AttributeError) as e:
            raise BundleError(f"{where}: corrupted bundle ({type(e).__name__}: {e})") from None
        b.plans = StoredPlans(docs, b, where)
        b.validate(where)
        return b

    def storage(self) -> dict:
        """What the plans and kernels take in the file: their sections' bytes and the plans' templates."""
        size = {s["name"]: s["size"] for s in self.manifest.get("sections", [])}
        docs = getattr(self.plans, "docs", None)
        docs = getattr(docs, "stored", docs)
        templates_ = getattr(docs, "templates", None)   # a read bundle's stored plans (TemplatedDocs)
        return {"plans": len(self.plans), "plan_templates": len(templates_) if templates_ is not None else None,
                "plan_bytes": size.get("plans"), "kernel_bytes": size.get("kernels")}

    def largest_arena(self) -> int:
        """The bytes of the one arena all buckets share."""
        return max((int(b["arena_bytes"]) for b in self.manifest["buckets"]), default=0)

    def validate(self, where: str = "bundle"):
        """Every offset and size in every plan against its allocation (a bundle of many buckets: each
        plan when it is first used)."""
        try:
            manifest_ranges(self.manifest)
            self._largest = self.largest_arena()   # kept for check_plan: a range's 158401 buckets, each checked
        except (KeyError, TypeError, ValueError) as e:
            raise BundleError(f"{where}: corrupted manifest ({e})") from None
        if len(self.plans) <= EAGER_CHECK_UP_TO:
            for bi in range(len(self.plans)):
                self.check_plan(bi, self.plans[bi], where)

    def check_plan(self, bi: int, plan: Plan, where: str = "bundle"):
        try:
            largest = getattr(self, "_largest", None)
            largest = self.largest_arena() if largest is None else largest
            if plan.arena_bytes > largest:
                raise BundleError(f"arena of {plan.arena_bytes} bytes, the manifest's largest is {largest}")
            validate_plan(plan, self.weights_nbytes, self.kernels, len(self.kernels))
        except BundleError as e:
            raise BundleError(f"{where}: bucket {bi}: {e}") from None
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise BundleError(f"{where}: bucket {bi}: malformed plan ({type(e).__name__}: {e})") from None


def decode_kernel(bundle: Bundle, k: int):
    """Kernel k's IR (ir/kinds.py), for the backends that run it (the CPU interpreter); a malformed
    entry is a BundleError naming it. The CUDA backend runs the machine code and does not decode them."""
    from ..ir.kinds import kernel_from_json
    try:
        return kernel_from_json(bundle.kernels[k])
    except (KeyError, TypeError, ValueError, IndexError, OverflowError, AttributeError) as e:
        raise BundleError(f"kernel {k} is malformed ({type(e).__name__}: {e})") from None


class StoredPlans:
    """A read bundle's plans, each built from its stored template and numbers when first asked for and
    checked then; the last PLANS_KEPT are kept."""
    PLANS_KEPT = 64

    def __init__(self, docs, bundle: Bundle, where: str):
        self.docs, self.bundle, self.where = docs, bundle, where
        self.checked: set = set()
        self.kept: dict = {}

    def __len__(self) -> int:
        return len(self.docs)

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __getitem__(self, i: int) -> Plan:
        if not -len(self) <= i < len(self):
            raise IndexError(f"bucket {i} out of range")
        i %= len(self)
        plan = self.kept.pop(i, None)
        if plan is None:
            try:
                plan = Plan.from_json(self.docs[i])
            except (KeyError, TypeError, ValueError, IndexError) as e:
                raise BundleError(f"{self.where}: bucket {i}: malformed plan ({type(e).__name__}: {e})") from None
            if i not in self.checked:
                self.bundle.check_plan(i, plan, self.where)
                self.checked.add(i)
        self.kept[i] = plan
        if len(self.kept) > self.PLANS_KEPT:
            del self.kept[next(iter(self.kept))]
        return plan


def _json(text: bytes, what: str):
    """JSON of bounded nesting: a hand-made document nested thousands deep is refused by name instead
    of exhausting the parser's recursion."""
    depth = json_depth(bytes(text))
    if depth > MAX_JSON_DEPTH:
        raise ValueError(f"{what}: JSON nested {depth} deep, more than the {MAX_JSON_DEPTH} a bundle may have")
    return json.loads(bytes(text).decode())


def _inflate(chunk: bytes, name: str) -> bytes:
    """A zlib section, refused past MAX_INFLATED bytes (a small section that inflates to gigabytes)."""
    z = zlib.decompressobj()
    out = z.decompress(chunk, MAX_INFLATED)
    if z.unconsumed_tail:
        raise ValueError(f"section '{name}' inflates past {MAX_INFLATED >> 20} MiB")
    return out + z.flush()


def _packed(docs: list) -> bytes:
    return _zipped(templates.encode(docs))


def _kernel_section(kernels, n: int) -> bytes:
    """The first n kernels packed: a read bundle's own section again where they are the ones it read."""
    if isinstance(kernels, templates.LazyDocuments) and kernels.packed is not None and n == kernels.stored:
        return kernels.packed
    return _packed(kernels[:n])


def _zipped(doc) -> bytes:
    return zlib.compress(json.dumps(doc, separators=(",", ":")).encode(), 6)


def _check_view(view, buf, what):
    """A strided operand (passes/strided_operands.py) stays inside its buffer."""
    offset, batch_stride, ld, shape = view
    n = math.prod(buf.shape)
    if min(offset, batch_stride, ld, *shape) < 0 or len(shape) < 2 or ld < shape[-1]:
        raise BundleError(f"{what}: malformed view {view}")
    batches = math.prod(shape[:-2])
    last = offset + (batches - 1) * batch_stride + (shape[-2] - 1) * ld + shape[-1] - 1
    if math.prod(shape) and last >= n:
        raise BundleError(f"{what}: view {view} reaches element {last} of a buffer of {n}")


def _check_conv(st, bufs, what):
    """A channels-last `conv` step (ir/library.py): its window attributes and the shapes they give."""
    a = st.attrs
    try:
        (sh, sw), (dh, dw), (pt, pl, pb, pr) = a["strides"], a["dilations"], a["pads"]
        group = int(a.get("group", 1))
        (n, h, w, c), (k, r, s, cg), out = bufs[st.args[0]].shape, bufs[st.args[1]].shape, bufs[st.out].shape
    except (KeyError, TypeError, ValueError, IndexError):
        raise BundleError(f"{what}: malformed conv step (attrs {a})") from None
    oh = (h + pt + pb - (r - 1) * dh - 1) // sh + 1 if min(sh, dh) > 0 else -1
    ow = (w + pl + pr - (s - 1) * dw - 1) // sw + 1 if min(sw, dw) > 0 else -1
    bias_ok = len(st.args) < 3 or st.args[2] < 0 or bufs[st.args[2]].shape == (k,)
    if group < 1 or c != cg * group or k % group or tuple(out) != (n, oh, ow, k) or not bias_ok:
        raise BundleError(f"{what}: conv of x{[n, h, w, c]} w{[k, r, s, cg]} with {a} cannot write {list(out)}")


def validate_plan(plan: Plan, weight_bytes, kernels, nk):
    """Every buffer within its space and every step's operands its kernel's: raises BundleError."""
    arena = plan.arena_bytes
    bufs = plan.buffers
    for i, b in enumerate(bufs):
        if b.dtype not in dtypes.SUPPORTED:
            raise BundleError(f"buffer {i} '{b.name}': unknown dtype {b.dtype!r}")
        if b.pitch and (not b.shape or b.pitch < b.shape[-1]):
            raise BundleError(f"buffer {i} '{b.name}': row pitch {b.pitch} is shorter than its rows ({list(b.shape)})")
        if b.nbytes != b.stored_elements * dtypes.itemsize(b.dtype) or min(b.shape, default=0) < 0:
            raise BundleError(f"buffer {i} '{b.name}': {b.nbytes} bytes does not match {b.dtype}{list(b.shape)}"
                              + (f" in rows of {b.pitch}" if b.pitch else ""))
        limit = arena if b.space == "arena" else weight_bytes if b.space == "weight" else None
        if limit is None:
            raise BundleError(f"buffer {i} '{b.name}': unknown space {b.space!r}")
        if b.offset < 0 or b.offset + b.nbytes > limit:
            raise BundleError(f"buffer {i} '{b.name}': bytes [{b.offset}, {b.offset + b.nbytes}) outside its "
                              f"{b.space} of {limit} bytes")

    def check_buf(b, what, allow_none=False):
        if allow_none and b == -1:
            return
        if not isinstance(b, int) or not 0 <= b < len(bufs):
            raise BundleError(f"{what}: buffer index {b} out of range")

    def check_scalar(b, what, dt, allow_none=False):
        check_buf(b, what, allow_none)
        if b >= 0 and (bufs[b].dtype != dt or math.prod(bufs[b].shape) != 1):
            raise BundleError(f"{what}: buffer {b} must hold one {dt}, it is {bufs[b].dtype}{list(bufs[b].shape)}")

    def check_steps(steps, where):
        for si, st in enumerate(steps):
            what = f"{where}step {si} ({st.op})"
            if isinstance(st, KernelStep):
                if not 0 <= st.kernel < nk:
                    raise BundleError(f"{what}: kernel {st.kernel} out of range")
                for a in st.args:
                    check_buf(a, what)
                check_buf(st.out, what)
                kin = kernels[st.kernel]["inputs"]
                if len(kin) != len(st.args):
                    raise BundleError(f"{what}: kernel {st.kernel} takes {len(kin)} inputs, step gives {len(st.args)}")
                for (shape, dt), a in zip(kin, st.args):
                    if tuple(shape) != bufs[a].shape or dt != bufs[a].dtype:
                        raise BundleError(f"{what}: buffer {a} is {bufs[a].dtype}{list(bufs[a].shape)}, kernel expects {dt}{shape}")
                o = bufs[st.out]
                if tuple(kernels[st.kernel]["shape"]) != o.shape or kernels[st.kernel]["dtype"] != o.dtype:
                    raise BundleError(f"{what}: output buffer {st.out} does not match kernel {st.kernel}")
            elif isinstance(st, LibraryStep):
                for a in st.args:
                    check_buf(a, what, allow_none=True)
                check_buf(st.out, what)
                for key, view in (st.attrs.get("views") or {}).items():
                    b = st.out if key == "out" else st.args[int(key)]
                    _check_view(view, bufs[b], f"{what} view {key}")
                if st.attrs.get("op") == "conv":
                    _check_conv(st, bufs, what)
            elif isinstance(st, ScanStoreStep):
                check_buf(st.src, what)
                check_buf(st.dst, what)
                check_scalar(st.counter, what, "int64")
                src, dst = bufs[st.src], bufs[st.dst]
                if dst.shape[1:] != src.shape or dst.dtype != src.dtype or not dst.shape:
                    raise BundleError(f"{what}: rows of buffer {st.dst} ({dst.dtype}{list(dst.shape)}) do not "
                                      f"match buffer {st.src} ({src.dtype}{list(src.shape)})")
            elif isinstance(st, IfStep):
                check_scalar(st.cond, what, "bool")
                for b in st.outputs:
                    check_buf(b, what, allow_none=True)
                check_steps(st.then.steps, what + " then: ")
                check_steps(st.else_.steps, what + " else: ")
            elif isinstance(st, LoopStep):
                check_scalar(st.trip, what, "int64", allow_none=True)
                check_scalar(st.cond, what, "bool", allow_none=True)
                check_scalar(st.counter, what, "int64")
                check_scalar(st.cond_in, what, "bool")
                check_scalar(st.cond_out, what, "bool")
                for b in st.outputs:
                    check_buf(b, what, allow_none=True)
                for b in st.carried or []:
                    check_buf(b, what)
                for label, sub in (("enter", st.enter), ("body", st.body.steps), ("exit", st.exit)):
                    check_steps(sub, f"{what} {label}: ")
            else:  # pragma: no cover - Plan.from_json builds only these
                raise BundleError(f"{what}: unknown step kind")
    check_steps(plan.steps, "")
    for name, b in plan.inputs + plan.outputs:
        check_buf(b, f"input/output '{name}'")
