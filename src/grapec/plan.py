"""The execution plan: what a runtime replays for one input-shape bucket. Typed records, stored as JSON.

    Plan
      buffers        [Buffer]: name, space ("arena": activations, inputs, outputs; "weight": an
                     offset into the bundle's weight blob), offset, nbytes, dtype, shape, and a
                     row pitch where the rows are padded (a graph output a GEMM wrote with rows
                     padded to 16 bytes: passes/aligned_rows.py; the runtimes compact it on the way
                     out)
      inputs/outputs [(onnx name, buffer index)]
      steps          [Step], in a launch order; every step names buffers by index, the steps it
                     waits for (`deps`: earlier steps of the same list; the edges of the CUDA graph)
                     and its branch (a chain of the stream schedule, passes/streams.py):
        KernelStep     out := kernel(args)                 (kernel: index into the bundle's kernels)
        LibraryStep    out := library op(args)             (attrs: ir/library.py documents them)
        ScanStoreStep  row `counter` of dst := src         (a Loop's scan output, inside its body)
        IfStep         run `then` when cond else `else_`; both branches write the If's outputs
                       themselves (the memory plan gives their last values the output's bytes)
        LoopStep       ONNX Loop, as the backends run it:
                           enter steps (initial values into the carried slots)
                           counter := 0; cond_in := cond (or true)
                           while cond_in and (no trip or counter < trip):
                               body steps (they end by copying carried values home and
                                           storing scan rows)
                               cond_in := cond_out; counter += 1
                           exit steps (carried slots into the Loop's outputs, where they differ)
      arena_bytes, memory (the memory planner's report)
      stitches       [Stitch]: runs of top-level kernel steps [first, end) that the GPU runs as one
                     cooperative kernel, each stage after a grid-wide barrier (passes/grid_stitch.py);
                     the CPU backend and every report still see the steps one by one
      aliases        [(buffer, the buffer whose bytes it is)]: Views and values of If/Loop bodies that
                     live in an enclosing value's bytes (what zero-copy I/O must follow; None in
                     plans from before grapec recorded them)

A region (If/Loop) step says whether it runs inside the CUDA graph (`graphed`, as conditional IF and
WHILE nodes) or with its control on the host (`host_reason` says why). The CPU backend runs both
kinds the same way (runtime/walker.py). Kernels live once in the bundle, so buckets share them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class Buffer:
    name: str
    space: str        # "arena" | "weight"
    offset: int
    nbytes: int
    dtype: str
    shape: tuple
    pitch: int = 0    # elements from one row (last dim) to the next; 0: the rows are dense

    @property
    def stored_elements(self) -> int:
        """Elements the buffer's bytes hold: its shape's, or its padded rows'."""
        if not self.pitch:
            return math.prod(self.shape)
        return math.prod(self.shape[:-1]) * self.pitch

    @property
    def strides(self) -> tuple:
        """Element strides of the shape as stored."""
        out, acc = [], 1
        for i, d in enumerate(reversed(self.shape)):
            out.append(acc)
            acc *= (self.pitch or d) if i == 0 else d
        return tuple(reversed(out))

    def to_json(self) -> list:
        row = [self.name, self.space, self.offset, self.nbytes, self.dtype, list(self.shape)]
        return row + [self.pitch] if self.pitch else row

    @staticmethod
    def from_json(row) -> "Buffer":
        name, space, off, nbytes, dt, shape = row[:6]
        return Buffer(str(name), str(space), int(off), int(nbytes), str(dt), tuple(int(d) for d in shape),
                      int(row[6]) if len(row) > 6 else 0)


@dataclass
class KernelStep:
    kernel: int
    args: list
    out: int
    origin: list = field(default_factory=list)
    deps: list | None = None
    branch: int = 0
    op = "kernel"


@dataclass
class LibraryStep:
    attrs: dict
    args: list        # buffer indices, -1 for an absent optional operand
    out: int
    origin: list = field(default_factory=list)
    deps: list | None = None
    branch: int = 0
    op = "library"


@dataclass
class ScanStoreStep:
    src: int
    dst: int          # [rows, *src.shape]
    counter: int      # int64 scalar: the row to write
    origin: list = field(default_factory=list)
    deps: list | None = None
    branch: int = 0
    op = "scan_store"


@dataclass
class Body:
    steps: list


@dataclass
class IfStep:
    cond: int
    then: Body
    else_: Body
    outputs: list
    graphed: bool = True
    host_reason: str = ""
    origin: list = field(default_factory=list)
    deps: list | None = None
    branch: int = 0
    op = "if"


@dataclass
class LoopStep:
    trip: int         # int64 scalar, or -1: no trip count
    cond: int         # bool scalar, or -1: starts true
    counter: int      # the body's iteration-number input
    cond_in: int      # the body's condition input
    cond_out: int     # the body's condition output
    enter: list
    body: Body
    exit: list
    outputs: list     # carried outputs, then scan outputs (for reports; the steps write them)
    graphed: bool = True
    host_reason: str = ""
    origin: list = field(default_factory=list)
    deps: list | None = None
    branch: int = 0
    carried: list | None = None   # the body's slots of the carried values, in order: what a step
                                  # rewrites (a generation's tokens, streamed from them: runtime/
                                  # generation.py); None in plans from before grapec recorded them
    op = "loop"


REGIONS = (IfStep, LoopStep)


@dataclass
class Stitch:
    """Top-level steps [first, end), all KernelSteps, run on the GPU as one cooperative kernel of
    `block` threads a block: stage after stage, a grid-wide barrier between them (codegen/grid_stitch.py)."""
    first: int
    end: int
    block: int

    def to_json(self) -> list:
        return [self.first, self.end, self.block]

    @staticmethod
    def from_json(row) -> "Stitch":
        first, end, block = (int(x) for x in row)
        return Stitch(first, end, block)


@dataclass
class Plan:
    buffers: list
    inputs: list
    outputs: list
    steps: list
    arena_bytes: int
    memory: dict = field(default_factory=dict)
    aliases: list | None = None
    stitches: list = field(default_factory=list)

    def to_json(self) -> dict:
        d = {"buffers": [b.to_json() for b in self.buffers], "inputs": [list(x) for x in self.inputs],
             "outputs": [list(x) for x in self.outputs], "steps": steps_to_json(self.steps),
             "arena_bytes": self.arena_bytes, "memory": self.memory}
        if self.aliases is not None:
            d["aliases"] = [list(a) for a in self.aliases]
        if self.stitches:
            d["stitches"] = [st.to_json() for st in self.stitches]
        return d

    def stitch_at(self, first: int):
        """The Stitch starting at top-level step `first`, or None."""
        return next((st for st in self.stitches if st.first == first), None)

    def storage_of(self) -> list:
        """Per buffer, the buffer that owns its bytes (itself unless it is an alias)."""
        root = list(range(len(self.buffers)))
        for b, of in self.aliases or []:
            root[b] = of
        for b in range(len(root)):   # aliases of aliases
            while root[root[b]] != root[b]:
                root[b] = root[root[b]]
        return root

    @staticmethod
    def from_json(d: dict) -> "Plan":
        """Raises KeyError/TypeError/ValueError on malformed input (the bundle reader reports them)."""
        if not isinstance(d, dict):
            raise TypeError("a plan must be a JSON object")
        aliases = d.get("aliases")
        buffers = [Buffer.from_json(r) for r in d["buffers"]]
        if aliases is not None:
            aliases = [(int(b), int(of)) for b, of in aliases]
            if any(not (0 <= b < len(buffers) and 0 <= of < len(buffers)) or of == b for b, of in aliases):
                raise ValueError("an alias names a buffer the plan does not have")
        steps = steps_from_json(d["steps"])
        stitches = [Stitch.from_json(r) for r in d.get("stitches") or []]
        ends = 0
        for st in stitches:
            if not (ends <= st.first < st.end <= len(steps)) or not 32 <= st.block <= 1024 \
                    or not all(isinstance(s, KernelStep) for s in steps[st.first:st.end]):
                raise ValueError(f"stitch {st.to_json()} is not an ordered run of kernel steps of the plan")
            ends = st.end
        return Plan(buffers, [(str(n), int(b)) for n, b in d["inputs"]],
                    [(str(n), int(b)) for n, b in d["outputs"]], steps,
                    int(d["arena_bytes"]), dict(d.get("memory") or {}), aliases, stitches)


def steps_to_json(steps: list) -> list:
    return [dict(_step_to_json(s), **_order_to_json(s)) for s in steps]


def _order_to_json(s) -> dict:
    return {} if s.deps is None else {"deps": list(s.deps), "branch": s.branch}


def _step_to_json(s) -> dict:
    if isinstance(s, KernelStep):
        return {"op": "kernel", "kernel": s.kernel, "args": list(s.args), "out": s.out, "origin": s.origin}
    if isinstance(s, LibraryStep):
        return {"op": "library", "attrs": s.attrs, "args": list(s.args), "out": s.out, "origin": s.origin}
    if isinstance(s, ScanStoreStep):
        return {"op": "scan_store", "src": s.src, "dst": s.dst, "counter": s.counter, "origin": s.origin}
    region = {"graphed": s.graphed, "host_reason": s.host_reason, "origin": s.origin, "outputs": list(s.outputs)}
    if isinstance(s, IfStep):
        return {"op": "if", "cond": s.cond, "then": steps_to_json(s.then.steps),
                "else": steps_to_json(s.else_.steps), **region}
    return {"op": "loop", "trip": s.trip, "cond": s.cond, "counter": s.counter, "cond_in": s.cond_in,
            "cond_out": s.cond_out, "enter": steps_to_json(s.enter), "body": steps_to_json(s.body.steps),
            "exit": steps_to_json(s.exit), **region, **({} if s.carried is None else {"carried": list(s.carried)})}


def steps_from_json(rows) -> list:
    if not isinstance(rows, list):
        raise TypeError("steps must be a list")
    steps = [_step_from_json(r) for r in rows]
    for i, (st, r) in enumerate(zip(steps, rows)):
        if "deps" in r:
            st.deps = _ints(r["deps"])
            if any(not 0 <= d < i for d in st.deps):
                raise ValueError(f"step {i} depends on a step that does not come before it: {st.deps}")
            st.branch = int(r.get("branch", 0))
    return steps


def chain_deps(n: int) -> list:
    """The dependencies of n steps run one after another."""
    return [[i - 1] if i else [] for i in range(n)]


def dependents(deps: list) -> tuple:
    """(users, waiting): for each step the later steps that wait for it, and how many distinct steps
    it waits for itself (what a topological walk of the edges counts down)."""
    users: list = [[] for _ in deps]
    for j, d in enumerate(deps):
        for i in set(d):
            users[i].append(j)
    return users, [len(set(d)) for d in deps]


def step_deps(steps: list) -> list:
    """Each step's dependencies (indices of earlier steps of the same list); a step that records none
    (a plan from before the stream scheduler) follows the step before it."""
    chained = chain_deps(len(steps))
    return [list(st.deps) if st.deps is not None else chained[i] for i, st in enumerate(steps)]


def _ints(xs) -> list:
    if not isinstance(xs, list):
        raise TypeError("expected a list of buffer indices")
    return [int(x) for x in xs]


def _step_from_json(d):
    op = d["op"]
    origin = [str(o) for o in d.get("origin", [])]
    if op == "kernel":
        return KernelStep(int(d["kernel"]), _ints(d["args"]), int(d["out"]), origin)
    if op == "library":
        if not isinstance(d["attrs"], dict):
            raise TypeError("library attrs must be an object")
        return LibraryStep(d["attrs"], _ints(d["args"]), int(d["out"]), origin)
    if op == "scan_store":
        return ScanStoreStep(int(d["src"]), int(d["dst"]), int(d["counter"]), origin)
    region = dict(graphed=bool(d["graphed"]), host_reason=str(d["host_reason"]), origin=origin)
    if op == "if":
        return IfStep(int(d["cond"]), Body(steps_from_json(d["then"])), Body(steps_from_json(d["else"])),
                      _ints(d["outputs"]), **region)
    if op == "loop":
        return LoopStep(int(d["trip"]), int(d["cond"]), int(d["counter"]), int(d["cond_in"]), int(d["cond_out"]),
                        steps_from_json(d["enter"]), Body(steps_from_json(d["body"])), steps_from_json(d["exit"]),
                        _ints(d["outputs"]), **region, carried=_ints(d["carried"]) if "carried" in d else None)
    raise ValueError(f"unknown step kind {op!r}")


def child_step_lists(step) -> list:
    """The step lists nested in a region step (empty for the others)."""
    if isinstance(step, IfStep):
        return [step.then.steps, step.else_.steps]
    if isinstance(step, LoopStep):
        return [step.enter, step.body.steps, step.exit]
    return []


def walk_steps(steps: list):
    """Every step, region bodies included, depth first."""
    for st in steps:
        yield st
        for sub in child_step_lists(st):
            yield from walk_steps(sub)


def kernel_steps(plans: list):
    """(bucket, step) for every kernel step of the plans, If/Loop bodies included."""
    for b, p in enumerate(plans):
        for st in walk_steps(p.steps):
            if isinstance(st, KernelStep):
                yield b, st


def regions(plan: Plan) -> list:
    """Every If/Loop step of a plan, nested ones included."""
    return [st for st in walk_steps(plan.steps) if isinstance(st, REGIONS)]
