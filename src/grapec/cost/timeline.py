"""Text pictures of a schedule: one row per branch of the CUDA graph, time left to right.

The same picture serves the simulated schedule (`grapec inspect --schedule`, from the bundle's
manifest) and the measured one (`grapec bench --timeline`, runtime/cuda/timeline.py). Each column is
a slice of the replay; a cell shows what ran on that branch then:
    G  a cuBLASLt GEMM        k  a generated kernel       R  an If/Loop region
    s  a scan-row store       .  nothing (the branch waits)
"""
from __future__ import annotations

from dataclasses import dataclass

MARKS = {"library": "G", "kernel": "k", "if": "R", "loop": "R", "scan_store": "s"}


@dataclass
class Span:
    step: int
    branch: int
    start: float     # microseconds from the replay's start
    end: float
    kind: str        # a plan step's op: kernel, library, if, loop, scan_store


def render(spans: list, width: int = 100, title: str = "") -> str:
    if not spans:
        return "(no steps)"
    t0 = min(s.start for s in spans)
    total = max(s.end for s in spans) - t0
    scale = width / total if total > 0 else 1.0
    rows = {}
    for s in sorted(spans, key=lambda s: s.start):
        row = rows.setdefault(s.branch, ["."] * width)
        a = min(width - 1, int((s.start - t0) * scale))
        b = max(a + 1, min(width, int(round((s.end - t0) * scale))))
        for c in range(a, b):
            row[c] = MARKS.get(s.kind, "?")
    lines = [title] if title else []
    lines.append(f"{'':10s}0{'':{width - 12}s}{total:9.1f} us")
    for branch in sorted(rows):
        busy = sum(s.end - s.start for s in spans if s.branch == branch)
        lines.append(f"branch {branch:<3d}|{''.join(rows[branch])}| busy {busy / total:4.0%}" if total else "")
    concurrency = sum(s.end - s.start for s in spans) / total if total else 1.0
    lines.append(f"{len(spans)} steps on {len(rows)} branches; on average {concurrency:.2f} steps run at once. "
                 "G GEMM, k kernel, R If/Loop, s scan store, . waiting")
    return "\n".join(lines)


def simulated_spans(plan, schedule: dict) -> list:
    """The manifest's simulated timeline (passes/streams.py) as spans of the plan's top-level steps."""
    return [Span(i, int(b), float(s), float(e), st.op)
            for i, (st, (s, e, b)) in enumerate(zip(plan.steps, schedule.get("timeline") or []))]


def schedule_text(bundle, width: int = 100) -> str:
    """`grapec inspect --schedule`: per bucket, the stream scheduler's choice, why, the schedules it
    weighed and the simulated timeline."""
    out = []
    for i, (meta, plan) in enumerate(zip(bundle.manifest.get("buckets", []), bundle.plans)):
        s = meta.get("schedule")
        shapes = ", ".join(f"{k}={'x'.join(map(str, v)) or 'scalar'}" for k, v in meta.get("shapes", {}).items())
        out.append(f"bucket {i} ({shapes}):")
        if not s:
            out.append("  no schedule recorded (a bundle from before the stream scheduler): one chain")
            continue
        out.append(f"  {s['reason']}")
        out.append(f"  simulated replay {s['simulated_us']:.1f} us against {s['serial_us']:.1f} us as one chain; "
                   f"{s['edges']} edges, {s['cross_branch_edges']} between branches")
        if s.get("candidates"):
            out.append("  weighed (simulated us): " + ", ".join(
                f"{c['order']} x{c['branches']} {c['us']:.1f}" for c in s["candidates"]))
        out.append(render(simulated_spans(plan, s), width, "  simulated timeline:"))
    return "\n".join(out)
