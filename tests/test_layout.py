"""The house rules of src/grapec, checked: floors from ir up to the command line, no import circles,
at most two imports that run back up a floor (each with its reason in a comment above it), a short
top level, and no file past 650 lines (ARCHITECTURE.md)."""
from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "src")

# Lowest first. A module may import its own floor and the ones below it.
FLOORS = ["errors", "dtypes", "ir", "ops", "frontend", "plan", "codegen", "cost", "passes", "bundle", "runtime",
          "compiler", "serve", "tools"]
UP_ALLOWED = 2
MAX_TOP_MODULES = 5
MAX_LINES = 650


def _modules() -> dict:
    out = {}
    for d, _, files in os.walk(os.path.join(SRC, "grapec")):
        for f in files:
            if f.endswith(".py"):
                p = os.path.join(d, f)
                rel = os.path.relpath(p, SRC)[:-3].replace(os.sep, ".")
                out[rel[:-len(".__init__")] if rel.endswith(".__init__") else rel] = p
    return out


def _imports(mods: dict) -> list:
    """[(importer, imported, file, line)] for every grapec import, lazy ones inside functions too."""
    edges = []
    for m, p in mods.items():
        pkg = m if p.endswith("__init__.py") else m.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(open(p).read())):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                parts = pkg.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            elif node.module and node.module.split(".")[0] == "grapec":
                base = node.module
            else:
                continue
            for a in node.names:
                target = f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                if target in mods and target != m:
                    edges.append((m, target, p, node.lineno))
    return edges


def _floor(mod: str) -> int | None:
    parts = mod.split(".")
    return FLOORS.index(parts[1]) if len(parts) > 1 and parts[1] in FLOORS else None


def test_no_import_circles():
    mods = _modules()
    graph: dict = {m: set() for m in mods}
    for a, b, _, _ in _imports(mods):
        if a != "grapec" and b != "grapec":   # the package's own API imports whatever it exports
            graph[a].add(b)
    index, low, stack, on, circles = {}, {}, [], set(), []

    def visit(v):   # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))
    for v in graph:
        if v not in index:
            visit(v)
    assert not circles, f"import circles: {circles}"


def test_imports_run_down_the_floors():
    mods = _modules()
    assert all(_floor(m) is not None for m in mods if m != "grapec"), \
        [m for m in mods if m != "grapec" and _floor(m) is None]
    up = []
    for a, b, path, line in _imports(mods):
        if a == "grapec" or b == "grapec" or _floor(b) <= _floor(a):
            continue
        lines = open(path).read().split("\n")
        above = lines[line - 2].strip() if line >= 2 else ""
        up.append((a, b, above.startswith("#")))
    assert len(up) <= UP_ALLOWED, f"{len(up)} imports run up a floor: {up}"
    assert all(reason for _, _, reason in up), f"an upward import without its reason above it: {up}"


def test_a_short_top_level():
    top = [f for f in os.listdir(os.path.join(SRC, "grapec")) if f.endswith(".py") and f != "__init__.py"]
    assert len(top) <= MAX_TOP_MODULES, sorted(top)


def test_no_file_past_650_lines():
    long = []
    for base in ("src", "models"):
        for d, _, files in os.walk(os.path.join(ROOT, base)):
            for f in files:
                if f.endswith(".py"):
                    p = os.path.join(d, f)
                    n = sum(1 for _ in open(p))
                    if n > MAX_LINES:
                        long.append((os.path.relpath(p, ROOT), n))
    assert not long, long
