"""GPU: the sizes of a range family run from its formulas (runtime/cuda/family_exec.py): an exec per band
of sizes built at load from one member's plan, its loader computing each size's record from the dims,
library calls at the band's widest or set per shape variant; no size's plan joined on the request path;
every size equal to onnxruntime, and to the same sizes run with a plan each (GRAPEC_FAMILY_EXECS=0)."""
import os

import numpy as np
import onnxruntime as ort
import pytest

import grapec
from grapec.bundle.format import Bundle
from grapec.compiler import compile_model
from grapec.runtime.devices import gpu_count

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_count(), reason="needs an NVIDIA GPU")]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
W2V = os.path.join(ROOT, "models", "tiny", "wav2vec2.onnx")
LO, HI = 1600, 4000


@pytest.fixture(scope="module")
def w2v_range():
    b = compile_model(W2V, dims={"batch": 1}, dynamic={"samples": (LO, HI)}, precision="fp16")
    return Bundle.from_bytes(b.to_bytes())


def _samples(bundle, bucket: int) -> int:
    return bundle.manifest["buckets"][bucket]["shapes"]["input_values"][1]


def _picks(bundle, seed: int) -> list:
    docs = bundle.plans.docs
    rng = np.random.default_rng(seed)
    members = [b for f in docs.families for b in f.buckets]
    picks = [int(b) for b in rng.permutation(members)[:12]] + [int(b) for b in rng.permutation(docs.stored_buckets)[:4]]
    rng.shuffle(picks)
    return picks


def _rel(got, want) -> float:
    return float(np.linalg.norm(got.astype(np.float32) - want) / np.linalg.norm(want))


def test_family_sizes_run_from_their_formulas_and_match_onnxruntime(w2v_range, monkeypatch):
    monkeypatch.setenv("GRAPEC_FAMILY_EXECS", "all")
    docs = w2v_range.plans.docs
    sess = grapec.load(w2v_range, backend="cuda")
    fam = sess._runner.families
    assert fam.plans and not fam.skipped and len(fam.owner) == sum(len(f.all_buckets) for f in docs.families)
    sess.build_graphs()
    assert len(fam.execs) == len(fam.bands())
    joined = set(docs.base)   # family members whose plans were joined: only the bands' origins
    assert len(joined) <= len(fam.bands())
    ref = ort.InferenceSession(W2V, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(21)
    outs = {}
    for bucket in _picks(w2v_range, 21) * 2:
        n = _samples(w2v_range, bucket)
        x = rng.standard_normal((1, n)).astype(np.float32)
        got, want = sess.run({"input_values": x})["last_hidden_state"], ref.run(None, {"input_values": x})[0]
        assert got.shape == want.shape and _rel(got, want) < 1e-2, (n, _rel(got, want))   # fp16's own bound
        outs[bucket] = (x, got)
    assert set(docs.base) == joined                   # no plan joined on the request path
    assert sess._runner.switches["patched"] > 0
    # bound device buffers give the same as numpy in and out
    bucket = next(b for b in outs if fam.owns(b))
    x, got = outs[bucket]
    dev = sess.run({"input_values": x}, on_device=True)["last_hidden_state"]
    assert np.array_equal(sess.to_host(dev), got)
    # an IOBinding whose output stays in the session's buffer gets it as a device array, as a planned size does
    # (the family's path copied it to the host: the request paid a device-to-host copy it did not ask for)
    binding = sess.io_binding()
    binding.bind_input("input_values", x)
    binding.bind_output("last_hidden_state")
    sess.run_with_iobinding(binding)
    left = binding.get_outputs()["last_hidden_state"]
    assert hasattr(left, "__cuda_array_interface__"), type(left)
    assert np.array_equal(sess.to_host(left), got)
    sess._runner.close()
    # the same sizes with a plan each (the shared execs' way)
    monkeypatch.setenv("GRAPEC_FAMILY_EXECS", "0")
    plain = grapec.load(w2v_range, backend="cuda")
    assert not plain._runner.families.owner
    for bucket, (x, got) in outs.items():
        other = plain.run({"input_values": x})["last_hidden_state"]
        assert _rel(got, other.astype(np.float32)) < 2e-3, (bucket, _rel(got, other.astype(np.float32)))
    plain._runner.close()


def test_a_large_family_runs_from_its_formulas_by_default(monkeypatch):
    """Families of at least FAMILY_EXEC_MIN sizes run so without being asked; smaller ones join their plans."""
    monkeypatch.delenv("GRAPEC_FAMILY_EXECS", raising=False)
    from grapec.runtime.cuda.family_plan import FAMILY_EXEC_MIN
    b = Bundle.from_bytes(compile_model(W2V, dims={"batch": 1}, dynamic={"samples": (LO, 16000)},
                                        precision="fp16").to_bytes())
    families = b.plans.docs.families
    sizes = [len(f.buckets) for f in families]
    assert max(sizes) >= FAMILY_EXEC_MIN, sizes
    sess = grapec.load(b, backend="cuda")
    fam = sess._runner.families
    assert len(fam.owner) == sum(len(f.all_buckets) for f in families if len(f.buckets) >= FAMILY_EXEC_MIN)
    ref = ort.InferenceSession(W2V, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(22)
    for bucket in [int(x) for x in rng.choice(sorted(fam.owner), 6, replace=False)]:
        n = _samples(b, bucket)
        x = rng.standard_normal((1, n)).astype(np.float32)
        got = sess.run({"input_values": x})["last_hidden_state"]
        assert _rel(got, ref.run(None, {"input_values": x})[0]) < 1e-2, n
    sess._runner.close()


def test_a_2d_range_runs_from_its_formulas_with_no_node_set_at_a_switch(monkeypatch):
    """GPT-2 fp16 over batch x seq: its GEMMs run over all rows at each band's widest (the LM head's [batch, seq]
    rows too), so a switch between sizes of a band sets no node; random sizes equal onnxruntime."""
    monkeypatch.setenv("GRAPEC_FAMILY_EXECS", "all")
    gpt2 = os.path.join(ROOT, "models", "tiny", "gpt2.onnx")
    b = Bundle.from_bytes(compile_model(gpt2, dynamic={"batch": (1, 2), "seq": (1, 64)}, precision="fp16").to_bytes())
    sess = grapec.load(b, backend="cuda")
    fam = sess._runner.families
    assert fam.plans
    sess.build_graphs()
    assert not any(ex.params for ex in fam.execs.values())   # no shape variants
    ref = ort.InferenceSession(gpt2, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(23)
    owned = sorted(fam.owner)
    before = dict(sess._runner.switches)   # the load's own (the stored sizes' shared execs) are not requests'
    for bucket in [int(x) for x in rng.choice(owned, 16, replace=False)] * 2:
        batch, seq = b.manifest["buckets"][bucket]["shapes"]["input_ids"]
        feeds = {"input_ids": rng.integers(0, 256, (batch, seq)).astype(np.int64)}
        got, want = sess.run(feeds)["logits"], ref.run(None, feeds)[0]
        assert got.shape == want.shape and _rel(got, want) < 1e-2, (batch, seq, _rel(got, want))
    after = sess._runner.switches
    assert after["patched"] > before["patched"]   # the requests switched between sizes ...
    assert after["nodes_patched"] == before["nodes_patched"]   # ... and set no node
    sess._runner.close()


_SCALE = r"""
extern "C" __global__ void add_one(float* x, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; if (i < n) x[i] += 1.0f; }
extern "C" __global__ void scale(float* x, long long n, double k) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; if (i < n) x[i] *= k; }
"""


class _Chain:
    """x += 1; x *= k (the node whose variants are tried); x += 1: a graph on one buffer, checked against numpy."""

    def __init__(self):
        from cuda.bindings import driver as d

        from grapec.codegen.nvrtc import compile_cuda
        from grapec.runtime.cuda.driver import Device, call
        self.d, self.call = d, call
        self.dev = Device(0)
        if self.dev.cc < (9, 0):
            pytest.skip("thread block clusters need sm_90")
        module = call("cuModuleLoadData", compile_cuda(_SCALE, self.dev.arch))
        self.add_one, self.scale = (call("cuModuleGetFunction", module, name) for name in (b"add_one", b"scale"))
        self.n, self.keep = 1024, []
        self.x = self.dev.alloc(4 * self.n, "x")
        self.graph = call("cuGraphCreate", 0)
        first = call("cuGraphAddKernelNode", self.graph, [], 0, self.params(self.add_one))
        self.node = call("cuGraphAddKernelNode", self.graph, [first], 1, self.params(self.scale, 2.0))
        call("cuGraphAddKernelNode", self.graph, [self.node], 1, self.params(self.add_one))
        self.stream = call("cuStreamCreate", 0)
        self.rng = np.random.default_rng(24)

    def params(self, func, k=None):
        from grapec.runtime.cuda.driver import KernelArgs
        args = KernelArgs([self.x], [["i64", self.n]] + ([["f64", k]] if k is not None else []))
        self.keep.append(args)
        p = self.d.CUDA_KERNEL_NODE_PARAMS()
        p.func, p.gridDimX, p.gridDimY, p.gridDimZ = func, self.n // 128, 1, 1
        p.blockDimX, p.blockDimY, p.blockDimZ = 128, 1, 1
        p.kernelParams = args.address
        return p

    def clustered(self, k: float):
        """scale by k in clusters of 2, one kernel captured apart (as cuBLASLt's are): (graph, its kernel node)"""
        g = self.call("cuGraphCreate", 0)
        kernel = self.call("cuGraphAddKernelNode", g, [], 0, self.params(self.scale, k))
        value = self.d.CUkernelNodeAttrValue()
        value.clusterDim.x, value.clusterDim.y, value.clusterDim.z = 2, 1, 1
        self.call("cuGraphKernelNodeSetAttribute", kernel,
                  self.d.CUkernelNodeAttrID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, value)
        return g, kernel

    def check(self, exec_, k: float, what: str):
        host = self.rng.standard_normal(self.n).astype(np.float32)
        self.dev.upload(self.x, host.ctypes.data, host.nbytes)
        self.call("cuGraphLaunch", exec_, self.stream)
        self.call("cuStreamSynchronize", self.stream)
        got = np.empty_like(host)
        self.dev.download(got.ctypes.data, self.x, got.nbytes)
        np.testing.assert_allclose(got, (host + 1) * k + 1, rtol=1e-6, err_msg=what)


def test_a_disabled_kernel_node_keeps_parameters_set_while_it_was_off():
    """The driver behaviour a switch relies on: a node's parameters set while it is disabled run once enabled."""
    c = _Chain()
    call = c.call
    ex = call("cuGraphInstantiate", c.graph, 0)
    c.check(ex, 2.0, "as built")
    call("cuGraphNodeSetEnabled", ex, c.node, 0)
    c.check(ex, 1.0, "disabled: an empty node")
    call("cuGraphExecKernelNodeSetParams", ex, c.node, c.params(c.scale, 4.0))
    c.check(ex, 1.0, "set while disabled")
    call("cuGraphNodeSetEnabled", ex, c.node, 1)
    c.check(ex, 4.0, "enabled again")


def test_a_variant_of_another_cluster_runs_in_its_sibling_node():
    """A variant kernel of another thread block cluster (which a parameter update cannot change) gets a sibling
    node with the node's edges; holding a variant enables its node alone (family_exec._sibling, FamilyExecs._hold),
    each node taking several variants in turn."""
    from grapec.runtime.cuda.family_exec import BandExec, FamilyExecs, Variant, _form, _node_form, _sibling
    c = _Chain()
    call = c.call
    (g3, k3), (g5, k5) = c.clustered(3.0), c.clustered(5.0)
    assert _node_form(c.node) != _form(g3)
    assert _form(g3) == _form(g5) == ("kernel", (2, 1, 1))
    sibling = _sibling(c.graph, c.node, g3)
    assert call("cuGraphNodeGetDependencies", sibling, 0)[-1] == 1
    assert call("cuGraphNodeGetDependentNodes", sibling, 0)[-1] == 1
    ex = BandExec(0, np.arange(1), 0, exec=call("cuGraphInstantiate", c.graph, 0))
    set_kernel = "cuGraphExecKernelNodeSetParams"
    ex.siblings[0] = [c.node, sibling]
    ex.params[0] = [Variant(set_kernel, call("cuGraphKernelNodeGetParams", c.node), c.node, ()),
                    Variant(set_kernel, call("cuGraphKernelNodeGetParams", k3), sibling, ()),
                    Variant(set_kernel, call("cuGraphKernelNodeGetParams", k5), sibling, ()),
                    Variant(set_kernel, c.params(c.scale, 7.0), c.node, ())]
    ex.current[0] = -1
    for v in [0, 1, 2, 1, 3, 2, 0, 2, 3, 1]:
        FamilyExecs._hold(ex, 0, v)
        c.check(ex.exec, (2.0, 3.0, 5.0, 7.0)[v], f"variant {v}")
    # every variant in the sibling (none launches as the exec's own node): that node stays off
    ex = BandExec(0, np.arange(1), 0, exec=call("cuGraphInstantiate", c.graph, 0))
    ex.siblings[0] = [c.node, sibling]
    ex.params[0] = [Variant(set_kernel, call("cuGraphKernelNodeGetParams", k3), sibling, ()),
                    Variant(set_kernel, call("cuGraphKernelNodeGetParams", k5), sibling, ())]
    ex.current[0] = -1
    for v in [1, 0, 1]:
        FamilyExecs._hold(ex, 0, v)
        c.check(ex.exec, (3.0, 5.0)[v], f"sibling-only variant {v}")


def test_a_child_graph_node_cannot_be_disabled():
    """Why a variant of several kernels (a split-K GEMM and its reduction) gets no sibling and a child graph
    node's variants must all take its form (family_exec._variants): the driver refuses to disable such a node.
    Should a driver allow it, this fails, and child graph siblings become possible."""
    from grapec.runtime.cuda.driver import CudaError
    c = _Chain()
    call = c.call
    pair = call("cuGraphCreate", 0)
    first = call("cuGraphAddKernelNode", pair, [], 0, c.params(c.scale, 5.0))
    call("cuGraphAddKernelNode", pair, [first], 1, c.params(c.scale, 0.5))
    child = call("cuGraphAddChildGraphNode", c.graph, [c.node], 1, pair)
    ex = call("cuGraphInstantiate", c.graph, 0)
    with pytest.raises(CudaError, match="cuGraphNodeSetEnabled"):
        call("cuGraphNodeSetEnabled", ex, child, 0)


def test_profile_nodes_times_a_band_exec_and_puts_its_nodes_back(w2v_range, monkeypatch):
    """profile_nodes times each enabled node of a band exec alone (the loader, sized twins, library kernels) and
    leaves the exec as it found it: a variant's sibling nodes stay off, and the run after matches the run before."""
    from cuda.bindings import driver
    from grapec.runtime.cuda.driver import call, exec_ms
    from grapec.runtime.cuda.profile import profile_nodes
    T = driver.CUgraphNodeType
    switchable = (T.CU_GRAPH_NODE_TYPE_KERNEL, T.CU_GRAPH_NODE_TYPE_MEMCPY, T.CU_GRAPH_NODE_TYPE_MEMSET)
    monkeypatch.setenv("GRAPEC_FAMILY_EXECS", "all")
    sess = grapec.load(w2v_range, backend="cuda")
    fam = sess._runner.families
    bucket = next(b for f in w2v_range.plans.docs.families for b in f.buckets)
    n = _samples(w2v_range, bucket)
    x = {"input_values": np.random.default_rng(5).standard_normal((1, n)).astype(np.float32)}
    before = sess.run(x)["last_hidden_state"]
    ex = fam.switch(bucket)
    count = call("cuGraphGetNodes", ex.graph, 0)[-1]
    nodes = call("cuGraphGetNodes", ex.graph, count)[0][:count]
    types = [call("cuGraphNodeGetType", nd) for nd in nodes]
    state = [int(call("cuGraphNodeGetEnabled", ex.exec, nd)) if t in switchable else -1 for nd, t in zip(nodes, types)]
    times = profile_nodes(ex.graph, ex.exec, sess._runner.stream)
    assert [int(call("cuGraphNodeGetEnabled", ex.exec, nd)) if s >= 0 else -1 for nd, s in zip(nodes, state)] == state
    assert len(times) == state.count(1) + types.count(T.CU_GRAPH_NODE_TYPE_GRAPH)
    assert any("eval_sizes" in t.name for t in times), "the band exec's loader is timed"
    # each node alone costs its kernel and its gap in a replay: together about one replay of the whole exec (a
    # tiny model's nodes are 1-5 us, so the bound is loose; a node timed with the others on, or not at all, is not)
    replay_us = exec_ms(ex.exec, sess._runner.stream, 20) * 1e3
    total = sum(t.us for t in times)
    assert 0.3 * replay_us < total < 3 * replay_us, (total, replay_us)
    assert sum(t.us > 0 for t in times) >= 0.8 * len(times)
    np.testing.assert_array_equal(sess.run(x)["last_hidden_state"], before)


def test_bench_times_a_family_size_on_the_exec_a_run_launches(w2v_range, monkeypatch):
    """grapec bench at a range family's size times its band's exec (what Session.run launches), not a graph of
    the size's own plan, and --per-step there times each node of that exec."""
    from grapec.tools.bench import bench_grapec
    monkeypatch.setenv("GRAPEC_FAMILY_EXECS", "all")
    bucket = next(b for f in w2v_range.plans.docs.families for b in f.buckets)
    x = {"input_values": np.random.default_rng(6).standard_normal((1, _samples(w2v_range, bucket))).astype(np.float32)}
    res = bench_grapec(w2v_range, x, iters=20, warmup=3, per_step=True)
    assert res["exec"].startswith("the band exec of range family"), res["exec"]
    assert res["launches"] == 1 and "steps" not in res
    assert any("eval_sizes" in n["name"] for n in res["nodes"])
    assert 0 < res["replay"]["median_ms"] < 50
