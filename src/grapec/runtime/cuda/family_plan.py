"""How a range family's sizes run on the GPU without a plan per size (issue 33: Grape's metadata, compressed).

A family (bundle/families.py) holds the sizes of one launch structure as formulas: Wav2Vec2 over samples
1600..160000 keeps 152823 of its 158401 sizes so. The shared execs of shared_exec.py join every size's plan
at load and keep a row of numbers per size; at that count both cost hours and hundreds of MiB. So a large
family runs from its formulas alone (family_exec.py), one exec per band of sizes (shared_exec.size_band),
and this module works out, on the host and without a GPU, how each of its steps runs there:

    a kernel step      its function's sized twin (codegen/module.py), its numbers read from a record that the
                       exec's first node computes from the size's dims (codegen/size_program.py EVAL_SIZES),
                       its grid the band's largest;
    a library step     "fixed" where no number of it differs between sizes; "widest" where only the rows
                       of a GEMM, or the length of a convolution whose rows lie contiguous and whose end is not
                       padded, differ: it runs at the band's widest, which computes every size's rows exactly
                       (shared_exec.widest_gemm says why; a convolution's output row reads input rows before
                       its own end only); "variant" otherwise: one node per distinct shape among the band's
                       sizes, built at load, set at a switch.

A family whose steps move a buffer between sizes (a per-size constant), whose library attributes differ
between sizes, or whose kernels have no sized twin, cannot run so: `reason` says why, and its sizes take the
shared execs' way (every plan joined at load).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from ...bundle.families import BufferTable, numbered_template, sizes_io
from .shared_exec import even_bands, family_blocks
from .size_record import family_kernels, family_launch_slots, family_record_program

CHUNK = 4096   # members whose numbers are evaluated at once (a family may hold 10^5)
# members of a family from which it runs from its formulas. A size that joins its plan instead builds its graph at
# load: full Wav2Vec2's 5841 such sizes took about 82 ms each on an H200 (8 minutes), against 1.6-7.6 s for a
# band's exec (benchmarks/results/2026-11-28-wav2vec2-siblings): from a few hundred members, formulas load faster.
FAMILY_EXEC_MIN = 256


def least_members() -> int | None:
    """GRAPEC_FAMILY_EXECS: the least members of a family that runs from its formulas ("0": none runs so, None;
    "all": every family; a number; default FAMILY_EXEC_MIN)."""
    mode = os.environ.get("GRAPEC_FAMILY_EXECS", "auto")
    if mode == "0":
        return None
    return 2 if mode == "all" else int(mode) if mode.isdigit() else FAMILY_EXEC_MIN


@dataclass
class LibraryForm:
    """How one library step of a family runs in its band execs."""
    kind: str       # "fixed" | "widest" | "variant"
    shapes: list    # per buffer (the output, then the arguments; None for an absent argument): its shape's slots
    rows: bool = False   # a "widest" GEMM whose leading dims differ too: run as one GEMM over all its rows


@dataclass
class FamilyPlan:
    family: object          # bundle/families.py Family
    sized: list             # kernel positions run as sized twins (sorted: the record's order); the others' launch
    #                         is the same at every size
    library: dict           # position -> LibraryForm
    blocks: np.ndarray      # per member: the blocks its kernels launch in all
    bands: np.ndarray       # per member: its band (shared_exec.even_bands)
    # members: the family's sizes, then its also-buckets (stored plans that its formulas give: `sizes`, `buckets`)
    reason: str | None      # why the family cannot run from its formulas; None where it can
    # per-size constants (weights at another offset at each size, read by sized kernels only): buffer name ->
    # (the slots of its offset and bytes); an exec reads each from a region of its own, copied at a switch
    constants: dict = field(default_factory=dict)

    def numbers(self, members, slots: list) -> np.ndarray:
        """members x slots: the plan formulas' numbers."""
        return _numbers(self.family.plan.fit, self.sizes[np.asarray(members)], slots)

    def places(self, name: str, members) -> tuple:
        """(weight offsets, bytes) of a per-size constant at these members."""
        got = self.numbers(members, list(self.constants[name]))
        return got[:, 0], got[:, 1]

    def members(self, band: int) -> np.ndarray:
        return np.nonzero(self.bands == band)[0]

    def origin(self, members: np.ndarray) -> int:
        """The member an exec of these members is built from: the one that launches the most blocks."""
        return int(members[np.argmax(self.blocks[members])])

    def grids(self, members: np.ndarray) -> dict:
        """position -> the largest grid of its kernel among these members."""
        local, launch = family_kernels(self.family), family_launch_slots(self.family)
        slots = [launch[local[p]][0] for p in self.sized]
        big = _numbers(self.family.cuda.fit, self.sizes[members], slots).max(axis=0)
        return {p: int(g) for p, g in zip(self.sized, big)}

    def shapes(self, position: int, members) -> np.ndarray:
        """members x dims: the shapes of the step's buffers, flattened (form.shapes' order)."""
        flat = [s for shape in self.library[position].shapes if shape for s in shape]
        return self.numbers(members, flat)

    def unflatten(self, position: int, row) -> tuple:
        """A flattened shapes row -> (argument shapes, output shape), as GraphBuilder takes them."""
        out, at = [], 0
        for shape in self.library[position].shapes:
            if shape is None:
                out.append(None)
                continue
            out.append([int(v) for v in row[at:at + len(shape)]])
            at += len(shape)
        return out[1:], out[0]

    def widest(self, position: int, members: np.ndarray) -> tuple:
        """(argument shapes, output shape) of a "widest" step at these members' largest: each dim's largest, or
        for a GEMM over rows (LibraryForm.rows), each row operand as [1.., the most rows, its last dim]."""
        form = self.library[position]
        table = self.shapes(position, members)
        if not form.rows:
            return self.unflatten(position, table.max(axis=0))
        out, at = [], 0
        for i, shape in enumerate(form.shapes):
            if shape is None:
                out.append(None)
                continue
            block = table[:, at:at + len(shape)]
            at += len(shape)
            if i in (2, 4):   # the weight, the bias: as they are
                out.append([int(v) for v in block[0]])
            else:        # A, the output, C: its rows (all dims but the last) flattened, the most of them
                rows = int(np.prod(block[:, :-1], axis=1).max())
                out.append([1] * (len(shape) - 2) + [rows, int(block[0, -1])])
        return out[1:], out[0]

    def variants(self, position: int, members: np.ndarray) -> tuple:
        """(the distinct shapes rows of a "variant" step among these members, each member's row number)."""
        rows, which = np.unique(self.shapes(position, members), axis=0, return_inverse=True)
        return rows, which.reshape(-1)

    def record_program(self) -> np.ndarray:
        return family_record_program(self.family, self.sized)

    def io(self) -> dict:
        """sizes_io of every member, in chunks: {"inputs"|"outputs": [(name, BufferTable)]}."""
        chunks = [sizes_io(self.family, self.sizes[lo:lo + CHUNK]) for lo in range(0, len(self.sizes), CHUNK)]
        return {side: [(name, BufferTable.joined([c[side][j][1] for c in chunks]))
                       for j, (name, _) in enumerate(rows)] for side, rows in chunks[0].items()}

    @property
    def sizes(self) -> np.ndarray:
        """Every member's sizes: the family's, then its also-buckets' (bundle/families.py Family.also)."""
        return self.family.all_sizes

    @property
    def buckets(self) -> list:
        return self.family.all_buckets


def _numbers(fit, sizes: np.ndarray, slots: list) -> np.ndarray:
    out = np.empty((len(sizes), len(slots)), np.int64)
    for lo in range(0, len(sizes), CHUNK):
        out[lo:lo + CHUNK] = fit.numbers(sizes[lo:lo + CHUNK], slots)
    return out


def plan_family(family, sized_functions: set) -> FamilyPlan:
    """How the family's steps run from its formulas (module docstring)."""
    plan_t = numbered_template(family.plan.template)["plan"]
    fit = family.plan.fit
    sized, library, reason, constants, readers = [], {}, None, {}, set()
    if family.cuda is None:
        reason = "the bundle has no GPU code for it"
    local = family_kernels(family) if reason is None else {}
    rows = numbered_template(family.cuda.template) if reason is None else []
    for p, st in enumerate(plan_t["steps"]):
        if reason is not None:
            break
        moved = _moved(fit, plan_t["buffers"], [st["out"]] + list(st["args"]))
        if moved and (st["op"] != "kernel" or any(row[1] != "weight" for row in moved)):
            reason = (f"step {p} reads or writes '{moved[0][0]}' at an offset that differs between sizes"
                      + (" (a per-size constant, read by a library call)" if moved[0][1] == "weight" else ""))
        elif st["op"] == "kernel":
            for row in moved:   # a per-size constant (a weight at another offset at each size): read from a region
                constants[row[0]] = (row[2], row[3])
                readers.add(p)
            function, launch = rows[local[p]][0], rows[local[p]][1]
            numbers = _ints(launch) + _ints(rows[local[p]][2])   # grid, block, split; the scalars' slots
            if function not in sized_functions:
                # no twin: the same function at every size; it runs as it is where its launch is the same too
                if any(family.cuda.fit.constant(j) is None for j in numbers):
                    reason = f"step {p}'s kernel {function} has no sized twin and launches otherwise at some sizes"
            elif family.cuda.fit.constant(launch[2]) is None:
                reason = f"step {p}'s kernel {function} takes another block size at some sizes"
            else:
                sized.append(p)
        elif st["op"] == "library":
            if any(fit.constant(j) is None for j in _ints(st["attrs"])):
                reason = f"step {p} ({st['attrs'].get('op')}) has attributes that differ between sizes"
            else:
                library[p] = _library_form(fit, plan_t["buffers"], st)
        else:
            reason = f"step {p} is a {st['op']} step (a family runs kernel and library steps only)"
    if reason is None and readers - set(sized):   # a kernel without a twin points at one size's bytes
        reason = f"step {min(readers - set(sized))} reads a per-size constant but its kernel has no sized twin"
    sizes = family.all_sizes
    blocks = family_blocks(family, sizes) if reason is None else np.zeros(len(sizes), np.int64)
    return FamilyPlan(family, sized, library, blocks, even_bands(blocks), reason, constants)


def _ints(x) -> list:
    """The slot numbers in a numbered template's JSON value."""
    if isinstance(x, bool):
        return []
    if isinstance(x, int):
        return [x]
    if isinstance(x, list):
        return [j for v in x for j in _ints(v)]
    if isinstance(x, dict):
        return [j for v in x.values() for j in _ints(v)]
    return []


def _buffer(fit, buffers: list, index_slot: int):
    """A buffer row of the numbered template (name, space, offset, nbytes, dtype, shape, *pitch), or None."""
    index = fit.constant(index_slot)
    if index is None or index < 0:
        return None
    return buffers[index]


def _moved(fit, buffers: list, bufs: list) -> list:
    """The rows (numbered template) of these buffers whose offset differs between sizes."""
    rows = [_buffer(fit, buffers, j) for j in bufs]
    return [row for row in rows if row is not None and fit.constant(row[2]) is None]


def _library_form(fit, buffers: list, st: dict) -> LibraryForm:
    shapes = []
    for j in [st["out"]] + list(st["args"]):
        row = _buffer(fit, buffers, j)
        shapes.append(list(row[5]) if row is not None else None)
    varying = [[fit.constant(s) is None for s in shape] if shape else [] for shape in shapes]
    if not any(any(v) for v in varying):
        return LibraryForm("fixed", shapes)
    values = [[fit.constant(s) for s in shape] if shape else [] for shape in shapes]
    op = st["attrs"].get("op")
    if op == "matmul" and not st["attrs"].get("views") and _rows_vary(values, varying):
        return LibraryForm("widest", shapes)
    if op == "matmul" and _over_rows(fit, buffers, st, values, varying):
        return LibraryForm("widest", shapes, rows=True)
    if op == "conv" and _length_varies(values, varying, [fit.constant(j) for j in st["attrs"]["pads"]]):
        return LibraryForm("widest", shapes)
    return LibraryForm("variant", shapes)


def _rows_vary(values: list, varying: list) -> bool:
    """Only the rows (dim -2) of a GEMM's buffers differ between sizes, their leading dims all 1."""
    for vals, var in zip(values, varying):
        if any(var[:-2]) or (var and var[-1]):
            return False
        if any(v != 1 for v in vals[:-2]):
            return False
        if any(var) and len(vals) < 2:
            return False
    return True


def _over_rows(fit, buffers: list, st: dict, values: list, varying: list) -> bool:
    """A GEMM of a 2-D weight whose other operands differ in their leading dims and rows (a 2-D range's
    [batch, seq, K]), dense, A not transposed: one GEMM over all their rows flattened computes each row from
    that row of A alone, so the widest member's rows cover every member's, laid out as its own."""
    attrs = st["attrs"]   # numbered: each number is a slot, constant over the family (plan_family checked)
    if attrs.get("views") or ("trans_a" in attrs and fit.constant(attrs["trans_a"]) != 0):
        return False
    if len(values) < 3 or len(values[2]) != 2 or any(varying[2]):   # the weight: 2-D, fixed
        return False
    for i, (vals, var) in enumerate(zip(values, varying)):   # the output, A, the weight, C, the bias
        if i in (2, 4) or not vals:
            continue
        if len(vals) < 2 or var[-1]:
            return False
    for j in [st["out"]] + list(st["args"]):   # dense: no padded rows
        row = _buffer(fit, buffers, j)
        if row is not None and len(row) > 6 and fit.constant(row[6]) != 0:
            return False
    return True


def _length_varies(values: list, varying: list, pads: list) -> bool:
    """A convolution (x [N,H,W,C], w, bias, residual: conv's NHWC) whose x, output and residual differ in
    their outermost spatial dim only, batch 1, that dim's end not padded: its rows then lie as a prefix
    of the widest size's, and each output row reads input rows before its own end only."""
    if any(pads[i] is None for i in range(4)):
        return False
    for i, (vals, var) in enumerate(zip(values, varying)):
        if not any(var):
            continue
        if i == 2 or len(vals) != 4 or vals[0] != 1 or var[0] or var[3]:   # the weight never varies
            return False
        if var[1] and (var[2] or pads[2] != 0):        # H varies: W fixed, no padding at H's end
            return False
        if var[2] and (var[1] or vals[1] != 1 or pads[3] != 0):   # W varies: H is 1, no padding at W's end
            return False
    return True


@dataclass
class RangeOnGpu:
    """How a range's sizes run on the CUDA backend (`grapec compile` and `grapec inspect` say it)."""
    sizes: int                  # all of the range's
    from_formulas: int = 0      # sizes run by family execs (members and also-buckets)
    execs: int = 0              # family execs: bands of those families
    variants: int = 0           # library nodes built per shape at load
    least: int | None = None    # least_members()
    reasons: list = field(default_factory=list)   # (members, first size, why) of large families that cannot

    def text(self) -> str:
        if self.least is None:
            return f"range on the GPU: GRAPEC_FAMILY_EXECS=0: all {self.sizes} sizes join a plan each at load"
        out = (f"range on the GPU: {self.from_formulas} sizes in families of at least {self.least} run from their "
               f"formulas ({self.execs} execs, {self.variants} shape variants built at load); "
               f"{self.sizes - self.from_formulas} sizes join a plan each at load")
        return out + "".join(f"; a family of {n} sizes from {first}: {why}" for n, first, why in self.reasons)


def range_on_gpu(families: list, sized_functions: set, sizes: int) -> RangeOnGpu:
    """RangeOnGpu of a bundle's families (bundle/families.py Family) over its `sizes` sizes in all."""
    out = RangeOnGpu(sizes, least=least_members())
    for family in families if out.least is not None else ():
        if len(family.buckets) < out.least:
            continue
        fp = plan_family(family, sized_functions)
        if fp.reason is not None:
            out.reasons.append((len(family.buckets), tuple(int(v) for v in family.sizes[0]), fp.reason))
            continue
        out.from_formulas += len(fp.buckets)
        for band in sorted(set(fp.bands.tolist())):
            out.execs += 1
            members = fp.members(band)
            out.variants += sum(len(fp.variants(p, members)[0]) for p, form in fp.library.items() if form.kind == "variant")
    return out
