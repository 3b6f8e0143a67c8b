"""Per-step GPU time of a plan: what each step costs as the graph node it is.

Each top-level step is built alone into a CUDA graph as a chain of REPEAT copies of its node, and
that graph is replayed between CUDA events; the time per copy is the step's cost inside a graph,
launch gap included (what a node adds to a replay). The steps' sum is close to one replay of the
whole plan: `grapec bench --per-step` prints both, and the cost model (cost.py) is checked
against these numbers.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...errors import BackendError
from ...plan import KernelStep, LibraryStep, LoopStep, chain_deps
from .driver import CudaError, call, exec_ms, graph_ms
from .graph import GraphBuilder

REPEAT = 16
ITERATIONS = 10


@dataclass
class StepTime:
    index: int          # position in the plan's top-level steps
    kind: str           # kernel | attention | library op | if | loop | scan_store
    origin: list
    us: float           # GPU time per execution, microseconds

    def to_json(self) -> dict:
        return {"index": self.index, "kind": self.kind, "origin": self.origin[:4], "us": round(self.us, 3)}


def step_kind(bundle, st) -> str:
    if isinstance(st, KernelStep):
        return bundle.kernels[st.kernel].get("kind", "kernel")
    if isinstance(st, LibraryStep):
        return st.attrs["op"]
    return st.op


def profile_steps(runner, bucket: int, repeat: int = REPEAT, iterations: int = ITERATIONS) -> list:
    """-> [StepTime] for every top-level step of the bucket's plan (its inputs as they are now)."""
    return _each_alone(runner, bucket, runner.plan(bucket).steps, repeat, iterations)


def _each_alone(runner, bucket: int, steps: list, repeat: int, iterations: int) -> list:
    """[StepTime] for each of `steps`, built alone into a graph as a chain of `repeat` copies of its node."""
    out = []
    for i, st in enumerate(steps):
        graph = call("cuGraphCreate", 0)
        GraphBuilder(runner, bucket).add_steps(graph, [st] * repeat, [], order=chain_deps(repeat))
        ms = graph_ms(graph, runner.stream, iterations)
        out.append(StepTime(i, step_kind(runner.bundle, st), list(st.origin), ms * 1e3 / repeat))
    return out


@dataclass
class LoopBodyTime:
    one_launch_us: float   # the body's steps built as one plain graph (no loop node, no grapec_loop_next), one launch
    steps: list            # [StepTime], each body step alone as profile_steps times a top-level one


def profile_loop_body(runner, bucket: int, repeat: int = REPEAT, iterations: int = ITERATIONS) -> LoopBodyTime:
    """The steps of the bucket's last graphed Loop (a generation's decode step), on the buffers as the last run
    left them. Run the plan first, and stop it short of its last iteration (a generation's max_new_tokens one
    under what it was compiled for): the ids and positions the body reads are then ones it wrote, and the
    positions it writes stay inside the cache. What a step of the loop costs beside the decoder compiled alone
    (`benchmarks/llm.py --steps`): the loop's own steps (the window's copies, the token's choice, the stop test)
    and the body's schedule. The body's one launch against the loop's time a token is what the WHILE node adds
    an iteration."""
    loops = [st for st in runner.plan(bucket).steps if isinstance(st, LoopStep) and st.graphed]
    if not loops:
        raise BackendError(f"bucket {bucket}'s plan has no Loop in its CUDA graph: nothing to profile")
    body = loops[-1].body.steps
    graph = call("cuGraphCreate", 0)
    GraphBuilder(runner, bucket).add_steps(graph, body, [])
    one_launch = graph_ms(graph, runner.stream, iterations) * 1e3
    return LoopBodyTime(one_launch, _each_alone(runner, bucket, body, repeat, iterations))


@dataclass
class NodeTime:
    index: int          # position in cuGraphGetNodes' order (the order the nodes were added)
    kind: str           # kernel | memcpy | memset | child (a captured library call of several kernels)
    name: str           # a kernel node's function name ("" for the others)
    us: float           # GPU time of one launch of the exec with this node alone enabled, less the empty launch;
    #                     a child graph's: its own graph cloned and replayed alone (it cannot be switched off)


def profile_nodes(graph, exec_, stream, launches: int = ITERATIONS * 2) -> list:
    """-> [NodeTime] for every node of exec_ (instantiated from graph) that was enabled, each timed alone in
    the exec as it is: its launch form, its arguments, the sizes a range's switch wrote. What profile_steps
    cannot time: a range family's band exec runs steps at its widest shapes and its sized twins read the sizes
    from the device. Every node's enabled state is put back."""
    from cuda.bindings import driver
    kinds = {driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL: "kernel",
             driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_MEMCPY: "memcpy",
             driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_MEMSET: "memset"}
    count = call("cuGraphGetNodes", graph, 0)[-1]
    nodes = call("cuGraphGetNodes", graph, count)[0][:count] if count else []
    # only these kinds can be switched off in an exec; any other node runs in every launch, the empty one too
    timed = [(i, n, kinds[call("cuGraphNodeGetType", n)]) for i, n in enumerate(nodes)
             if call("cuGraphNodeGetType", n) in kinds]
    was = {i: int(call("cuGraphNodeGetEnabled", exec_, n)) for i, n, _ in timed}
    on = [(i, n, kind) for i, n, kind in timed if was[i]]
    try:
        for _, n, _ in on:
            call("cuGraphNodeSetEnabled", exec_, n, 0)
        empty = exec_ms(exec_, stream, launches)
        out = []
        for i, n, kind in on:
            call("cuGraphNodeSetEnabled", exec_, n, 1)
            ms = exec_ms(exec_, stream, launches)
            call("cuGraphNodeSetEnabled", exec_, n, 0)
            out.append(NodeTime(i, kind, _kernel_name(n) if kind == "kernel" else "", (ms - empty) * 1e3))
        for i, n in enumerate(nodes):
            if call("cuGraphNodeGetType", n) == driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_GRAPH:
                child = call("cuGraphClone", call("cuGraphChildGraphNodeGetGraph", n))
                out.append(NodeTime(i, "child", "", graph_ms(child, stream, launches) * 1e3))
        return sorted(out, key=lambda t: t.index)
    finally:
        for i, n, _ in timed:
            call("cuGraphNodeSetEnabled", exec_, n, was[i])


def _kernel_name(node) -> str:
    func = call("cuGraphKernelNodeGetParams", node).func
    try:
        name = call("cuFuncGetName", func)
    except CudaError:   # a library's kernel of a module the driver names otherwise: the node is still timed
        return "?"
    return name.decode() if isinstance(name, bytes) else str(name)
