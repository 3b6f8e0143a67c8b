"""The launch structures of a range: which sizes of a --dynamic range share one plan template.

    python tools/structures.py models/tiny/gpt2.onnx --dynamic batch=1:16 --dynamic seq=1:16 [--precision fp16]

Plans of sizes that differ only in numbers (sizes, offsets, grids) share a template (bundle/templates.py):
one template is one launch structure. Issue 33 builds one graph per structure with the numbers as
run-time values; this shows how many there are and where their borders lie. Prints each structure
(its sizes, steps and step kinds) and, for a two-dim range, a map: one row per value of the first
dim, one letter per value of the second, the letter naming the size's structure.
"""
from __future__ import annotations

import argparse
import os
import string
import sys
import time
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))


def structures(bundle) -> list:
    """[(template index, [bucket..])] of the bundle's plans, the largest first."""
    from grapec.bundle import templates
    enc = templates.encode([p.to_json() for p in bundle.plans])
    groups: dict = {}
    for bucket, t in enumerate(enc["docs"]):
        groups.setdefault(t, []).append(bucket)
    return sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--dynamic", action="append", required=True, metavar="NAME=LO:HI")
    ap.add_argument("--dim", action="append", default=[], metavar="NAME=N")
    ap.add_argument("--precision", default="fp32")
    a = ap.parse_args()
    from grapec.compiler import compile_model
    from grapec.frontend.shapes import parse_dims, parse_ranges, range_buckets
    dynamic = parse_ranges(a.dynamic)
    t0 = time.perf_counter()
    b = compile_model(a.model, dims=parse_dims(a.dim, "--dim") or None, dynamic=dynamic, precision=a.precision, targets=[])
    took = time.perf_counter() - t0
    names = list(dynamic)
    sizes = [tuple(d[n] for n in names) for d in range_buckets(dynamic)]   # the buckets, in range order
    groups = structures(b)
    print(f"{len(b.plans)} sizes of {', '.join(names)} compiled in {took:.1f} s: {len(groups)} launch structures")
    letters = {}
    for k, (t, members) in enumerate(groups):
        letter = (string.ascii_uppercase + string.ascii_lowercase + string.digits)[k % 62]
        letters.update({m: letter for m in members})
        plan = b.plans[members[0]]
        kinds = Counter(st.op for st in plan.steps)
        shown = ", ".join("x".join(map(str, sizes[m])) for m in members[:8]) + (" ..." if len(members) > 8 else "")
        print(f"  {letter}: {len(members):>5} sizes, {len(plan.steps)} steps {dict(kinds)}  e.g. {shown}")
    if len(names) == 2:
        (lo0, hi0), (lo1, hi1) = dynamic[names[0]], dynamic[names[1]]
        at = {s: i for i, s in enumerate(sizes)}
        print(f"\nmap: rows {names[0]} {lo0}..{hi0}, columns {names[1]} {lo1}..{hi1}")
        for v0 in range(lo0, hi0 + 1):
            print(f"  {v0:>4} " + "".join(letters[at[(v0, v1)]] for v1 in range(lo1, hi1 + 1)))


if __name__ == "__main__":
    main()
