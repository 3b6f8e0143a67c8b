"""The cost model against measurement, for every zoo step: a table and a log-log scatter plot.

    python benchmarks/cost_model.py RESULTS.json [--out DIR]

RESULTS.json is what `benchmarks/zoo.py --per-step` wrote: each grapec step's measured time alone
as a graph node (`us`) and the estimate the compiler stored in the bundle (`est_us`, from the
device profile it compiled for). Writes DIR/cost_model.md and DIR/cost_model.svg (no plotting
library needed).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics


def rows_of(results: dict) -> list:
    return [(label, st["est_kind"], st["us"], st["est_us"]) for label, r in results.items()
            for st in r["grapec"].get("steps", []) if "est_us" in st and st["us"] > 0]


def error(est, us) -> float:
    return abs(est - us) / us


def table(rows: list, profile: str) -> str:
    def line(name, sel):
        e = [error(est, us) for _, _, us, est in sel]
        return (f"| {name} | {len(e)} | {statistics.median(e):.1%} | {sorted(e)[int(0.9 * (len(e) - 1))]:.1%} | "
                f"{sum(1 for x in e if x <= 0.25) / len(e):.0%} |")
    out = [f"Cost model vs measurement, every zoo step (device profile: {profile}). Error = |estimate - measured| / measured; "
           "measured = the step alone as a CUDA-graph node (benchmarks/zoo.py --per-step).", "",
           "| steps | n | median error | p90 error | within 25% |", "|---|---|---|---|---|", line("all", rows)]
    for kind in sorted({r[1] for r in rows}):
        out.append(line(f"kind: {kind}", [r for r in rows if r[1] == kind]))
    for label in dict.fromkeys(r[0] for r in rows):
        out.append(line(label, [r for r in rows if r[0] == label]))
    return "\n".join(out) + "\n"


def scatter_svg(rows: list, size: int = 480) -> str:
    lo = min(min(us, est) for _, _, us, est in rows) / 1.3
    hi = max(max(us, est) for _, _, us, est in rows) * 1.3
    pad = 50

    def pos(v):
        return pad + (math.log(v) - math.log(lo)) / (math.log(hi) - math.log(lo)) * (size - 2 * pad)
    colors = {"kernel": "#1f77b4", "gemm": "#d62728", "attention": "#2ca02c"}
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{size}" height="{size}" font-family="sans-serif" font-size="11">',
             f'<rect width="{size}" height="{size}" fill="white"/>',
             f'<line x1="{pos(lo)}" y1="{size - pos(lo)}" x2="{pos(hi)}" y2="{size - pos(hi)}" stroke="#888" stroke-dasharray="4"/>']
    for v in (1, 2, 5, 10, 20, 50, 100):
        if lo <= v <= hi:
            parts.append(f'<text x="{pos(v)}" y="{size - pad + 15}" text-anchor="middle">{v}</text>')
            parts.append(f'<text x="{pad - 5}" y="{size - pos(v) + 4}" text-anchor="end">{v}</text>')
    for _, kind, us, est in rows:
        parts.append(f'<circle cx="{pos(us):.1f}" cy="{size - pos(est):.1f}" r="2.5" fill="{colors.get(kind, "#444")}" fill-opacity="0.6"/>')
    parts.append(f'<text x="{size / 2}" y="{size - 10}" text-anchor="middle">measured us (log)</text>')
    parts.append(f'<text x="12" y="{size / 2}" transform="rotate(-90 12 {size / 2})" text-anchor="middle">estimated us (log)</text>')
    for i, (k, c) in enumerate(colors.items()):
        parts.append(f'<circle cx="{pad + 10}" cy="{pad + 14 * i}" r="4" fill="{c}"/><text x="{pad + 18}" y="{pad + 4 + 14 * i}">{k}</text>')
    return "\n".join(parts + ["</svg>"]) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results")
    ap.add_argument("--out", default=None, help="folder for cost_model.md and .svg [default: the results' folder]")
    a = ap.parse_args()
    with open(a.results) as f:
        results = json.load(f)
    rows = rows_of(results)
    if not rows:
        raise SystemExit(f"{a.results}: no step has an estimate (run benchmarks/zoo.py --per-step with this grapec)")
    out = a.out or os.path.dirname(os.path.abspath(a.results))
    profile = next((r.get("device_profile") for r in results.values() if r.get("device_profile")), "?")
    md = table(rows, profile)
    with open(os.path.join(out, "cost_model.md"), "w") as f:
        f.write(md + "\n![estimated vs measured](cost_model.svg)\n")
    with open(os.path.join(out, "cost_model.svg"), "w") as f:
        f.write(scatter_svg(rows))
    print(md)


if __name__ == "__main__":
    main()
