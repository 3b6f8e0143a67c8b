"""Steps 1 and 2 of a range's compile (compiler/structures.py): the sizes as boxes, each taken to be
one launch structure's after its probes agree.

1. Boxes. Each dim's first HEAD values are classes of their own (a 1 broadcasts; a few rows take
   kernels of their own); beyond, a value's class is its span between powers of four (`band`: block
   sizes step there) and its remainder modulo MODULUS (the alignment of rows and vectors). Each
   class's largest value is compiled (the other dims at their largest, repeating the largest size's
   choices), and a dim's classes of one span that give one structure are one class: a batch that only
   repeats rows is one or two classes, not sixteen. A box is one class per dim: every combination of
   their values.
2. Probes. A box's largest size is compiled, then its smallest and its centre, repeating the
   largest's cost-based choices (fusion, thread mappings, arena layout, schedule: pipeline.py
   Choices), so that sizes differ only where a choice cannot carry over. A box whose probes share a
   structure is taken to be that structure's throughout; else it is cut along its longest dim where
   its largest size's structure ends (found by bisection), down to boxes of SMALL_BOX sizes, which
   are compiled whole.

Sizes with two dims of one value (`coincident`) take no part in either.

`done` is structures.py's record of the compiled sizes: done.add(sizes, like=) compiles more,
done.docs[size].key is a compiled size's structure.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable

import numpy as np

HEAD = 8          # a dim's first values: each a class of its own
MODULUS = 8       # beyond them, values of one remainder modulo this share a class
SMALL_BOX = 4     # a box of no more sizes than this whose probes disagree: every size compiled


def coincident(size: tuple) -> bool:
    """Two dims of one value (batch == seq). The compile merges what is equal: two Range nodes of
    one length are one node, two index constants of one value one expression node, so such a size's plan
    has a template of its own (tiny GPT-2: batch == seq) though it runs as its neighbours' would. They lie
    on lines through the range, across every box: a probe or a bisection that met them would cut boxes
    for nothing. So they are never probed, bisected over, fitted or checked, and are all compiled
    (compile_range), as few as a dim has values."""
    return len(set(size)) < len(size)


@dataclass
class Box:
    """Sizes: every combination of one value list per dim. rep: the size whose choices its sizes
    repeat (the largest of a box it was cut from, of the same structure), else its own largest."""
    axes: tuple
    rep: tuple | None = None

    @property
    def count(self) -> int:
        return int(np.prod([len(a) for a in self.axes]))

    @property
    def top(self) -> tuple:
        """Its largest size (in order, the first dim first) that is not coincident, if any."""
        largest = tuple(a[-1] for a in self.axes)
        return next((m for m in itertools.product(*[a[::-1] for a in self.axes]) if not coincident(m)), largest)

    @property
    def like(self) -> tuple:
        return self.rep or self.top

    def members(self):
        return itertools.product(*self.axes)

    def probes(self) -> list:
        """Its corners and centre, but coincident ones; its top where all are."""
        corners = itertools.product(*[sorted({a[0], a[-1]}) for a in self.axes])
        centre = tuple(a[len(a) // 2] for a in self.axes)
        return sorted({p for p in set(corners) | {centre} if not coincident(p)} or {self.top})

    def longest(self) -> int:
        return max(range(len(self.axes)), key=lambda i: len(self.axes[i]))

    def split_at(self, d: int, k: int, same_structure: bool = True) -> list:
        """[values of dim d before index k, from k on]; the lower part keeps repeating this box's
        choices where it is of the same structure."""
        a = self.axes[d]
        return [Box(self.axes[:d] + (a[:k],) + self.axes[d + 1:], self.like if same_structure else None),
                Box(self.axes[:d] + (a[k:],) + self.axes[d + 1:], self.like)]

    def halves(self) -> list:
        d = self.longest()
        return self.split_at(d, len(self.axes[d]) // 2)


def band(v: int) -> int:
    """Which of the spans 1..64, 65..256, 257..1024 (up by fours) holds v. Block sizes step at their
    ends (ops/reduce.py's scans take a power of two past the root of the length: 16 up to 256, then 32),
    so a box within one span is not cut for its numbers' steps."""
    k = 0
    while v > 64 * 4 ** k:
        k += 1
    return k


def dim_classes(lo: int, hi: int) -> list:
    """A dim's classes of step 1: each of its first HEAD values, then its values by span (band) and
    remainder."""
    classes = [(v,) for v in range(lo, min(hi, lo + HEAD - 1) + 1)]
    by_class: dict = {}
    for v in range(lo + HEAD, hi + 1):
        by_class.setdefault((band(v), (v - lo - HEAD) % MODULUS), []).append(v)
    return classes + [tuple(vals) for _, vals in sorted(by_class.items())]


def initial_boxes(ranges: list, key_at: Callable | None = None) -> list:
    """ranges: (lo, hi) per dim -> the boxes of step 1 (one class per dim). key_at(sizes) -> their
    structures: where given, the classes of a dim whose largest values give one structure (the other
    dims at their largest, the choices the largest size's) are one class, so that a dim that changes
    little (a batch that only repeats rows; the remainders of a length that align alike) does not
    multiply the boxes. (The sizes a merged class's formulas are fitted on are drawn at random, _fill,
    so that they do not all share one remainder.)"""
    per_dim = [dim_classes(lo, hi) for lo, hi in ranges]
    if key_at is not None:
        tops = tuple(hi for _, hi in ranges)
        scan = [_apart(tops[:d] + (c[-1],) + tops[d + 1:], d, ranges)
                for d, classes in enumerate(per_dim) for c in classes]
        keys = iter(key_at(scan))
        for d, classes in enumerate(per_dim):
            by_key: dict = {}
            for c in classes:
                by_key.setdefault((band(c[-1]), next(keys)), []).extend(c)
            per_dim[d] = [tuple(sorted(v)) for v in by_key.values()]
    return [Box(axes) for axes in itertools.product(*per_dim)]


def _apart(size: tuple, d: int, ranges: list) -> tuple:
    """size, where it is coincident with its other dims than d lowered by the fewest steps that make
    it not (as it is where none do)."""
    for step in range(int(coincident(size)), 4):
        for e in range(len(size)):
            m = size[:e] + (size[e] - step,) + size[e + 1:]
            if (e != d or step == 0) and m[e] >= ranges[e][0] and not coincident(m):
                return m
    return size




def probe(queue: list, done) -> list:
    """Step 2 over the boxes of `queue`: -> the boxes whose probes share a structure; those of at most
    SMALL_BOX sizes whose probes differ are compiled whole."""
    settled = []
    while queue:
        done.phase = "probe"
        done.add([b.like for b in queue])
        done.add([b.top for b in queue], like=likes(queue))
        done.add([p for b in queue for p in (b.members() if b.count <= SMALL_BOX else b.probes())],
                 like=likes(queue))
        mixed = []
        for b in queue:
            if len({done.docs[p].key for p in b.probes()}) == 1:
                settled.append(b)
            elif b.count > SMALL_BOX:
                mixed.append(b)
        queue = _cut(mixed, done)
    return settled


class _Line:
    """A mixed box's bisection (_cut): the line along its longest dim through its top, bisected over
    its sizes that are not coincident (its top the last of them)."""

    def __init__(self, box: Box, done):
        self.box, self.d = box, box.longest()
        self.key = done.docs[box.top].key
        n = len(box.axes[self.d])
        self.index = [i for i in range(n) if not coincident(self.at_index(i))] or [n - 1]
        at0 = self.at(0)
        # at(good) is in the top's structure; at(bad) is not (or is before the start)
        self.good, self.bad = len(self.index) - 1, 0 if at0 in done.docs and done.docs[at0].key != self.key else -1

    def at_index(self, i: int) -> tuple:
        top = self.box.top
        return top[:self.d] + (self.box.axes[self.d][i],) + top[self.d + 1:]

    def at(self, k: int) -> tuple:
        return self.at_index(self.index[k])

    @property
    def mid(self) -> int:
        return (self.good + self.bad) // 2

    def pieces(self) -> list:
        if self.good == 0:   # the line is the top's throughout: the box differs along another dim
            return self.box.halves()
        return self.box.split_at(self.d, self.index[self.good], same_structure=False)


def _cut(boxes: list, done) -> list:
    """Boxes whose probes differ, each cut along its longest dim where its largest size's structure
    ends: the lowest value on the line through its largest size whose size repeats the largest's
    choices into the same structure, found by bisection (a structure taken to hold from there up). The
    boxes are bisected side by side, each step's sizes compiled together."""
    lines = [_Line(b, done) for b in boxes]
    while True:
        active = [ln for ln in lines if ln.good - ln.bad > 1]
        if not active:
            return [p for ln in lines for p in ln.pieces()]
        done.phase = "cut"
        done.add([ln.at(ln.mid) for ln in active], like={ln.at(ln.mid): ln.box.like for ln in active})
        for ln in active:
            m = ln.mid
            if done.docs[ln.at(m)].key == ln.key:
                ln.good = m
            else:
                ln.bad = m


def likes(boxes: list) -> dict:
    """size -> the size whose choices it repeats (Box.like)."""
    out = {}
    for b in boxes:
        like = b.like   # once a box: its top walks the box's corners (a third of a 58401-size range's compile)
        out.update((m, like) for m in b.members() if m != like)
    return out
