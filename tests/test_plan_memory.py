"""plan_memory: sharing is safe under every order the DAG allows, and the arena is near the bound."""
import numpy as np
import pytest
from onnx import helper

from grapec.compiler import compile_graph
from grapec.frontend.onnx_import import import_model
from grapec.ir.graph import outer_reads
from grapec.passes.plan_memory import ALIGN, plan_memory
from helpers import compile_and_run, model, tinfo


def lowered(m, shapes):
    # unfused, so that every ONNX value is a buffer the tests can name
    return compile_graph(import_model(m), shapes, fusion=False)


def happens_before_sets(g):
    prod = {o: i for i, n in enumerate(g.nodes) for o in n.outputs if o}
    anc = []
    for i, n in enumerate(g.nodes):
        a = set()
        for x in list(n.inputs) + sorted(outer_reads(n)):
            if x in prod:
                a |= {prod[x]} | anc[prod[x]]
        anc.append(a)
    return prod, anc


def assert_safe(g, mem):
    """Brute force: any two values whose bytes overlap must be ordered by the DAG (all uses of one
    before the other is written), unless they are views of each other."""
    prod, anc = happens_before_sets(g)
    root = {}
    for n in g.nodes:
        if n.op == "View":
            root[n.outputs[0]] = root.get(n.inputs[0], n.inputs[0])
    uses = {}
    for i, n in enumerate(g.nodes):
        for x in list(n.inputs) + sorted(outer_reads(n)):
            uses.setdefault(root.get(x, x), set()).add(i)
    end = len(g.nodes)
    for o in list(g.outputs) + list(g.inputs):   # inputs stay valid to the end (bound once, run many times)
        uses.setdefault(root.get(o, o), set()).add(end)
    storages = {root.get(k, k) for k in mem.offsets if not k.startswith("__")}
    storages = [s for s in storages if s in mem.offsets]

    def span(s):
        return mem.offsets[s], mem.offsets[s] + max(g.lookup(s).nbytes, 1)

    def before(a, b):
        wb = prod.get(b)
        if wb is None:  # graph input: written before everything
            return False
        return all(u != end and u != wb and u in anc[wb] for u in uses.get(a, {prod.get(a, -1)}))

    for i, a in enumerate(storages):
        for b in storages[i + 1:]:
            (a0, a1), (b0, b1) = span(a), span(b)
            if a0 < b1 and b0 < a1:
                assert before(a, b) or before(b, a), f"{a} and {b} share bytes but may be live together"


def diamond():
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"]),
             helper.make_node("Exp", ["b"], ["c"]), helper.make_node("Sin", ["x"], ["d"]),
             helper.make_node("Cos", ["d"], ["e"]), helper.make_node("Add", ["c", "e"], ["y"])]
    return model(nodes, [tinfo("x", shape=[64, 64])], [tinfo("y")])


def test_parallel_branches_never_share():
    g = lowered(diamond(), {"x": (64, 64)})
    mem = plan_memory(g)
    # in the linear order a is dead before d is written, but the branches may run concurrently
    a, d = mem.offsets["a"], mem.offsets["d"]
    assert abs(a - d) >= 64 * 64 * 4
    assert_safe(g, mem)


def test_chain_reuses_memory_and_runs_correctly():
    nodes, prev = [], "x"
    for i in range(12):
        nodes.append(helper.make_node("Sin" if i % 2 else "Cos", [prev], [f"t{i}"]))
        prev = f"t{i}"
    m = model(nodes, [tinfo("x", shape=[256, 256])], [tinfo(prev)])
    g = lowered(m, {"x": (256, 256)})
    mem = plan_memory(g)
    assert_safe(g, mem)
    one = 256 * 256 * 4
    assert mem.sum_bytes == 13 * one
    assert mem.arena_bytes <= 3 * one          # input, and two buffers ping-ponging
    assert mem.arena_bytes <= 1.2 * mem.lower_bound
    x = np.random.default_rng(1).standard_normal((256, 256)).astype(np.float32)
    out, _ = compile_and_run(m, {"x": x})
    ref = x
    for i in range(12):
        ref = np.sin(ref) if i % 2 else np.cos(ref)
    np.testing.assert_allclose(out[prev], ref, rtol=1e-5, atol=1e-6)


def test_random_dags_are_safe_and_correct():
    rng = np.random.default_rng(7)
    for trial in range(6):
        names, nodes = ["x"], []
        for i in range(25):
            a, b = rng.choice(names, 2)
            op = rng.choice(["Add", "Mul", "Sub"])
            nodes.append(helper.make_node(op, [a, b], [f"v{i}"]))
            names.append(f"v{i}")
        outs = [names[-1], names[len(names) // 2]]
        m = model(nodes, [tinfo("x", shape=[8, 32])], [tinfo(o) for o in outs])
        g = lowered(m, {"x": (8, 32)})
        mem = plan_memory(g)
        assert_safe(g, mem)
        x = rng.uniform(0.5, 1.0, (8, 32)).astype(np.float32)
        got, _ = compile_and_run(m, {"x": x})
        env = {"x": x.astype(np.float64)}
        for n in nodes:
            f = {"Add": np.add, "Mul": np.multiply, "Sub": np.subtract}[n.op_type]
            env[n.output[0]] = f(env[n.input[0]], env[n.input[1]])
        for o in outs:
            np.testing.assert_allclose(got[o], env[o], rtol=1e-4, atol=1e-4)


def test_report_has_the_three_numbers():
    g = lowered(diamond(), {"x": (64, 64)})
    r = plan_memory(g).report()
    assert r["live_lower_bound_bytes"] <= r["arena_bytes"] <= r["sum_intermediate_bytes"] + 10 * ALIGN


@pytest.mark.parametrize("name,shapes", [("gpt2", {"input_ids": (1, 8)}), ("googlenet", {"input": (1, 3, 64, 64)})])
def test_zoo_arena_within_1_2x_of_the_live_set_lower_bound(name, shapes):
    import os
    from grapec.frontend.onnx_import import load_model
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    g = lowered(load_model(os.path.join(root, "models", "tiny", f"{name}.onnx")), shapes)
    mem = plan_memory(g)
    assert_safe(g, mem)
    assert mem.schedule_peak <= mem.lower_bound <= mem.arena_bytes
    assert mem.arena_bytes <= 1.2 * mem.lower_bound, mem.report()
    assert mem.arena_bytes < 0.5 * mem.sum_bytes, mem.report()
