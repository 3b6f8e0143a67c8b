"""A range's sizes stored per launch structure (issue 33: Grape's compressed metadata, at the level of
the plan): the plans that compiler/structures.py derives are not stored one by one, but as their
structure's template and the formulas of its numbers (bundle/formulas.py), with the list of sizes
they hold for. A size's plan, kernels and CUDA launch rows are joined from them when first used.

A family's document for one size ("bucket document"):
    {"plan": the plan's JSON, its kernel steps numbering the kernels below from 0, without
             arena_bytes and memory (recomputed: arena_bytes, or left out: the planner's report),
     "kernels": [the kernel IR of each],
     "cuda": [[function, launch, scalars] per kernel] (the manifest CUDA entry's rows), where the
             bundle has GPU code}
stored as two templates (plan + kernels, and the CUDA rows: compiled apart) and their formulas.

BucketDocs serves a bundle's plans by bucket: stored ones from the plans section, a family's joined,
its kernels and CUDA rows appended to the bundle's lists once (their indices then fixed).
"""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field

import numpy as np

from ..plan import Buffer, KernelStep, walk_steps
from .formulas import NumberFit
from .templates import INT_PLACES, JoinText, split


# a kernel's numbers that are choices, not sizes: held in a bucket document as JSON text, so that they are
# part of its structure's template and not fitted (a thread mapping, an attention kernel's tiling)
CHOICE_FIELDS = ("mapping", "tiling")


def kernel_to_document(k: dict) -> dict:
    return {f: json.dumps(v) if f in CHOICE_FIELDS else v for f, v in k.items()}


def kernel_from_document(k: dict) -> dict:
    return {f: json.loads(v) if f in CHOICE_FIELDS else v for f, v in k.items()}


def kernel_order(plan) -> list:
    """The plan's kernels (store indices) in the order a bucket document numbers them."""
    local: dict = {}
    for st in walk_steps(plan.steps):
        if isinstance(st, KernelStep):
            local.setdefault(st.kernel, len(local))
    return list(local)


@dataclass
class Numbered:
    """One template and the formulas of its numbers."""
    template: str     # JSON text, numbers taken out (templates.split)
    fit: NumberFit
    floats: list

    def join(self, sizes: np.ndarray) -> list:
        joiner = JoinText(self.template)
        return [joiner(row, self.floats) for row in self.fit.numbers(sizes).tolist()]

    def to_json(self) -> dict:
        return {"template": self.template, "fit": self.fit.to_json(), "floats": self.floats}

    @staticmethod
    def from_json(d: dict) -> "Numbered":
        return Numbered(str(d["template"]), NumberFit.from_json(d["fit"]), list(d["floats"]))


@dataclass
class Family:
    """The sizes of one launch structure joined from formulas: `plan` numbers the plan and its kernels,
    `cuda` their CUDA rows (None without GPU code)."""
    plan: Numbered
    cuda: Numbered | None
    sizes: np.ndarray      # n x dims
    buckets: list          # the bucket index of each size
    # stored buckets (the structure's compiled sizes and spot members, plans of their own) whose plan and CUDA
    # rows the formulas give exactly, checked at compile time: the GPU runs them with the members
    # (runtime/cuda/family_exec.py). also_sizes: their sizes, n x dims
    also: list = field(default_factory=list)
    also_sizes: np.ndarray | None = None
    _io: dict | None = field(default=None, repr=False, compare=False)   # io_rows(), once worked out
    _all_sizes: np.ndarray | None = field(default=None, repr=False, compare=False)

    def io_rows(self) -> dict:
        """{"inputs"|"outputs": [(name, its buffer's template row)]}: what sizes_io
        reads of the plan's template, taken out of it once (the whole numbered template of a large plan is
        10^5 Python objects: 8 ms a request, and pauses of the collector, where a bound run asked for it)."""
        if self._io is None:
            plan_t = numbered_template(self.plan.template)["plan"]
            # a buffer's index is a number of the plan too, the same at every size of one template
            index = lambda slot: int(self.plan.fit.numbers(self.sizes[:1], [slot])[0, 0])  # noqa: E731
            self._io = {side: [(name, plan_t["buffers"][index(slot)]) for name, slot in plan_t[side]]
                        for side in ("inputs", "outputs")}
        return self._io

    @property
    def all_sizes(self) -> np.ndarray:
        """The members' sizes, then the also-buckets'. Joined once: a range's switch reads a row of it at every
        run, and joining 10^4 rows again cost 17 us each time (session 55, full Wav2Vec2)."""
        if self._all_sizes is None:
            self._all_sizes = self.sizes if not self.also else np.concatenate([self.sizes, self.also_sizes])
        return self._all_sizes

    @property
    def all_buckets(self) -> list:
        return list(self.buckets) + list(self.also)

    def document(self, i: int) -> dict:
        """Member i's bucket document."""
        size = self.sizes[i:i + 1]
        doc = self.plan.join(size)[0]
        if self.cuda is not None:
            doc["cuda"] = self.cuda.join(size)[0]
        return doc

    def to_json(self) -> dict:
        d = {"plan": self.plan.to_json(), "cuda": self.cuda.to_json() if self.cuda else None,
             "sizes": self.sizes.tolist(), "buckets": [int(b) for b in self.buckets]}
        if self.also:
            d["also"] = [[int(b)] + [int(v) for v in size] for b, size in zip(self.also, self.also_sizes)]
        return d

    @staticmethod
    def from_json(d: dict) -> "Family":
        sizes = np.array(d["sizes"], np.int64)
        buckets = [int(b) for b in d["buckets"]]
        if sizes.ndim != 2 or len(sizes) != len(buckets):
            raise ValueError("a family's sizes and buckets differ in number")
        also = [[int(v) for v in row] for row in d.get("also") or []]
        if any(len(row) != 1 + sizes.shape[1] for row in also):
            raise ValueError("a family's also-bucket has another number of dims")
        return Family(Numbered.from_json(d["plan"]), Numbered.from_json(d["cuda"]) if d["cuda"] else None,
                      sizes, buckets, [row[0] for row in also],
                      np.array([row[1:] for row in also], np.int64).reshape(len(also), sizes.shape[1]) if also else None)


def numbered_template(key: str):
    """The template (JSON text) with each number's place holding its index among the numbers."""
    counter = iter(range(1 << 62))

    def walk(x):
        if isinstance(x, str) and x in INT_PLACES:
            return next(counter)
        if isinstance(x, list):
            return [walk(v) for v in x]
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items()}
        return x
    return walk(json.loads(key))


def member_io(family: Family, members: list) -> dict:
    """{"inputs"|"outputs": [(name, BufferTable: a Buffer per member)]}: the I/O buffers of these members (indices into
    family.sizes) from the family's formulas, without joining their plans: what a run reads of a member's plan
    to copy its inputs in and its outputs out."""
    return sizes_io(family, family.sizes[list(members)])


@dataclass
class BufferTable:
    """One I/O buffer of many members: its numbers a row per member (offset, bytes, the shape's dims, the
    pitch where it has one), a Buffer made from its row when asked for (table[i]). Rows, not Buffer objects:
    as objects, Wav2Vec2's 158401 sizes took about a million of them, 0.3 s to make for a large family (at its
    first request, on an H200's host: session 49) and more for the collector to sweep after."""
    name: str
    space: str
    dtype: str
    ndim: int
    pitched: bool
    numbers: np.ndarray   # members x (2 + ndim + pitched), int64

    def __len__(self) -> int:
        return len(self.numbers)

    def __getitem__(self, i: int) -> Buffer:
        r = self.numbers[i].tolist()
        return Buffer(self.name, self.space, r[0], r[1], self.dtype, tuple(r[2:2 + self.ndim]),
                      r[-1] if self.pitched else 0)

    @staticmethod
    def joined(parts: list) -> "BufferTable":
        """One buffer's tables of consecutive member chunks as one table."""
        first = parts[0]
        return BufferTable(first.name, first.space, first.dtype, first.ndim, first.pitched,
                           np.concatenate([p.numbers for p in parts]))


def sizes_io(family: Family, sizes: np.ndarray) -> dict:
    """member_io at these sizes (n x dims): {"inputs"|"outputs": [(name, BufferTable)]}."""
    out = {}
    for side, entries in family.io_rows().items():
        rows = []
        for name, row in entries:
            bname, space, off, nbytes, dtype, shape, *pitch = row
            slots = [off, nbytes] + list(shape) + list(pitch)
            nums = np.asarray(family.plan.fit.numbers(sizes, slots), np.int64)
            rows.append((name, BufferTable(bname, space, dtype, len(shape), bool(pitch), nums)))
        out[side] = rows
    return out


def cuda_rows(entry: dict, kernels: list) -> list:
    """[function, launch, scalars] of each of these bundle kernels (codegen/build.py's manifest entry)."""
    return [[entry["kernels"][k], entry["launch"][k], entry["scalars"][k]] for k in kernels]


class BucketDocs:
    """bucket -> its plan's JSON (kernel steps numbering the bundle's kernels): stored plans (`stored`,
    a sequence, and `stored_buckets`, the bucket of each), and the families' members, each joined when
    first asked for, its kernels (and CUDA rows, into manifest["cuda"]) appended to the bundle's once.
    template_of(bucket): a small int per plan template (the runtime's launch structures)."""

    def __init__(self, stored, stored_buckets: list, families: list, bundle):
        self.stored, self.families, self.bundle = stored, families, bundle
        self.stored_buckets = [int(b) for b in stored_buckets]
        self.stored_kernels = len(bundle.kernels)   # kernels past these are joined members': not written
        n = len(stored_buckets) + sum(len(f.buckets) for f in families)
        self.at: list = [None] * n     # bucket -> ("stored", index) | (family, member)
        for i, b in enumerate(stored_buckets):
            self.at[b] = ("stored", i)
        for f in families:
            for m, b in enumerate(f.buckets):
                if self.at[b] is not None:
                    raise ValueError(f"bucket {b} stored twice")
                self.at[b] = (f, m)
        if any(x is None for x in self.at):
            raise ValueError("a bucket has no plan")
        self.base: dict = {}           # family bucket -> the bundle index of its first kernel
        self._templates: dict = {}     # bucket -> template id
        self._ids: dict = {}           # template text -> id
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.at)

    def __getitem__(self, bucket: int) -> dict:
        where, i = self.at[bucket]
        if where == "stored":
            return self.stored[i]
        doc = where.document(i)
        with self._lock:
            if bucket not in self.base:
                self.base[bucket] = self._append(doc)
        base = self.base[bucket]
        plan = doc["plan"]
        _renumber(plan["steps"], base)
        return dict(plan, memory={}, arena_bytes=_arena_bytes(plan["buffers"]))

    def _append(self, doc: dict) -> int:
        kernels = self.bundle.kernels
        base = len(kernels)
        kernels.extend(kernel_from_document(k) for k in doc["kernels"])
        cuda = self.bundle.manifest.get("cuda")
        if cuda and "cuda" in doc:
            for key, col in zip(("kernels", "launch", "scalars"), zip(*doc["cuda"])):
                cuda[key].extend(col)
        return base

    # --- written --------------------------------------------------------------------------------------
    def stored_docs(self) -> list:
        return [self.stored[i] for i in range(len(self.stored))]

    def stored_manifest(self) -> dict:
        """The bundle's manifest without the CUDA rows of joined members' kernels."""
        m = self.bundle.manifest
        cuda = m.get("cuda")
        if not cuda or "kernels" not in cuda:
            return m
        n = self.stored_kernels
        return dict(m, cuda=dict(cuda, **{k: cuda[k][:n] for k in ("kernels", "launch", "scalars")}))

    def families_json(self) -> dict:
        return {"buckets": self.stored_buckets, "families": [f.to_json() for f in self.families]}

    def template_of(self, bucket: int) -> int:
        t = self._templates.get(bucket)
        if t is None:
            where, _ = self.at[bucket]
            if where != "stored":   # a family's members share its template: its first member's, joined once
                first = where.buckets[0]
                if first != bucket:
                    t = self._templates[bucket] = self.template_of(first)
                    return t
            # keys sorted: a joined member's plan and a stored one list their keys in another order
            text = json.dumps(split(self[bucket])[0], sort_keys=True, separators=(",", ":"))
            t = self._templates[bucket] = self._ids.setdefault(text, len(self._ids))
        return t


def _renumber(steps: list, base: int):
    """Kernel steps' local kernel numbers -> the bundle's (steps as JSON, plan.py; regions' bodies too)."""
    for st in steps:
        if st["op"] == "kernel":
            st["kernel"] += base
        for key in _BODIES:
            if key in st:
                _renumber(st[key], base)


_BODIES = ("then", "else", "enter", "body", "exit")   # plan.py's region step lists, as JSON


def _arena_bytes(buffers: list) -> int:
    return max([0] + [row[2] + row[3] for row in buffers if row[1] == "arena"])
