"""share_layouts: the plans of one launch structure place their buffers where its largest size does.

A --dynamic range compiles every size, and sizes fall into a few launch structures: plans whose JSON
differs only in numbers (bundle/templates.py stores each structure once). Within one, each size's
memory plan packs its own buffers, so their arena offsets differ from size to size in ways that
follow no formula (benchmarks/plan_numbers.py: a tenth of a GPT-2 plan's numbers). One arena of
the largest size serves every size anyway, so a smaller size loses nothing by taking the largest
size's offsets: buffer i of the structure then sits at the same bytes in every plan, and what
differs between sizes is shapes, grids and byte counts, the numbers a structure-level plan will
compute per size (issue 33).

A smaller plan takes the layout only where every arena buffer is no larger than its counterpart,
and the plan's edges still order every reuse of arena bytes (passes/hazards.py checks it); else it
keeps its own.

Some buffers are not largest at the largest size: a count of blocks' partial sums rounds up with
one dim and not the other, a position table grows with seq alone while the batch times seq is what
makes a size largest. `widened` gives such a buffer (with the views of its bytes) as many bytes as any
size of the structure needs, where it is (if no unordered reuse follows) or past the arena's end, so
that every size fits one layout.
"""
from __future__ import annotations

import json
from dataclasses import replace

from ..plan import Plan

from ..bundle.templates import split
from ..passes.hazards import unordered_conflicts
from ..passes.plan_memory import ALIGN, aligned_bytes


def share_layouts(plans: list) -> int:
    """Plans (and their order) as compiled; the smaller plans of each structure change in place.
    -> how many took their structure's layout."""
    groups: dict = {}
    for i, p in enumerate(plans):
        groups.setdefault(json.dumps(split(p.to_json())[0], separators=(",", ":")), []).append(i)
    moved = 0
    for members in groups.values():
        largest = plans[max(members, key=lambda i: buffer_bytes(plans[i]))]
        for i in members:
            if plans[i] is not largest and take_layout(plans[i], largest):
                moved += 1
    return moved


def buffer_bytes(plan) -> int:
    """The bytes of its arena buffers: what grows with the sizes of a structure. Its largest size is the
    one whose layout the others take; not the largest arena (a smaller size may pack into a larger
    one, and a larger size's buffers would not fit its layout)."""
    return sum(b.nbytes for b in plan.buffers if b.space == "arena")


def fits_slot(buf, slot) -> bool:
    """Whether buffer `buf` fits where buffer `slot` was placed: the memory planner gives each buffer its
    bytes rounded up to its alignment and places it at a multiple of that, so a buffer placed so owns
    the rounded bytes (a count of blocks' partial sums, 88 bytes at seq 161 of GPT-2 and 80 at seq 320,
    does not grow with the sizes). A view inside another buffer (at any offset) owns its bytes only."""
    if slot.offset % ALIGN:
        return buf.nbytes <= slot.nbytes
    return aligned_bytes(buf.nbytes) <= aligned_bytes(slot.nbytes)


def take_layout(plan, largest) -> bool:
    """plan's arena buffers at largest's offsets, where each fits and every reuse of bytes stays ordered
    by plan's edges. -> whether it did."""
    return layout_misfit(plan, largest, move=True) is None


def layout_misfit(plan, largest, move: bool = False) -> str | None:
    """Why plan cannot take largest's arena offsets, or None where it can (and, with move, has)."""
    if len(plan.buffers) != len(largest.buffers):
        return f"{len(plan.buffers)} buffers against {len(largest.buffers)}"
    moved = []
    for b, big in zip(plan.buffers, largest.buffers):
        if b.space != big.space or b.name != big.name:
            return f"buffer {b.name} is {big.name} there"
        if not fits_slot(b, big):
            return f"buffer {b.name} takes {b.nbytes} bytes, {big.nbytes} there"
        moved.append(replace(b, offset=big.offset) if b.space == "arena" else b)
    conflicts = unordered_conflicts(plan.steps, moved)
    if conflicts:
        return f"{len(conflicts)} reuse(s) of bytes its steps do not order"
    if move:
        plan.buffers[:] = moved
        plan.arena_bytes = max([plan.arena_bytes] + [b.offset + b.nbytes for b in moved if b.space == "arena"])
    return None


MOVE_SHARE = 1 / 16   # a storage moves past the arena's end only where that grows it by this share at most


def widened(largest: Plan, needs: list, room: int = 0) -> Plan | None:
    """largest's layout where every size of its structure fits: needs holds, per buffer, the most bytes
    any size gives it (None for weight buffers). An arena storage (a buffer and its views, Plan.
    storage_of) with a buffer that needs more than its slot grows in place where every reuse of the
    bytes it then covers is still ordered by the steps' edges (passes/hazards.py); else it moves past
    the arena's end, to bytes no other buffer uses, sized for the most its buffers need, where the
    arena stays within `room` (the range's largest arena, which the runtime allocates for every size
    anyway) or grows by MOVE_SHARE at most; else it stays (the sizes that need more of it keep their
    own layouts, as before). Its buffers' byte counts become those needs. -> that layout (a copy), or
    None where nothing changed."""
    root = largest.storage_of()
    grow = {root[i] for i, (b, need) in enumerate(zip(largest.buffers, needs))
            if b.space == "arena" and need is not None and not fits_slot(replace(b, nbytes=int(need)), b)}
    buffers = list(largest.buffers)
    end = aligned_bytes(largest.arena_bytes)
    changed = False
    for r in sorted(grow):
        mine = [i for i in range(len(buffers)) if root[i] == r]
        grown = list(buffers)
        for i in mine:
            grown[i] = replace(buffers[i], nbytes=max(buffers[i].nbytes, int(needs[i] or 0)))
        if not unordered_conflicts(largest.steps, grown):
            buffers, changed = grown, True
            continue
        base = buffers[r].offset
        span = aligned_bytes(max(grown[i].offset - base + grown[i].nbytes for i in mine))
        if end + span > max(room, (1 + MOVE_SHARE) * largest.arena_bytes):
            continue
        for i in mine:
            grown[i] = replace(grown[i], offset=end + grown[i].offset - base)
        buffers, end, changed = grown, end + span, True
    if not changed:
        return None
    out = Plan.from_json(largest.to_json())
    out.buffers[:] = buffers
    out.arena_bytes = max([largest.arena_bytes] + [b.offset + b.nbytes for b in buffers if b.space == "arena"])
    return out
