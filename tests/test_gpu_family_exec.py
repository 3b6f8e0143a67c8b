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


def test_a_variant_of_another_launch_form_runs_in_its_sibling_node():
    """A variant whose launch form differs from its node's (a kernel of another thread block cluster, which a
    parameter update cannot change; two kernels where the node is one) gets a sibling node with the node's edges;
    holding a variant enables its node alone (family_exec._sibling, FamilyExecs._hold)."""
    from cuda.bindings import driver as d

    from grapec.codegen.nvrtc import compile_cuda
    from grapec.runtime.cuda.driver import Device, KernelArgs, call
    from grapec.runtime.cuda.family_exec import BandExec, FamilyExecs, Variant, _form, _node_form, _sibling
    dev = Device(0)
    if dev.cc < (9, 0):
        pytest.skip("thread block clusters need sm_90")
    module = call("cuModuleLoadData", compile_cuda(_SCALE, dev.arch))
    add_one, scale = (call("cuModuleGetFunction", module, name) for name in (b"add_one", b"scale"))
    n = 1024
    x = dev.alloc(4 * n, "x")
    keep = []

    def params(func, *scalars):
        args = KernelArgs([x], [["i64", n], *scalars])
        keep.append(args)
        p = d.CUDA_KERNEL_NODE_PARAMS()
        p.func, p.gridDimX, p.gridDimY, p.gridDimZ = func, n // 128, 1, 1
        p.blockDimX, p.blockDimY, p.blockDimZ = 128, 1, 1
        p.kernelParams = args.address
        return p

    graph = call("cuGraphCreate", 0)
    first = call("cuGraphAddKernelNode", graph, [], 0, params(add_one))
    node = call("cuGraphAddKernelNode", graph, [first], 1, params(scale, ["f64", 2.0]))
    call("cuGraphAddKernelNode", graph, [node], 1, params(add_one))
    # variant 1: scale by 3 in clusters of 2, captured apart as cuBLASLt's kernels are
    clustered = call("cuGraphCreate", 0)
    kernel = call("cuGraphAddKernelNode", clustered, [], 0, params(scale, ["f64", 3.0]))
    value = d.CUlaunchAttributeValue()
    value.clusterDim.x, value.clusterDim.y, value.clusterDim.z = 2, 1, 1
    call("cuGraphKernelNodeSetAttribute", kernel, d.CUkernelNodeAttrID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, value)
    # variant 2: two kernels (as a split-K GEMM and its reduction): scale by 5, then by 0.5
    pair = call("cuGraphCreate", 0)
    half = call("cuGraphAddKernelNode", pair, [], 0, params(scale, ["f64", 5.0]))
    call("cuGraphAddKernelNode", pair, [half], 1, params(scale, ["f64", 0.5]))
    forms = [_node_form(node), _form(clustered), _form(pair)]
    assert len(set(forms)) == 3 and forms[1] == ("kernel", (2, 1, 1)) and forms[2][0] == "graph", forms
    siblings = [_sibling(graph, node, clustered), _sibling(graph, node, pair)]
    for sibling in siblings:   # the node's edges: one in, one out
        assert call("cuGraphNodeGetDependencies", sibling, 0)[-1] == 1
        assert call("cuGraphNodeGetDependentNodes", sibling, 0)[-1] == 1
    ex = BandExec(0, np.arange(1), 0, exec=call("cuGraphInstantiate", graph, 0))
    ex.params[0] = [Variant("cuGraphExecKernelNodeSetParams", call("cuGraphKernelNodeGetParams", node), node, ()),
                    Variant("cuGraphExecKernelNodeSetParams", call("cuGraphKernelNodeGetParams", kernel), siblings[0], ()),
                    Variant("cuGraphExecChildGraphNodeSetParams", pair, siblings[1], ())]
    ex.current[0] = -1
    stream = call("cuStreamCreate", 0)
    rng = np.random.default_rng(24)
    for v in [0, 1, 1, 2, 0, 2, 1, 0]:
        FamilyExecs._hold(ex, 0, v)
        host = rng.standard_normal(n).astype(np.float32)
        dev.upload(x, host.ctypes.data, host.nbytes)
        call("cuGraphLaunch", ex.exec, stream)
        call("cuStreamSynchronize", stream)
        got = np.empty_like(host)
        dev.download(got.ctypes.data, x, got.nbytes)
        np.testing.assert_allclose(got, (host + 1) * (2.0, 3.0, 2.5)[v] + 1, rtol=1e-6, err_msg=f"variant {v}")
    call("cuGraphExecDestroy", ex.exec)
    dev.free(x)
