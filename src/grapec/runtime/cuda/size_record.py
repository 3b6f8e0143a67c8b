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
Before a bucket runs, where another bucket's numbers are in place, one device-to-device copy writes
its record (from a table of every bucket's, uploaded once) and one per constant writes its constants
(`load`), all on the runner's stream, ordered after the run in flight and before the launch; the host
does not wait for anything.
"""
from __future__ import annotations

import numpy as np

from ...plan import KernelStep
from .driver import call


class SizedGroup:
    """The sized steps of one launch structure's buckets and the device memory their numbers live in."""

    def __init__(self):
        self.slots: dict = {}       # position -> (offset into the record, values, largest grid)
        self.constants: dict = {}   # buffer name -> region size in bytes
        self.rows: dict = {}        # bucket -> its row of the table
        self.table = 0              # device pointer: every bucket's record, a row each
        self.row_bytes = 0
        self.places: dict = {}      # bucket -> [(buffer name, weight offset, nbytes)] of its constants
        self.record = 0             # device pointer of the record
        self.regions: dict = {}     # buffer name -> device pointer
        self.holder = None          # the bucket whose numbers are in place


class SizeRecords:
    """The runner's sized groups, by graph shape. Only for bundles whose merged functions have sized
    twins (manifest cuda "sized"); GRAPEC_SIZE_RECORDS=0 leaves every node's numbers in the node."""

    def __init__(self, runner):
        import os
        self.r = runner
        cuda = runner.bundle.manifest.get("cuda") or {}
        self.names = cuda.get("kernels") or []
        self.sized = set(cuda.get("sized") or []) if os.environ.get("GRAPEC_SIZE_RECORDS", "1") != "0" else set()
        self.groups: dict = {}      # launch structure -> SizedGroup
        self._functions: dict = {}
        self.copies = 0             # copies made by load(), in all

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
        members = [b for b in range(len(r.bundle.plans)) if r.structure_of(b) == key]
        if len(members) < 2:   # one size: nothing to switch between
            return g
        plans = {b: r.bundle.plans[b] for b in members}
        offset = 0
        for p, steps in enumerate(zip(*(plans[b].steps for b in members))):
            if not all(isinstance(st, KernelStep) for st in steps):
                continue
            kernels = [st.kernel for st in steps]
            if len({self.names[k] for k in kernels}) != 1 or self.names[kernels[0]] not in self.sized:
                continue
            if len({r.launches[k][2] for k in kernels}) != 1:   # the block size must agree
                continue
            constants = self._constants(plans, members, steps)
            if constants is None:
                continue
            for name, nbytes in constants.items():
                g.constants[name] = max(g.constants.get(name, 0), nbytes)
            n = len(r.scalars[kernels[0]]) + 1
            g.slots[p] = (offset, n, max(r.launches[k][1] for k in kernels))
            offset += n
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
        g.row_bytes = 8 * offset
        g.regions = {name: r.dev.alloc(nbytes, "a per-size constant's region") for name, nbytes in g.constants.items()}
        return g

    @staticmethod
    def _constants(plans: dict, members: list, steps) -> dict | None:
        """{buffer name: largest bytes} of the step's per-size constants (weights at another offset in
        some bucket); None where another of its buffers moves (an arena offset: not sized)."""
        out = {}
        for j in range(1 + len(steps[0].args)):
            bufs = [plans[b].buffers[([st.out] + list(st.args))[j]] for b, st in zip(members, steps)]
            if len({(x.space, x.offset) for x in bufs}) == 1:
                continue
            if len({x.name for x in bufs}) != 1 or any(x.space != "weight" for x in bufs):
                return None
            out[bufs[0].name] = max(x.nbytes for x in bufs)
        return out

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

    # --- running ---------------------------------------------------------------------------------
    def load(self, bucket: int) -> bool:
        """Put the bucket's numbers and constants in place (on the runner's stream). -> whether it copied."""
        g = self.group(bucket)
        if not g.slots or g.holder == bucket:
            return False
        # from the table on the device: a copy from pageable host memory could wait for the stream
        call("cuMemcpyDtoDAsync", g.record, g.table + g.rows[bucket] * g.row_bytes, g.row_bytes, self.r.stream)
        for name, offset, nbytes in g.places[bucket]:
            call("cuMemcpyDtoDAsync", g.regions[name], self.r.weights + offset, nbytes, self.r.stream)
        g.holder = bucket
        self.copies += 1 + len(g.places[bucket])
        return True

    def close(self):
        for g in self.groups.values():
            for ptr in (g.record, g.table):
                self.r.dev.free(ptr)
            for ptr in g.regions.values():
                self.r.dev.free(ptr)
        self.groups.clear()
