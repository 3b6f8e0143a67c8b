"""The sizes of a launch structure in device memory (Grape's metadata, read on the device): what lets
one graph node serve every size of a structure, so that a switch between sizes copies numbers
instead of updating nodes (issue 33).

For the buckets of one launch structure (the runner's structure_of: a plan template and a graph
shape; compiler/shared_layout.py gives them the same arena offsets), a kernel step runs as its
function's sized twin (codegen/module.py sized_twin) wherever, in all of them, it runs the same
merged function with the same block, and reads and writes the same bytes or the same per-size
constant. Then its node is the same in every bucket:
    - the twin reads its size arguments and its grid from a record in device memory; the node's
      grid is the largest any bucket needs, and blocks past the bucket's own grid return at once;
    - a per-size constant (a causal mask, a position table, folded at compile time: weights at
      another offset in every size) is read from a region of this runner's, into which the
      bucket's bytes are copied.
Every bucket's record is a row of a table on the device, uploaded once. The first node of a shared
exec is a loader (codegen/control.py LOAD_SIZES) that copies the running bucket's row into the
record and its constants into their regions, every launch; the sized nodes wait for it. A switch
between sizes repoints that one node at another bucket's copy list (shared_exec.py): one per-node
update, whatever the number of sized nodes.
"""
from __future__ import annotations

import numpy as np

from ...plan import KernelStep


def sized_steps(bundle, plans: dict, sized: set) -> tuple:
    """plans: bucket -> plan, the buckets of one launch structure. -> ({position: (offset into the record,
    values, largest grid)}, {per-size constant's buffer name: largest bytes}): the kernel steps that run
    the same merged function (one with a sized twin) with the same block in every bucket, and read and
    write the same bytes or the same per-size constant."""
    cuda = bundle.manifest["cuda"]
    names, launches, scalars = cuda["kernels"], cuda["launch"], cuda["scalars"]
    members = list(plans)
    slots, constants, offset = {}, {}, 0
    for p, steps in enumerate(zip(*(plans[b].steps for b in members))):
        if not all(isinstance(st, KernelStep) for st in steps):
            continue
        kernels = [st.kernel for st in steps]
        if len({names[k] for k in kernels}) != 1 or names[kernels[0]] not in sized:
            continue
        if len({launches[k][2] for k in kernels}) != 1:   # the block size must agree
            continue
        moved = _constants(plans, members, steps)
        if moved is None:
            continue
        for name, nbytes in moved.items():
            constants[name] = max(constants.get(name, 0), nbytes)
        n = len(scalars[kernels[0]]) + 1
        slots[p] = (offset, n, max(launches[k][1] for k in kernels))
        offset += n
    return slots, constants


def _constants(plans: dict, members: list, steps) -> dict | None:
    """{buffer name: largest bytes} of the step's per-size constants (weights at another offset in some
    bucket); None where another of its buffers moves (an arena offset: not sized)."""
    out = {}
    for j in range(1 + len(steps[0].args)):
        bufs = [plans[b].buffers[([st.out] + list(st.args))[j]] for b, st in zip(members, steps)]
        if len({(x.space, x.offset) for x in bufs}) == 1:
            continue
        if len({x.name for x in bufs}) != 1 or any(x.space != "weight" for x in bufs):
            return None
        out[bufs[0].name] = max(x.nbytes for x in bufs)
    return out


def family_kernels(family) -> dict:
    """{position: local kernel number} of the top-level kernel steps of a family's plans (bundle/families.py:
    one template for all its members, so one member's document tells)."""
    steps = family.document(0)["plan"]["steps"]
    return {p: st["kernel"] for p, st in enumerate(steps) if st["op"] == "kernel"}


def family_launch_slots(family) -> list:
    """Per local kernel of a family: (the slot of its grid in the family's CUDA formulas, [(scalar type,
    its slot)]), from the numbered CUDA template (rows [function, [kind, grid, block, split], scalars])."""
    from ...bundle.families import numbered_template
    return [(row[1][1], [(t, slot) for t, slot in row[2]]) for row in numbered_template(family.cuda.template)]


def family_record_program(family, positions: list) -> np.ndarray:
    """The size program (codegen/size_program.py) of a member's record at these kernel positions, laid out as
    SizeRecords lays a row: each position's scalars (an f64 as its double's bits), then its grid."""
    from ...codegen.size_program import size_program
    local, launch = family_kernels(family), family_launch_slots(family)
    slots, f64 = [], []
    for p in sorted(positions):
        grid, scalars = launch[local[p]]
        slots += [slot for _, slot in scalars] + [grid]
        f64 += [t == "f64" for t, _ in scalars] + [False]
    return size_program(family.cuda.fit, family.sizes.shape[1], slots, f64)


class SizedGroup:
    """The sized steps of one launch structure's buckets and the device memory their numbers live in."""

    def __init__(self):
        self.slots: dict = {}       # position -> (offset into the record, values, largest grid)
        self.constants: dict = {}   # buffer name -> region size in bytes
        self.rows: dict = {}        # bucket -> its row of the table
        self.table = 0              # device pointer: every bucket's record, a row each
        self.copies = 0             # device pointer: every bucket's copy list for the loader, a row each
        self.copy_bytes = 0
        self.count: dict = {}       # bucket -> copies in its list
        self.places: dict = {}      # bucket -> [(buffer name, weight offset, nbytes)] of its constants
        self.record = 0             # device pointer of the record
        self.regions: dict = {}     # buffer name -> device pointer


class SizeRecords:
    """The runner's sized groups, by launch structure. Only for bundles whose merged functions have sized
    twins (manifest cuda "sized"); GRAPEC_SIZE_RECORDS=0 leaves every node's numbers in the node."""

    def __init__(self, runner):
        import os
        self.r = runner
        cuda = runner.bundle.manifest.get("cuda") or {}
        self.names = cuda.get("kernels") or []
        self.sized = set(cuda.get("sized") or []) if os.environ.get("GRAPEC_SIZE_RECORDS", "1") != "0" else set()
        self.groups: dict = {}      # launch structure -> SizedGroup
        self._functions: dict = {}

    def group(self, bucket: int) -> SizedGroup:
        key = self.r.structure_of(bucket)
        g = self.groups.get(key)
        if g is None:
            g = self.groups[key] = self._plan_group(key)
        return g

    def _plan_group(self, key) -> SizedGroup:
        g = SizedGroup()
        if not self.sized:
            return g
        r = self.r
        members = r.members_of(key)
        if len(members) < 2:   # one size: nothing to switch between
            return g
        plans = {b: r.bundle.plans[b] for b in members}
        g.slots, g.constants = sized_steps(r.bundle, plans, self.sized)
        offset = sum(n for _, n, _ in g.slots.values())
        if not g.slots:
            return g
        rows = []
        for b in members:
            row = []
            for p in sorted(g.slots):
                k = plans[b].steps[p].kernel
                row += [int(v) if t == "i64" else int(np.float64(v).view(np.int64)) for t, v in r.scalars[k]]
                row.append(int(r.launches[k][1]))
            g.rows[b] = len(rows)
            rows.append(row)
            g.places[b] = sorted({(buf.name, buf.offset, buf.nbytes) for buf in plans[b].buffers
                                  if buf.name in g.constants and buf.space == "weight"})
        table = np.asarray(rows, np.int64)
        g.record = r.dev.alloc(8 * offset, "a launch structure's size record")
        g.table = r.dev.alloc(table.nbytes, "a launch structure's size table")
        r.dev.upload(g.table, table.ctypes.data, table.nbytes)
        g.regions = {name: r.dev.alloc(nbytes, "a per-size constant's region") for name, nbytes in g.constants.items()}
        # each bucket's copies for the loader node: its record row, then its constants
        width = 1 + len(g.constants)
        copies = np.zeros((len(members), width, 3), np.int64)
        for b in members:
            lst = [(g.record, g.table + g.rows[b] * 8 * offset, 8 * offset)]
            lst += [(g.regions[name], r.weights + off, nbytes) for name, off, nbytes in g.places[b]]
            copies[g.rows[b], :len(lst)] = lst
            g.count[b] = len(lst)
        g.copies = r.dev.alloc(copies.nbytes, "a launch structure's copy lists")
        r.dev.upload(g.copies, copies.ctypes.data, copies.nbytes)
        g.copy_bytes = 8 * 3 * width
        return g

    # --- graph building --------------------------------------------------------------------------
    def launch(self, bucket: int, position: int, st: KernelStep):
        """(function, grid, record pointer, {constant name: region}) of a sized step, or None."""
        g = self.group(bucket)
        slot = g.slots.get(position)
        if slot is None:
            return None
        name = self.names[st.kernel]
        if name not in self._functions:
            self._functions[name] = self.r.function(name + "_sized")
        offset, _, grid = slot
        return self._functions[name], grid, g.record + 8 * offset, g.regions

    def loader(self, bucket: int):
        """(function, grid, block, pointers, scalars) of the bucket's loader node (codegen/control.py
        LOAD_SIZES: its copies of the record and constants, run first in every launch), or None."""
        g = self.group(bucket)
        if not g.slots:
            return None
        from ...codegen.control import LOAD_SIZES_BLOCK, LOAD_SIZES_GRID
        return (self.r.function("grapec_load_sizes"), LOAD_SIZES_GRID, LOAD_SIZES_BLOCK,
                [g.copies + g.rows[bucket] * g.copy_bytes], [["i64", g.count[bucket]]])

    def close(self):
        for g in self.groups.values():
            for ptr in (g.record, g.table, g.copies):
                self.r.dev.free(ptr)
            for ptr in g.regions.values():
                self.r.dev.free(ptr)
        self.groups.clear()
