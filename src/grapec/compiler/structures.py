"""A --dynamic range compiled per launch structure (issue 33): a sample of its sizes is compiled, and
every other size's plan and kernels are derived from its structure's.

Sizes fall into a few launch structures: plans (with their kernels) that differ only in numbers
(bundle/templates.py). Within one, the numbers follow the sizes: element and byte counts are
polynomials in the dims (b * s * 64 * 4), a pitch rounds a dim up (round_up(s, 4)) and a count over
a pitch is a polynomial in both; arena offsets are the structure's largest size's
(shared_layout.py). So a range of many sizes is compiled as follows.

1-2. Boxes and probes (boxes.py): the sizes as boxes (by leading values, spans between powers of
   four, remainders), each taken to be one structure's once its probes agree.
3. Formulas (`fit_numbers`). Every number of a structure is fitted over its compiled sizes (drawn at
   random from it, enough that the cubics in the dims have the rank over them they have over the
   structure's sizes: `formulas.spans`): a
   constant, a polynomial with integer coefficients in the dims, the model's floors of them
   (floor_dims.py: Wav2Vec2's frames) and the round-ups found so far, or a
   round-up or rounded-up division of one. A polynomial is kept only where it holds at more compiled
   sizes than it has terms. A structure whose numbers step inside it (a block size doubling at a
   threshold) is cut where they do, and each side fitted on its own.
4. Derivation. Every other size's plan and kernels are its structure's template with the formulas'
   numbers, each arena buffer within its bytes at the largest compiled size, the plan passing the
   checks a bundle's plans pass at load (bundle/format.py validate_plan); a size that fails either is
   compiled. A box with numbers no formula fits is compiled whole.
5. Check. CHECKS derived sizes (in a large range, one in CHECK_ONE_IN), drawn at random, are compiled
   too and compared number for number; a box with one that differs goes back to step 2, split, and the
   next round checks the structures of its parts only (a 158401-size range checked 1236 sizes a round).

The result is what compiling each size with its box's choices gives (tests/test_range_structures.py
compares the two), at a fraction of the compiles; `--every-size` compiles every size on its own.
"""
from __future__ import annotations

import bisect
import json
import random
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..bundle.families import kernel_from_document
from ..bundle.format import validate_plan
from ..bundle.templates import JoinText, split
from ..errors import BundleError
from ..plan import KernelStep, LibraryStep, Plan, walk_steps
from .boxes import Box, coincident, initial_boxes, likes, probe
from .fanout import frozen_heap, map_buckets
from .families import REPORT_ONLY, bucket_document, buffer_needs, form_family
from .formulas import fit_numbers, spans
from .shared_layout import buffer_bytes, fits_slot, layout_misfit, widened

CHECKS = 16       # derived sizes compiled again and compared, per round, at least
CHECK_ONE_IN = 128  # ... and one in this many of the derived sizes
ROUNDS = 4        # rounds of check and split before a box that still differs is compiled whole
SAMPLE_OVER = 64  # ranges of more sizes than this are compiled this way (fewer: every size)
BOX_FIT_SIZES = 8  # a part of a structure fitted on its own has at least this many sizes compiled
MIN_FIT_SIZES = 4  # no formula is fitted over fewer sizes


# --- a size's document: its plan and kernels ------------------------------------------------------

@dataclass
class Compiled:
    """A compiled size's document split into its template (the structure's key) and numbers."""
    key: str
    ints: list
    floats: list


def _document(plan: Plan, kernels: list) -> Compiled:
    t, ints, floats = split(bucket_document(plan, kernels))
    return Compiled(json.dumps(t, separators=(",", ":")), ints, floats)


def _without_reports(plan: Plan):
    """A compiled plan without what its derived siblings do not have (bucket_document): the memory
    planner's report and REPORT_ONLY estimates, so that plans of one structure share one template."""
    plan.memory = {}
    for st in walk_steps(plan.steps):
        if isinstance(st, LibraryStep) and REPORT_ONLY in st.attrs:
            st.attrs = {k: v for k, v in st.attrs.items() if k != REPORT_ONLY}


def _derive(doc: dict, kernels, largest: Plan, weight_bytes: int) -> Plan | None:
    """A size's plan from its document (its structure's template with the formulas' numbers), its
    kernels added to the store; None where an arena buffer would pass its bytes at the structure's
    largest compiled size, or where the plan fails the checks a bundle's plans pass at load (bytes that
    do not match a buffer's shape, a kernel whose operands are not its step's buffers: a formula that
    the checks of compile_range missed)."""
    plan = Plan.from_json(dict(doc["plan"], arena_bytes=0, memory={}))
    for b, big in zip(plan.buffers, largest.buffers):
        if b.space == "arena" and (b.offset != big.offset or not fits_slot(b, big)):
            return None
    plan.arena_bytes = max([0] + [b.offset + b.nbytes for b in plan.buffers if b.space == "arena"])
    try:
        validate_plan(plan, weight_bytes, doc["kernels"], len(doc["kernels"]))
    except BundleError:
        return None
    for st in walk_steps(plan.steps):
        if isinstance(st, KernelStep):
            k = doc["kernels"][st.kernel]
            st.kernel = kernels.add_json(kernel_from_document(k))
    return plan


def _derived_documents(fit_of: dict):
    """size -> its document, for the sizes of fit_of in order: each structure's numbers evaluated for
    all its sizes at once, each document joined from its template's text (JoinText)."""
    by_fit: dict = {}
    for s, (fit, key) in fit_of.items():
        by_fit.setdefault(id(fit), (fit, key, []))[2].append(s)
    rows, joiners = {}, {}
    for (nf, floats), key, members in by_fit.values():
        rows.update(zip(members, nf.numbers(np.array(members)).tolist()))
        joiners.setdefault(key, JoinText(key))
    for s, (fit, key) in fit_of.items():
        yield s, joiners[key](rows[s], fit[1])


# --- the compile ----------------------------------------------------------------------------------

@dataclass
class RangeCompile:
    """What compile_range did, for the log."""
    sizes: int = 0
    compiled: int = 0
    checked: int = 0
    derived: int = 0
    structures: int = 0
    whole: list = field(default_factory=list)   # boxes compiled size by size, and why
    misfits: list = field(default_factory=list)   # compiled sizes that keep their own arena layout, and why
    families: list = field(default_factory=list)   # RangeFamily: derived sizes stored as formulas
    not_families: list = field(default_factory=list)   # why a structure's derived sizes are stored as plans
    widened: dict = field(default_factory=dict)   # structure key -> bytes its layout grew by (_Compiles.widen)
    seconds: float = 0.0
    phases: dict = field(default_factory=dict)   # phase -> [sizes compiled, seconds] (_Compiles.add)

    def summary(self) -> str:
        s = (f"{self.sizes} sizes in {self.structures} launch structures: {self.compiled} compiled "
             f"({self.checked} of them to check derived plans), {self.derived} derived from their "
             f"structure's formulas, {self.seconds:.1f}s")
        if self.phases:
            s += " (" + ", ".join(f"{n} {c} in {t:.0f}s" for n, (c, t) in self.phases.items()) + ")"
        if self.whole:
            s += f"; compiled size by size: {'; '.join(self.whole[:3])}" + (" ..." if len(self.whole) > 3 else "")
        if self.families:
            s += (f"; {sum(len(f.sizes) for f in self.families)} of the derived stored as the formulas of "
                  f"{len(self.families)} families")
        if self.not_families:
            why = sorted(self.not_families, key=lambda w: -int(w.split()[0]))   # each begins with its count
            s += (f"; derived sizes stored as plans: {'; '.join(why[:4])}"
                  + (f" (and {len(self.not_families) - 4} more)" if len(self.not_families) > 4 else ""))
        if self.widened:
            s += (f"; {len(self.widened)} structures' layouts widened for buffers largest at another size "
                  f"(by {max(self.widened.values()) / 1024:.1f} KiB at most)")
        if self.misfits:
            s += (f"; {len(self.misfits)} compiled size(s) keep their own arena layout: {'; '.join(self.misfits[:3])}"
                  + (" ..." if len(self.misfits) > 3 else ""))
        return s


class _Compiles:
    """The compiled sizes of a range, their documents, and the compiling of more."""

    def __init__(self, compile_one, shapes_of, order: dict, weights, kernels, jobs, say, floors=()):
        self.compile_one, self.shapes_of, self.order = compile_one, shapes_of, order
        self.weights, self.kernels, self.jobs, self.say = weights, kernels, jobs, say
        self.floors = list(floors)   # the formulas' variables beside the dims (floor_dims.py)
        self.results: dict = {}   # size -> BucketResult
        self.docs: dict = {}      # size -> Compiled
        self.shared: set = set()  # the sizes share_layouts has seen
        self.members: dict = {}   # structure key -> its compiled sizes share_layouts has seen
        self.largest: dict = {}   # structure key -> the one whose buffers are largest (whose layout they take)
        self.layout: dict = {}    # structure key -> its largest's layout widened for every size (widen), where it was
        self.widened: dict = {}   # structure key -> the bytes widening added to its largest's arena
        self.misfits: dict = {}   # size -> why it could not take its structure's largest layout
        self.t0 = time.perf_counter()
        self.phase = "scan"      # what the compiles are for, for the log
        self.phases: dict = {}   # phase -> [sizes compiled, seconds]

    def add(self, sizes, like: dict | None = None):
        """Compile these sizes; like: size -> the compiled size whose choices it repeats."""
        todo = sorted(set(sizes) - set(self.results), key=self.order.__getitem__)
        if not todo:
            return
        like = like or {}

        reps = {s: self.results.get(like.get(s)) for s in todo}   # as they were before this batch (arrived fills in)

        def one(s, w, k):
            rep = reps[s]
            return self.compile_one(self.shapes_of(s), w, k, rep.choices if rep is not None else None)

        def arrived(i, r):   # its document made while the workers compile the rest
            self.results[todo[i]] = r
            self.docs[todo[i]] = _document(r.plan, self.kernels.kernels)
        t = time.perf_counter()
        map_buckets(one, todo, self.weights, self.kernels, self.jobs, each=arrived)
        tally = self.phases.setdefault(self.phase, [0, 0.0])
        tally[0] += len(todo)
        tally[1] += time.perf_counter() - t
        self.say(f"range: {len(self.results)} of {len(self.order)} sizes compiled ({len(todo)} to {self.phase}), "
                 f"{time.perf_counter() - self.t0:.1f}s")

    def share_layouts(self):
        """Each structure's plans at its largest compiled size's arena offsets (shared_layout.py), for
        the sizes compiled since the last call (every member again where a fresh one is the largest);
        the documents of the plans that moved anew."""
        fresh = sorted((s for s in self.results if s not in self.shared), key=self.order.__getitem__)
        self.shared.update(fresh)
        by_key: dict = {}
        for s in fresh:
            by_key.setdefault(self.docs[s].key, []).append(s)
        for key, new in by_key.items():
            members = self.members.setdefault(key, [])
            members += new
            old = self.largest.get(key)
            # the one whose buffers hold the most bytes (buffers grow with the sizes), not the largest arena:
            # a smaller size may pack into a larger arena, and the larger size's buffers would not fit its layout
            top = max(([old] if old is not None else []) + new, key=lambda s: buffer_bytes(self.results[s].plan))
            self.largest[key] = top
            if top != old:
                self.layout.pop(key, None)
            big = self.layout.get(key) or self.results[top].plan
            for s in (members if top != old else new):
                plan = self.results[s].plan
                offsets = [b.offset for b in plan.buffers]
                if (s == top and key not in self.layout) or offsets == [b.offset for b in big.buffers]:
                    self.misfits.pop(s, None)
                    continue   # compiled repeating the largest's choices: at its layout already
                why = layout_misfit(plan, big, move=True)
                if why is not None:   # its own layout: at run time a structure of its own (shared_exec.py)
                    self.misfits[s] = f"{s} keeps its own arena layout ({why} at {top})"
                else:
                    self.misfits.pop(s, None)
                if [b.offset for b in plan.buffers] != offsets:
                    self.docs[s] = _document(plan, self.kernels.kernels)


    def widen(self, derived_needs: dict) -> bool:
        """Each structure's layout widened where a buffer of one of its sizes (compiled, or derived:
        derived_needs, structure key -> bytes per buffer) needs more bytes than its largest's layout
        gives it (shared_layout.widened), and its compiled plans moved to it. -> whether any was."""
        changed = False
        room = max(r.plan.arena_bytes for r in self.results.values())   # the arena every size runs in
        for key, top in self.largest.items():
            members = self.members[key]
            needs = [max(self.results[s].plan.buffers[i].nbytes for s in members) if b.space == "arena" else None
                     for i, b in enumerate(self.results[top].plan.buffers)]
            for i, n in enumerate(derived_needs.get(key, ())):
                if n is not None and needs[i] is not None:
                    needs[i] = max(needs[i], n)
            union = widened(self.layout.get(key) or self.results[top].plan, needs, room)
            if union is None:
                continue
            self.layout[key], changed = union, True
            self.widened[key] = union.arena_bytes - self.results[top].plan.arena_bytes
            for s in members:
                plan = self.results[s].plan
                offsets = [b.offset for b in plan.buffers]
                why = layout_misfit(plan, union, move=True)
                if why is not None:
                    self.misfits[s] = f"{s} keeps its own arena layout ({why} at {top}, widened)"
                else:
                    self.misfits.pop(s, None)
                if [b.offset for b in plan.buffers] != offsets:   # a storage grown in place moves none
                    self.docs[s] = _document(plan, self.kernels.kernels)
        return changed


def compile_range(compile_one: Callable, sizes: list, shapes_of: Callable, weights, kernels, jobs, say,
                  derived_result: Callable, as_formulas: bool = False, floors: list = ()) -> tuple:
    """sizes: every size of the range (tuples, one value per dim), in bucket order. compile_one(ishapes,
    weights, kernels, like) -> BucketResult; shapes_of(size) -> its input shapes; derived_result(plan,
    size) -> the BucketResult of a derived plan; as_formulas: derived sizes may be stored as their
    structure's formulas (compiler/families.py). -> ({size: BucketResult} of the sizes stored as plans, in
    bucket order, RangeCompile: report.families holds the rest). The plans come back at their
    structure's arena layout (shared_layout.py). floors: the model's floors of the dims (floor_dims.py),
    variables of every formula beside the dims."""
    with frozen_heap():   # its compiled plans, millions of objects, kept from every collection until it ends
        return _compile_sampled(compile_one, sizes, shapes_of, weights, kernels, jobs, say, derived_result, as_formulas,
                              floors)


def _compile_sampled(compile_one, sizes, shapes_of, weights, kernels, jobs, say, derived_result, as_formulas, floors):
    ranges = [(min(s[d] for s in sizes), max(s[d] for s in sizes)) for d in range(len(sizes[0]))]
    done = _Compiles(compile_one, shapes_of, {s: i for i, s in enumerate(sizes)}, weights, kernels, jobs, say,
                     floors)
    report = RangeCompile(sizes=len(sizes))
    rng = random.Random(0)
    top = Box(tuple(tuple(range(lo, hi + 1)) for lo, hi in ranges)).top

    def key_at(scan):   # repeating the largest size's choices: a structure differs where they cannot carry over
        done.add([top])
        done.add(scan, like={s: top for s in scan})
        return [done.docs[s].key for s in scan]
    queue, settled = initial_boxes(ranges, key_at), []
    per_dim = [len({b.axes[d] for b in queue}) for d in range(len(ranges))]
    say(f"range: {len(queue)} boxes, {' x '.join(map(str, per_dim))} classes of the dims' values")
    scope = None   # the structures whose derived sizes a round checks: all at first, then those of re-probed boxes
    for round_ in range(ROUNDS):
        probed = probe(queue, done)
        settled += probed
        if round_:   # the other structures' boxes and compiled sizes are the ones their checks passed on
            scope = {done.docs[b.top].key for b in probed}
        queue = []
        fit_of, _ = _fits(done, settled, report)
        derivable = [s for s in sizes if s not in done.results and not coincident(s)
                     and (scope is None or s in fit_of and fit_of[s][1] in scope)]
        checks = rng.sample(derivable, min(max(CHECKS, len(derivable) // CHECK_ONE_IN), len(derivable)))
        if not checks:
            break
        done.phase = "check"
        done.add(checks, like=likes(settled))
        done.share_layouts()
        report.checked += len(checks)
        wrong = {s for s in checks if not _derives(fit_of[s], done.docs[s], s)}
        if not wrong:
            break
        bad = [b for b in settled if any(m in wrong for m in b.members())]
        settled = [b for b in settled if b not in bad]
        if round_ == ROUNDS - 1:   # still wrong after the last split: those boxes compiled whole
            done.phase = "compile whole"
            done.add([m for b in bad for m in b.members()], like=likes(bad))
        else:
            queue = [h for b in bad for h in b.halves()]
        say(f"range: {len(wrong)} of {len(checks)} checked sizes differ from their derived plans; "
            f"{len(bad)} box(es) {'split' if queue else 'compiled whole'}")
    done.phase = "coincident"
    done.add([s for s in sizes if coincident(s)], like=likes(settled))
    fit_of, evidence = _fits(done, settled, report)
    if done.widen(_derived_needs(fit_of)):   # every size of a structure at one layout: fitted again on it
        fit_of, evidence = _fits(done, settled, report)
    largest = _largest_plans(done)
    liked = likes(settled)
    families, as_plans = _families(fit_of, evidence, largest, weights.size, rng, sizes, report, done.floors) \
        if as_formulas \
        else ([], None)
    stored = {}
    for fam in families:   # its spot members first: one that fails its checks and the family is stored plan by plan
        derived = _derived_plans({s: fit_of[s] for s in fam.spots}, largest, kernels, weights.size)
        if any(p is None for p in derived.values()):
            as_plans |= set(fam.sizes + fam.spots)
            report.not_families.append(f"{len(fam.sizes) + len(fam.spots)} sizes from {fam.sizes[0]}: a spot size "
                                       "failed its checks")
            continue
        stored.update((s, derived_result(p, s)) for s, p in derived.items())
        report.families.append(fam)
    rest = [s for s in sizes if s not in done.results and (as_plans is None or s in as_plans)]
    redo = []
    for s, plan in _derived_plans({s: fit_of[s] for s in rest}, largest, kernels, weights.size).items():
        if plan is None:   # past its largest compiled size's bytes, or failing the checks: compiled after all
            redo.append(s)
        else:
            stored[s] = derived_result(plan, s)
    done.phase = "redo a derivation"
    done.add(redo, like=liked)
    for s, r in done.results.items():   # as the derived plans of its structure are (the runtime groups plans by template)
        _without_reports(r.plan)
        stored.setdefault(s, r)
    report.derived = len(sizes) - len(done.results)
    results = {s: stored[s] for s in sizes if s in stored}
    report.compiled = len(done.results)
    report.misfits = [done.misfits[s] for s in sizes if s in done.misfits]
    report.widened = {k: v for k, v in done.widened.items() if k in done.layout}
    report.structures = len({d.key for d in done.docs.values()})
    report.seconds = time.perf_counter() - done.t0
    report.phases = done.phases
    return results, report


def _families(fit_of: dict, evidence: dict, largest: dict, weight_bytes: int, rng, sizes: list,
              report: RangeCompile, floors: list) -> tuple:
    """-> (RangeFamily per structure part whose derived sizes may be stored as formulas, the derived
    sizes to store as plans); why the others are not, in report.not_families."""
    groups: dict = {}
    for s in sizes:
        if s in fit_of:
            fit, key = fit_of[s]
            groups.setdefault(id(fit), (fit, key, []))[2].append(s)
    families, as_plans = [], []
    for fit, key, members in groups.values():
        fam = form_family(key, fit, members, evidence[id(fit)], largest[key], weight_bytes, rng, floors)
        if isinstance(fam, str):
            as_plans += members
            report.not_families.append(f"{len(members)} sizes from {members[0]}: {fam}")
        else:
            families.append(fam)
    return families, set(as_plans)


def derive_sizes(fam, kernels, weight_bytes: int) -> dict:
    """A family's members (compiler/families.py) as plans: {size: plan}. Each passed its family's checks
    on the numbers; one that fails a plan's is an internal error, not a plan stored wrong."""
    plans = _derived_plans({s: (fam.fit, fam.key) for s in fam.sizes}, {fam.key: fam.largest}, kernels, weight_bytes)
    bad = [s for s, p in plans.items() if p is None]
    if bad:
        raise AssertionError(f"sizes {bad[:4]} passed their family's checks but not a derived plan's")
    return plans


def _derived_plans(fit_of: dict, largest: dict, kernels, weight_bytes: int) -> dict:
    """size -> its derived plan (its kernels added to the store), or None where it fails _derive's checks."""
    return {s: _derive(doc, kernels, largest[fit_of[s][1]], weight_bytes) for s, doc in _derived_documents(fit_of)}


def _fits(done: _Compiles, settled: list, report: RangeCompile) -> tuple:
    """Step 3: -> ({size not compiled: ((NumberFit, floats), structure key)}, {id(fit): the compiled sizes
    it was fitted over}). A structure's formulas are
    fitted over its compiled sizes; where none fit them all, the structure is cut where a number steps,
    found by bisection over its compiled sizes, and each side fitted on its own; where no one step
    explains it, each of its boxes is, then halves of them; a small box with numbers no formula fits
    is compiled whole. The parts are worked in waves, each wave's compiles made together."""
    done.share_layouts()
    groups: dict = {}
    for b in settled:
        groups.setdefault(done.docs[b.top].key, []).append(b)
    work = list(groups.items())
    out, evidence, report.whole = {}, {}, []
    while work:
        work = [(key, boxes) for key, boxes in work
                if not all(m in done.results for b in boxes for m in b.members())]
        _fill(done, work)
        nxt, whole = [], []
        for key, boxes in work:
            sizes = _inside(done, boxes, key)
            fit = _fit(done, sizes)
            if isinstance(fit, str):
                sides = _split_at_step(boxes, sizes, done)
                if sides is not None:
                    nxt += [(key, side) for side in sides]
                elif len(boxes) > 1:
                    nxt += [(key, [b]) for b in boxes]
                elif boxes[0].count > 2 * BOX_FIT_SIZES:
                    nxt += [(key, [h]) for h in boxes[0].halves()]
                else:
                    report.whole.append(f"{boxes[0].count} sizes from {boxes[0].top} down ({fit})")
                    whole.append(boxes[0])
                continue
            evidence[id(fit)] = sizes
            for b in boxes:
                for m in b.members():
                    if m not in done.results:
                        out[m] = (fit, key)
        done.phase = "compile whole"
        done.add([m for b in whole for m in b.members()], like=likes(whole))
        work = nxt
    return out, evidence


def _inside(done: _Compiles, boxes: list, key: str) -> list:
    """The boxes' compiled sizes of their structure."""
    return [m for b in boxes for m in b.members() if m in done.results and done.docs[m].key == key]


def _fill(done: _Compiles, work: list):
    """Each part's compiled sizes of its structure made at least BOX_FIT_SIZES where it has as many,
    and spanning it (formulas.py spans): more compiled, drawn from it, all parts' compiles together."""
    more, like = [], {}
    for key, boxes in work:
        inside = _inside(done, boxes, key)
        every = [m for b in boxes for m in b.members()]
        if len(inside) < BOX_FIT_SIZES or not spans(inside, every, done.floors):
            # drawn, not strided: a stride that is a multiple of a dim's alignment would show a
            # round-up as a polynomial (every drawn size one remainder)
            pool = [m for m in every if m not in done.results and not coincident(m)]
            more += random.Random(len(every)).sample(pool, min(len(pool), BOX_FIT_SIZES))
            like.update(likes(boxes))
    done.phase = "fit"
    done.add(more, like=like)
    done.share_layouts()


def _split_at_step(boxes: list, sizes: list, done: _Compiles) -> list | None:
    """Where the sizes stop fitting one formula, going down from the largest along the dim with the
    most values: -> [the boxes below, the boxes from there up] (a box across it cut), or None where
    no such value is found (or no size of the structure is compiled inside them: Wav2Vec2's samples,
    whose boxes' halves may hold only sizes of other structures)."""
    if not sizes:
        return None
    d = max(range(len(sizes[0])), key=lambda i: len({m[i] for m in sizes}))
    starts = sorted({m[d] for m in sizes})

    def fits_from(v):
        upper = [m for m in sizes if m[d] >= v]
        return len(upper) >= MIN_FIT_SIZES and not isinstance(_fit(done, upper), str)
    good, bad = len(starts), -1   # sizes from starts[good] up fit (none for len); from starts[bad] not
    while good - bad > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits_from(starts[mid]) else (good, mid)
    if good in (0, len(starts)):
        return None
    below, above = [], []
    for b in boxes:
        k = bisect.bisect_left(b.axes[d], starts[good])
        if k == 0:
            above.append(b)
        elif k == len(b.axes[d]):
            below.append(b)
        else:
            low, high = b.split_at(d, k)
            below.append(low)
            above.append(high)
    return [side for side in (below, above) if side]


def _fit(done: _Compiles, sizes: list):
    """-> (NumberFit, floats) of the sizes' documents (one structure's), or why there is none."""
    docs = done.docs
    if len(sizes) < MIN_FIT_SIZES:
        return f"{len(sizes)} compiled size(s)"
    floats = docs[sizes[0]].floats
    if any(docs[s].floats != floats for s in sizes):
        return "a fractional number that differs between sizes"
    fit = fit_numbers(np.array(sizes), np.array([docs[s].ints for s in sizes], np.int64).reshape(len(sizes), -1),
                      done.floors)
    if not fit.complete:
        return f"{sum(x is None for x in fit.slots)} numbers follow no formula"
    return fit, floats


def _derives(fit_key: tuple, doc: Compiled, size: tuple) -> bool:
    """A checked size's compiled document is its structure's, with the formulas' numbers."""
    (nf, floats), key = fit_key
    return doc.key == key and doc.floats == floats and nf.numbers(np.array([size]))[0].tolist() == doc.ints


def _largest_plans(done: _Compiles) -> dict:
    """structure -> the layout its sizes share: its largest compiled size's plan, widened where it was."""
    done.share_layouts()
    return {key: done.layout.get(key) or done.results[s].plan for key, s in done.largest.items()}


def _derived_needs(fit_of: dict) -> dict:
    """structure key -> per buffer, the most bytes its derived sizes give it (None: a weight buffer)."""
    groups: dict = {}
    for s, (fit, key) in fit_of.items():
        groups.setdefault(id(fit), (fit, key, []))[2].append(s)
    out: dict = {}
    for fit, key, members in groups.values():
        needs = buffer_needs(key, fit, members)
        have = out.setdefault(key, needs)
        if have is not needs:
            out[key] = [None if a is None else max(a, b) for a, b in zip(have, needs)]
    return out
