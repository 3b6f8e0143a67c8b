"""Which derived sizes of a range are stored as their structure's formulas (bundle/families.py) instead
of as plans, and the checks that let them.

compiler/structures.py fits each structure's numbers over its compiled sizes and derives every other
size from the fit. Joining and storing each derived plan (and rendering its kernels) costs per size:
a range of 32768 sizes cannot afford it. So a structure's derived sizes become a family, stored as
the fit, when:
- every member's arena buffers sit at the structure's layout and fit their slots there, and its
  weight buffers lie within the weights, at offsets that do not depend on the size: checked for all
  members at once on the formulas' numbers (numpy, in chunks);
- a few spot members, joined as plans and stored as such, pass every check a stored plan passes
  (bundle/format.py validate_plan), and later show the CUDA rows the formulas give (pipeline.py); a spot
  or two that the compiled sizes' fit misses join them and the fit is tried again, the others checking it.
A family that fails either is stored plan by plan, as before.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

import numpy as np

from ..bundle.families import Family, Numbered, cuda_rows, kernel_order, kernel_to_document, numbered_template
from ..bundle.templates import split
from ..passes.plan_memory import ALIGN
from ..plan import KernelStep, LibraryStep, Plan, walk_steps
from .fanout import map_forked
from .formulas import fit_numbers

FAMILY_MIN = 8      # structures with fewer derived sizes keep them as plans
SPOTS = 5           # members of a family joined, checked and stored as plans (its smallest, largest, three drawn)
# A spot whose CUDA rows the compiled sizes' fit misses may join them and the fit be tried again, this many at most:
# the spots it leaves out still check the new fit. Compiled sizes can leave two formulas apart (tiny Wav2Vec2's
# im2col grid ceil(L / 8) against ceil((L + 1) / 8): 22 sizes with no L = 0 mod 8), and a spot tells them apart.
REFIT_SPOTS = 2
CHUNK = 4096        # sizes whose numbers are evaluated at once


# a library step's estimates for `grapec inspect` (passes/sdpa.py: cuDNN's attention against the generated
# kernel's, in us): floats of every size, not part of what runs; derived plans go without them
REPORT_ONLY = "priced"


def bucket_document(plan: Plan, kernels: list) -> dict:
    """The plan with its kernels inline (indices local to it), without what derived plans recompute
    (arena_bytes) or do not have (the memory planner's report, REPORT_ONLY estimates)."""
    local: dict = {}
    doc = Plan.from_json(plan.to_json())
    for st in walk_steps(doc.steps):
        if isinstance(st, KernelStep):
            st.kernel = local.setdefault(st.kernel, len(local))
        elif isinstance(st, LibraryStep) and REPORT_ONLY in st.attrs:
            st.attrs = {k: v for k, v in st.attrs.items() if k != REPORT_ONLY}
    d = doc.to_json()
    del d["memory"], d["arena_bytes"]
    return {"plan": d, "kernels": [kernel_to_document(kernels[i]) for i in local]}



@dataclass
class RangeFamily:
    """A structure's derived sizes stored as its formulas."""
    key: str            # the structure's template (compiler/structures.py Compiled.key)
    fit: tuple          # (NumberFit, floats) of its documents' numbers
    sizes: list         # members stored as formulas
    evidence: list      # compiled sizes the fit was made over
    spots: list         # members stored as plans, checked
    arena_bytes: list   # per member of `sizes`
    largest: Plan       # the structure's plan whose arena layout its members take
    weight_slots: list = field(default_factory=list)   # numbers that are weight offsets (relocated as weights move)
    buckets: list = field(default_factory=list)        # the bucket of each of `sizes`
    bucket_of: dict = field(default_factory=dict)      # size (evidence, spots) -> its bucket
    floors: list = field(default_factory=list)         # the range's floors of its dims (floor_dims.py)

    def relocate(self, moved: dict) -> bool:
        """The weight offsets as WeightStore.share_prefixes moved them (passes/build_plan.relocate_weights):
        a constant mapped; an offset that depends on the size (a per-size constant's, one entry per batch)
        shifted, or fitted again over the members. -> False where no formula gives the moved offsets."""
        nf = self.fit[0]
        sizes = np.array(self.sizes, np.int64)
        for j in self.weight_slots:
            c = nf.constant(j)
            if c is not None:
                nf.set_constant(j, moved[c])
                continue
            old = nf.numbers(sizes, [j])[:, 0]
            try:
                new = np.array([moved[v] for v in old.tolist()], np.int64)
            except KeyError:
                return False
            if (new - old == new[0] - old[0]).all():
                nf.add_constant(j, int(new[0] - old[0]))
                continue
            refit = fit_numbers(sizes, new[:, None])
            if not refit.complete or refit.extra:
                return False
            nf.slots[j] = refit.slots[0]
        return True

    def stored(self, buckets: list, cuda: Numbered | None, also: list = ()) -> Family:
        """also: [(bucket, size)] of stored plans that the formulas give (also_given)."""
        nf, floats = self.fit
        return Family(Numbered(self.key, nf, floats), cuda, np.array(self.sizes, np.int64), buckets,
                      [b for b, _ in also], np.array([s for _, s in also], np.int64) if also else None)

    def gives(self, size, plan: Plan, kernels: list, entry: dict | None, cuda: Numbered | None) -> bool:
        """Whether the family's formulas give this stored plan of one of its structure's sizes (and its CUDA rows)
        number for number: then the GPU runs it as a member (runtime/cuda/family_exec.py; Family.also) instead
        of with a plan and a graph of its own."""
        nf, floats = self.fit
        at = np.array([size], np.int64).reshape(1, -1)
        if not _gives(Numbered(self.key, nf, floats), at, bucket_document(plan, kernels)):
            return False
        return cuda is None or (entry is not None and _gives(cuda, at, cuda_rows(entry, kernel_order(plan))))


def _gives(numbered: Numbered, at: np.ndarray, doc) -> bool:
    """Whether the numbered template at these sizes (one row) is this document, number for number."""
    t, ints, floats = split(doc)
    return (json.dumps(t, separators=(",", ":")) == numbered.template and floats == numbered.floats
            and len(ints) == len(numbered.fit.slots) and numbered.fit.numbers(at)[0].tolist() == list(ints))


def buffer_needs(key: str, fit: tuple, members: list) -> list:
    """Per buffer of the structure's plans, the most bytes any of these derived sizes gives it by the
    formulas (None for weight buffers): what its shared layout must hold (shared_layout.widened)."""
    plan_t = numbered_template(key)["plan"]
    arena, _ = buffer_slots(plan_t)
    most = np.zeros(len(arena), np.int64)
    for lo in range(0, len(members), CHUNK):
        nums = fit[0].numbers(np.array(members[lo:lo + CHUNK], np.int64), [nb for _, _, nb in arena])
        most = np.maximum(most, nums.max(axis=0, initial=0))
    out: list = [None] * len(plan_t["buffers"])
    for (i, _, _), n in zip(arena, most.tolist()):
        out[i] = int(n)
    return out


def buffer_slots(plan_t: dict) -> tuple:
    """A numbered plan template's buffers: ([(buffer, offset's number, bytes' number)] of the arena ones,
    the same of the weight ones)."""
    arena, weight = [], []
    for i, row in enumerate(plan_t["buffers"]):
        (arena if row[1] == "arena" else weight).append((i, row[2], row[3]))
    return arena, weight


def form_family(key: str, fit: tuple, members: list, evidence: list, largest: Plan, weight_bytes: int,
                rng: random.Random, floors: list = ()) -> RangeFamily | str:
    """A family of these derived sizes, its spot members drawn; or why not (checked on the numbers)."""
    if len(members) < FAMILY_MIN:
        return f"{len(members)} derived sizes"
    plan_t = numbered_template(key)["plan"]
    if plan_t.get("stitches"):
        return "stitched kernels (their launches are stored per size)"
    nf = fit[0]
    arena, weight = buffer_slots(plan_t)
    slots = [s for _, off, nb in arena + weight for s in (off, nb)]
    big_off = np.array([largest.buffers[i].offset for i, _, _ in arena], np.int64)
    big_nb = np.array([largest.buffers[i].nbytes for i, _, _ in arena], np.int64)
    aligned = big_off % ALIGN == 0
    room = np.where(aligned, ALIGN * -(-big_nb // ALIGN), big_nb)   # a buffer's slot (shared_layout.fits_slot)
    arena_bytes = []
    for lo in range(0, len(members), CHUNK):
        nums = nf.numbers(np.array(members[lo:lo + CHUNK], np.int64), slots)
        a = nums[:, :2 * len(arena)]
        off, nb = a[:, 0::2], a[:, 1::2]
        if (off != big_off).any():
            i, j = np.argwhere(off != big_off)[0]
            return (f"arena buffer {plan_t['buffers'][arena[j][0]][0]} at {members[lo + i]} lies elsewhere than at "
                    "its structure's largest size")
        if (nb > room).any() or (nb < 0).any():
            i, j = np.argwhere((nb > room) | (nb < 0))[0]
            return (f"arena buffer {plan_t['buffers'][arena[j][0]][0]} takes {nb[i, j]} bytes at {members[lo + i]}, "
                    f"{room[j]} in its structure's largest size's layout")
        w = nums[:, 2 * len(arena):]
        if ((w[:, 0::2] + w[:, 1::2]) > weight_bytes).any() or (w < 0).any():
            return "a weight buffer past the weights"
        arena_bytes += (off + nb).max(axis=1, initial=0).tolist()
    pool = members[1:-1]
    spots = sorted({members[0], members[-1], *rng.sample(pool, min(len(pool), SPOTS - 2))})
    keep = [i for i, s in enumerate(members) if s not in spots]
    return RangeFamily(key, fit, [members[i] for i in keep], evidence, spots, [arena_bytes[i] for i in keep],
                       largest, [off for _, off, _ in weight], floors=list(floors))


def fit_cuda_rows(family: RangeFamily, entry: dict, plan_of: dict) -> Numbered | str:
    """The CUDA rows of a family's kernels as formulas of the sizes, fitted over its compiled sizes and
    checked at its spot members (plan_of: size -> its stored plan); or why not."""
    def rows(s):
        return split(cuda_rows(entry, kernel_order(plan_of[s])))
    fitted = [rows(s) for s in family.evidence]
    key = json.dumps(fitted[0][0], separators=(",", ":"))
    if any(json.dumps(t, separators=(",", ":")) != key or f != fitted[0][2] for t, _, f in fitted):
        return "its compiled sizes run different functions or fractional arguments"
    numbered = _fit_rows(family, family.evidence, [i for _, i, _ in fitted], key, fitted[0][2])
    if isinstance(numbered, str):
        return numbered
    missed = _missed_spots(numbered, family.spots, entry, plan_of)
    seen = [rows(s) for s in missed]
    if missed and len(missed) <= REFIT_SPOTS and len(family.spots) - len(missed) >= 2 and \
            all(json.dumps(t, separators=(",", ":")) == key and f == fitted[0][2] for t, _, f in seen):
        refit = _fit_rows(family, family.evidence + missed, [i for _, i, _ in fitted + seen], key, fitted[0][2])
        if not isinstance(refit, str) and not _missed_spots(refit, family.spots, entry, plan_of):
            return refit
    if missed:
        return f"its size {missed[0]} launches otherwise than its formulas say"
    return numbered


def _fit_rows(family: RangeFamily, sizes: list, ints: list, key: str, floats: list) -> Numbered | str:
    sizes, ints = np.array(sizes, np.int64), np.array(ints, np.int64).reshape(len(sizes), -1)
    nf = fit_numbers(sizes, ints, family.floors)
    if not nf.complete:
        # a grid may round up what only the plan's formulas hold (ceil(a buffer's bytes / 1024) blocks, its
        # bytes a round-up of batch x frames): fitted again over the plan's variables, with its numbers
        plan_fit = family.fit[0]
        nf = fit_numbers(sizes, ints, plan_fit.extra, [s for s in plan_fit.slots if s is not None])
    if not nf.complete:
        return "launch numbers that follow no formula"
    return Numbered(key, nf, floats)


def _missed_spots(numbered: Numbered, spots: list, entry: dict, plan_of: dict) -> list:
    joined = numbered.join(np.array(spots, np.int64))
    return [s for s, got in zip(spots, joined) if got != cuda_rows(entry, kernel_order(plan_of[s]))]


class RangeFamilies:
    """A compile's families, from the range compile to the bundle (empty for other compiles): the buckets
    stored as plans, the families' records, their CUDA rows once the code is built."""

    def __init__(self, bucket_shapes: list):
        self.n = len(bucket_shapes)
        self.families: list = []     # RangeFamily, each with .buckets
        self.results: dict = {}      # bucket -> BucketResult of the buckets stored as plans
        self.cuda: dict = {}         # id(family) -> Numbered CUDA rows
        self.also: dict = {}         # id(family) -> [(bucket, size)] of stored plans its formulas give (find_also)
        self.derive = None           # (family, weight bytes or None: today's) -> {bucket: BucketResult}: its members as plans
        self.meta = None             # (family, member index) -> its bucket's manifest record
        self.account: dict | None = None   # how the range was compiled, for `grapec inspect` (manifest "range_compile")

    def take(self, families: list, results: dict, bucket_of: dict, derive, meta, weight_bytes: int):
        for f in families:
            f.buckets = [bucket_of[s] for s in f.sizes]
            f.bucket_of = {s: bucket_of[s] for s in f.evidence + f.spots}
        self.families, self.results, self.derive, self.meta = families, results, derive, meta
        self.weight_bytes = weight_bytes   # the weights' bytes before WeightStore.share_prefixes

    def bucket_meta(self, stored: list) -> list:
        """Every bucket's manifest record: the stored plans' (in order), the families' members'."""
        if not self.families:
            return stored
        out = [None] * self.n
        for b, m in zip(sorted(self.results), stored):
            out[b] = m
        for f in self.families:
            for i, b in enumerate(f.buckets):
                out[b] = self.meta(f, i)
        return out

    def relocate(self, moved: dict) -> bool:
        """Every family's weight offsets moved (RangeFamily.relocate); a family whose offsets follow no
        formula after is stored plan by plan. -> whether any was."""
        from ..passes.build_plan import relocate_weights
        kept = []
        for f in self.families:
            if f.relocate(moved):
                kept.append(f)
                continue
            derived = self.derive(f, self.weight_bytes)   # at the offsets before the move, then moved
            relocate_weights([r.plan for r in derived.values()], moved)
            self.results.update(derived)
        fell = len(kept) < len(self.families)
        self.families = kept
        return fell

    def evidence_kernels(self) -> set:
        """Kernels of the compiled sizes the families were fitted over: their functions also run the
        families' members, so they take their sizes as arguments (codegen/module.py merges them)."""
        return {k for f in self.families for s in f.evidence for k in kernel_order(self._plan(f, s))}

    def _plan(self, f: RangeFamily, size) -> Plan:
        return self.results[f.bucket_of[size]].plan

    def fit_launches(self, entry: dict, say) -> bool:
        """Each family's CUDA rows as formulas (fit_cuda_rows); a family whose rows follow none is stored
        plan by plan. -> whether any was (its members' kernels then need code)."""
        kept, fell = [], False
        for f in self.families:
            cuda = fit_cuda_rows(f, entry, {s: self._plan(f, s) for s in f.evidence + f.spots})
            if isinstance(cuda, str):
                say(f"range: {len(f.sizes)} sizes from {f.sizes[0]} stored plan by plan: {cuda}")
                self.results.update(self.derive(f, None))
                fell = True
            else:
                self.cuda[id(f)] = cuda
                kept.append(f)
        self.families = kept
        return fell

    def find_also(self, kernels: list, entry: dict, jobs: int | None = None):
        """Each family's also-buckets: [(bucket, size)] of its structure's compiled sizes and spot members that it
        gives (RangeFamily.gives), once its CUDA rows are fitted; over forked processes (a full-size plan's check
        takes tens of ms, and a range compiles thousands of sizes)."""
        pairs = [(i, s) for i, f in enumerate(self.families) for s in sorted(set(f.evidence) | set(f.spots))]

        def given(pair) -> bool:
            f = self.families[pair[0]]
            return f.gives(pair[1], self._plan(f, pair[1]), kernels, entry, self.cuda.get(id(f)))
        found = map_forked(given, pairs, jobs, chunk=64)
        for f in self.families:
            self.also[id(f)] = []
        for (i, size), ok in zip(pairs, found):
            if ok:
                f = self.families[i]
                self.also[id(f)].append((f.bucket_of[size], list(np.atleast_1d(size))))

    def gpu_report(self, entry: dict) -> str | None:
        """How the range's sizes will run on the GPU (runtime/cuda/family_plan.py range_on_gpu)."""
        if not self.families:
            return None
        # above the runtime: the compiler says what the CUDA runtime will make of the bundle (host-side only)
        from ..runtime.cuda.family_plan import range_on_gpu
        fams = [f.stored(f.buckets, self.cuda.get(id(f)), self.also.get(id(f), ())) for f in self.families]
        return range_on_gpu(fams, set(entry.get("sized") or []), self.n).text()

    def stored_plans(self) -> list:
        return [self.results[b].plan for b in sorted(self.results)]

    def bundle(self, b):
        """The compiled Bundle, its families' members served by BucketDocs (bundle/families.py)."""
        if not self.families:
            return b
        from ..bundle.families import BucketDocs
        from ..bundle.format import StoredPlans
        stored = [p.to_json() for p in b.plans]
        fams = [f.stored(f.buckets, self.cuda.get(id(f)), self.also.get(id(f), ())) for f in self.families]
        b.plans = StoredPlans(BucketDocs(stored, sorted(self.results), fams, b), b, "the compiled bundle")
        return b
