"""The stream scheduler (passes/streams.py), its edges (hazards.py) and its simulation
(cost/simulate.py), on the CPU: every zoo model gives the same answer in any order its edges allow,
and every reuse of arena bytes is ordered by them."""
import copy
import os

import numpy as np
import pytest
from click.testing import CliRunner

import grapec
from grapec.bundle.format import Bundle
from grapec.cost.simulate import Task, simulate
from grapec.errors import BundleError
from grapec.passes.hazards import conflict_deps, reduce_deps, unordered_conflicts
from grapec.bundle.inputs import bundle_inputs
from grapec.plan import chain_deps, walk_steps
from grapec.runtime.cpu.runner import CpuPlanRunner
from test_models import LIGHT, LIGHT_MODELS, TINY, ZOO_DIMS

ORDER_SEEDS = (1, 2, 3)


def _compile(name, **kw):
    return grapec.compile(os.path.join(TINY, f"{name}.onnx"), dims=ZOO_DIMS[name], targets=[], **kw)


@pytest.fixture(scope="module", params=sorted(ZOO_DIMS))
def zoo_bundle(request):
    return request.param, _compile(request.param)


def test_random_orders_give_identical_outputs_on_every_zoo_model(zoo_bundle):
    name, b = zoo_bundle
    feeds = bundle_inputs(b.manifest, 0, 7)
    ref = CpuPlanRunner(b).run(0, feeds)
    for seed in ORDER_SEEDS:
        got = CpuPlanRunner(b, order_seed=seed).run(0, feeds)
        for k in ref:
            assert np.array_equal(got[k], ref[k], equal_nan=True), f"{name}: output {k} changed in random order {seed}"


def test_every_reuse_of_arena_bytes_is_ordered_on_every_zoo_model(zoo_bundle):
    name, b = zoo_bundle
    for plan in b.plans:
        assert unordered_conflicts(plan.steps, plan.buffers) == [], name


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_every_reuse_of_arena_bytes_is_ordered_on_light_models(name):
    b = grapec.compile(os.path.join(LIGHT, f"light_{name}.onnx"), targets=[])
    plan = b.plans[0]
    assert unordered_conflicts(plan.steps, plan.buffers) == []


def test_the_checker_and_random_orders_catch_missing_edges():
    """Without its edges a plan's reuse of bytes is unordered: the checker names the pairs (data and
    reuse alike), and random orders change the answer."""
    b = _compile("googlenet", max_branches=1)
    plan = b.plans[0]
    assert unordered_conflicts(plan.steps, plan.buffers) == []
    broken = copy.copy(b)
    broken.plans = [copy.deepcopy(plan)]
    for st in broken.plans[0].steps:
        st.deps = []
    problems = unordered_conflicts(broken.plans[0].steps, plan.buffers)
    assert any("read after write" in p for p in problems)
    assert any("write after read" in p for p in problems), "plan_memory reused no bytes?"
    feeds = bundle_inputs(b.manifest, 0, 7)
    ref = CpuPlanRunner(b).run(0, feeds)
    changed = [not all(np.array_equal(CpuPlanRunner(broken, order_seed=s).run(0, feeds)[k], ref[k]) for k in ref)
               for s in ORDER_SEEDS]
    assert any(changed)


def test_inception_blocks_get_parallel_branches_and_serial_keeps_one_chain():
    par = _compile("inception_v3")
    s = par.manifest["buckets"][0]["schedule"]
    assert s["branches"] > 1 and s["simulated_us"] < s["serial_us"], s
    steps = par.plans[0].steps
    assert len({st.branch for st in steps}) == s["branches"]
    assert any(len(st.deps) > 1 for st in steps), "no step joins branches"
    assert sum(not st.deps for st in steps) >= 1
    ser = _compile("inception_v3", max_branches=1)
    assert ser.manifest["buckets"][0]["schedule"]["branches"] == 1
    assert [st.deps for st in ser.plans[0].steps] == chain_deps(len(ser.plans[0].steps))
    assert par.plans[0].arena_bytes == ser.plans[0].arena_bytes   # plan_memory already planned for any order


def test_a_chain_stays_serial():
    """GPT-2's decoder is one chain of dependent steps: nothing to run beside anything."""
    s = _compile("gpt2").manifest["buckets"][0]["schedule"]
    assert s["branches"] == 1 and s["order"] == "serial", s


def test_region_bodies_are_chains_with_edges():
    b = _compile("gpt2_generate")
    for st in walk_steps(b.plans[0].steps):
        assert st.deps is not None
    assert unordered_conflicts(b.plans[0].steps, b.plans[0].buffers) == []


def test_edges_survive_the_bundle_and_a_forward_edge_is_refused(tmp_path):
    b = _compile("googlenet")
    path = str(tmp_path / "g.grape")
    b.write(path)
    back = Bundle.read(path)
    assert [(st.deps, st.branch) for st in back.plans[0].steps] == [(st.deps, st.branch) for st in b.plans[0].steps]
    b.plans[0].steps[3].deps = [5]
    b.write(path)
    with pytest.raises(BundleError, match="does not come before"):
        Bundle.read(path)


def test_reduce_deps_drops_implied_edges_only():
    deps = [[], [0], [0, 1], [1, 2], [0]]
    assert reduce_deps(deps) == [[], [0], [1], [2], [0]]


def test_conflicts_ignore_two_readers():
    b = _compile("googlenet")
    plan = b.plans[0]
    deps = conflict_deps(plan.steps, plan.buffers)
    # the branches of an inception block read one input (its convolutions through Views of the
    # stored Concat: other buffers over the same bytes): reading it together needs no edge
    readers = {}
    for j, st in enumerate(plan.steps):
        for a in getattr(st, "args", []):
            if a >= 0 and plan.buffers[a].space == "arena":
                buf = plan.buffers[a]
                readers.setdefault((buf.offset, buf.nbytes), []).append(j)
    shared = [js for js in readers.values() if len(set(js)) > 2]
    assert shared, "no value with several readers"
    assert any(any(js[0] not in deps[j] for j in js[1:]) for js in shared)


def test_simulation_shares_the_gpu():
    half, full = Task(10.0, 0.5, 0.0, False), Task(10.0, 1.0, 0.0, False)
    assert simulate([half, half], [[], []], gap_us=0.0, issue_us=0.0).makespan == pytest.approx(10.0)
    assert simulate([full, full], [[], []], gap_us=0.0, issue_us=0.0).makespan == pytest.approx(20.0)
    assert simulate([half, half], [[], [0]], gap_us=2.0, issue_us=0.0).makespan == pytest.approx(22.0)
    memory = Task(10.0, 0.4, 1.0, False)
    assert simulate([memory, memory], [[], []], gap_us=0.0, issue_us=0.0).makespan == pytest.approx(20.0)


def test_cli_serial_and_inspect_schedule(tmp_path):
    from grapec.tools.cli import main
    model = os.path.join(TINY, "googlenet.onnx")
    out = str(tmp_path / "g.grape")
    r = CliRunner().invoke(main, ["compile", model, "--dim", "batch=1", "--no-gpu", "-o", out, "-q"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["inspect", "--schedule", out])
    assert r.exit_code == 0, r.output
    assert "branch 1" in r.output and "simulated timeline" in r.output and "shorter than one chain" in r.output
    r = CliRunner().invoke(main, ["compile", model, "--dim", "batch=1", "--no-gpu", "-o", out, "-q", "--serial"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["inspect", "--schedule", out])
    assert "--serial: one chain" in r.output and "branch 1" not in r.output
    r = CliRunner().invoke(main, ["compile", model, "--dim", "batch=1", "--no-gpu", "-o", out, "--max-branches", "0"])
    assert r.exit_code == 2 and "--max-branches" in r.output
