"""`grapec export-triton`: the config Triton gets from a bundle, and a real round trip: tritonserver
(nvidia-pytriton's, in .venv-triton: `make test` builds it) serving the exported model, requests sent
with tritonclient over HTTP on 127.0.0.1, answers compared with grapec in this process and with
onnxruntime. On the CPU backend here; on a GPU, GRAPEC_TRITON_BACKEND=cuda serves the same test on it."""
import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest

import grapec
from grapec.bundle.format import Bundle
from grapec.errors import GrapecError, InputError
from grapec.serve.triton import export_triton, triton_config

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from triton_server import TritonServer, pytriton_dir, venv_python  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPT2 = os.path.join(ROOT, "models", "tiny", "gpt2.onnx")
GENERATE = os.path.join(ROOT, "models", "tiny", "gpt2_generate.onnx")   # scalar inputs, a scalar output, a Loop
BACKEND = os.environ.get("GRAPEC_TRITON_BACKEND", "cpu")


@pytest.fixture(scope="module")
def bucketed(tmp_path_factory):
    """tiny GPT-2 with two buckets, seq 8 and 16 (GPU code too where the test serves on the GPU)."""
    path = str(tmp_path_factory.mktemp("bundle") / "gpt2.grape")
    grapec.compile(GPT2, dims={"batch": 1}, bucket_dims=[{"seq": 8}, {"seq": 16}],
                   targets="auto" if BACKEND == "cuda" else []).write(path)
    return path


def rng_ids(lo, hi, shape, seed=9):
    return np.random.default_rng(seed).integers(lo, hi, shape, dtype=np.int64)


def config_lines(text):
    return [line.strip().rstrip(",") for line in text.splitlines()]


def test_dims_vary_where_the_buckets_differ(bucketed):
    text = triton_config(Bundle.read(bucketed), "gpt2", "cpu")
    lines = config_lines(text)
    assert '{ name: "input_ids", data_type: TYPE_INT64, dims: [ 1, -1 ] }' in lines
    assert '{ name: "logits", data_type: TYPE_FP32, dims: [ 1, -1, 256 ] }' in lines
    assert "instance_group [ { kind: KIND_CPU, count: 1 } ]" in lines
    assert "max_batch_size: 0" in lines


def test_one_bucket_gives_exact_dims_and_gpu_instances(tmp_path):
    b = grapec.compile(GPT2, dims={"batch": 1, "seq": 8}, targets=[])
    lines = config_lines(triton_config(b, "g", "cuda", instances=2))
    assert '{ name: "input_ids", data_type: TYPE_INT64, dims: [ 1, 8 ] }' in lines
    assert '{ name: "logits", data_type: TYPE_FP32, dims: [ 1, 8, 256 ] }' in lines
    assert "instance_group [ { kind: KIND_GPU, count: 2 } ]" in lines
    # each instance builds every size's graph as it loads (serve/triton_model.py)
    assert 'parameters: { key: "grapec_build_graphs", value: { string_value: "true" } }' in lines


def test_an_input_fixed_at_compile_time_is_optional_and_scalars_are_reshaped():
    from onnx import TensorProto, helper
    from helpers import model, tinfo
    m = model([helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("Mul", ["r", "s"], ["y"])],
              [tinfo("x", shape=[2, 6]), tinfo("shape", TensorProto.INT64, [2]), tinfo("s", shape=[])], [tinfo("y")])
    b = grapec.compile(m, values={"shape": [3, 4]}, targets=[])
    lines = config_lines(triton_config(b, "g", "cpu"))
    assert '{ name: "shape", data_type: TYPE_INT64, dims: [ 2 ], optional: true }' in lines
    assert '{ name: "s", data_type: TYPE_FP32, dims: [ 1 ] }' in lines   # a scalar travels as [1]
    assert '{ name: "y", data_type: TYPE_FP32, dims: [ 3, 4 ] }' in lines


def test_a_dynamic_range_is_minus_one():
    b = grapec.compile(GPT2, dims={"batch": 1}, dynamic={"seq": (2, 4)}, targets=[], jobs=1)
    lines = config_lines(triton_config(b, "g", "cpu"))
    assert '{ name: "input_ids", data_type: TYPE_INT64, dims: [ 1, -1 ] }' in lines
    assert '{ name: "logits", data_type: TYPE_FP32, dims: [ 1, -1, 256 ] }' in lines


def test_export_is_refused_where_it_would_overwrite_or_cannot_serve(bucketed, tmp_path):
    repo = str(tmp_path / "repo")
    path = export_triton(bucketed, repo, backend="cpu")
    assert sorted(os.listdir(path)) == ["1", "config.pbtxt"]
    assert sorted(os.listdir(os.path.join(path, "1"))) == ["model.grape", "model.py"]
    with open(os.path.join(path, "1", "model.grape"), "rb") as f, open(bucketed, "rb") as g:
        assert f.read() == g.read()
    before = os.path.getmtime(os.path.join(path, "config.pbtxt"))
    with pytest.raises(InputError, match="exists; choose another --name or pass --overwrite"):
        export_triton(bucketed, repo, backend="cpu")
    assert os.path.getmtime(os.path.join(path, "config.pbtxt")) == before
    export_triton(bucketed, repo, backend="cpu", instances=3, overwrite=True)
    with open(os.path.join(path, "config.pbtxt")) as f:
        assert "count: 3" in f.read()
    assert sorted(os.listdir(repo)) == ["gpt2"]   # no temporary directory left behind
    with pytest.raises(InputError, match="Triton model name"):
        export_triton(bucketed, repo, name="a b", backend="cpu")
    cpu_only = str(tmp_path / "cpu.grape")
    grapec.compile(GPT2, dims={"batch": 1, "seq": 8}, targets=[]).write(cpu_only)
    with pytest.raises(InputError, match="has no GPU code"):
        export_triton(cpu_only, repo, backend="cuda")
    with pytest.raises(GrapecError, match="no such file"):
        export_triton(str(tmp_path / "missing.grape"), repo)


def test_the_cli_writes_the_model_and_refuses_with_exit_2(bucketed, tmp_path):
    repo = str(tmp_path / "repo")
    cmd = [sys.executable, "-m", "grapec.tools.cli", "export-triton", bucketed, repo, "--backend", "cpu", "--name", "m"]
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "src")}
    first = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert first.returncode == 0, first.stderr
    assert "wrote" in first.stdout and os.path.exists(os.path.join(repo, "m", "config.pbtxt"))
    again = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert again.returncode == 2 and "exists" in again.stderr and "Traceback" not in again.stderr


def send(server, model, requests: dict, tmp_path) -> dict:
    """requests: {name: {input: array}} -> {name: {output: array} | {"error": message}}, "config": dict."""
    req, res = str(tmp_path / "requests.npz"), str(tmp_path / "results.npz")
    np.savez(req, **{f"{r}/{n}": a for r, feeds in requests.items() for n, a in feeds.items()})
    out = subprocess.run([venv_python(), os.path.join(os.path.dirname(__file__), "triton_client.py"), server.url,
                          model, req, res], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr + server.logs()
    data = np.load(res)
    answers = {"config": json.loads(str(data["config"]))}
    for key in data.files:
        if key != "config":
            r, name = key.split("/", 1)
            answers.setdefault(r, {})[name] = str(data[key]) if name == "error" else data[key]
    return answers


@pytest.mark.skipif(pytriton_dir() is None, reason="no Triton venv (.venv-triton): `make test` builds it")
def test_triton_serves_the_bundle_round_trip(bucketed, tmp_path):
    if BACKEND == "cuda":
        from grapec.runtime.devices import cuda_backend_available, gpu_count
        if not (gpu_count() and cuda_backend_available()):
            pytest.skip("GRAPEC_TRITON_BACKEND=cuda needs a GPU")
    repo = str(tmp_path / "repo")
    export_triton(bucketed, repo, name="gpt2", backend=BACKEND)
    generate = str(tmp_path / "generate.grape")
    grapec.compile(GENERATE, targets="auto" if BACKEND == "cuda" else []).write(generate)
    export_triton(generate, repo, name="generate", backend=BACKEND)
    prompt = {"prompt_ids": rng_ids(0, 256, (1, 8)), "max_new_tokens": np.array([12], np.int64),
              "eos_token_id": np.array([-1], np.int64)}
    vocab = Bundle.read(bucketed).manifest["inputs"][0]["value_range"]["hi"] + 1
    rng = np.random.default_rng(5)
    good = {f"r{i}": {"input_ids": rng.integers(0, vocab, (1, 8 if i % 2 else 16), dtype=np.int64)} for i in range(8)}
    bad = {"short": {"input_ids": rng.integers(0, vocab, (1, 5), dtype=np.int64)},
           "oov": {"input_ids": np.full((1, 8), vocab + 7, np.int64)}}
    with TritonServer(repo, str(tmp_path)) as server:
        answers = send(server, "gpt2", {**good, **bad}, tmp_path)
        generated = send(server, "generate", {"g": prompt}, tmp_path)
    config = answers["config"]   # as the server read it (--strict-model-config: nothing filled in)
    assert [i["dims"] for i in config["input"]] == [[1, -1]]
    assert [o["dims"] for o in config["output"]] == [[1, -1, 256]]
    assert config["instance_group"][0]["kind"] == ("KIND_GPU" if BACKEND == "cuda" else "KIND_CPU")
    local = grapec.load(bucketed, backend=BACKEND)
    import onnxruntime as ort
    ref_sess = ort.InferenceSession(onnx.load(GPT2).SerializeToString(), providers=["CPUExecutionProvider"])
    for r, feeds in good.items():
        assert "error" not in answers[r], answers[r]
        got = answers[r]["logits"]
        mine = local.run(feeds)["logits"]
        # the served bundle is the same computation: to float32's last bits, not bit for bit, as the server runs
        # in .venv-triton's numpy (<2, pytriton's pin) whose OpenBLAS sums a GEMM's products in another order than
        # the test's numpy on some CPUs (a 2-core Xeon: 1 ulp apart at 90% of the logits); another computation
        # (a wrong bucket, a dropped op) is 1e-3 apart or more
        np.testing.assert_allclose(got, mine, rtol=1e-5, atol=1e-6)
        ref = ref_sess.run(None, feeds)[0]
        rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        assert rel < 1e-4 and np.allclose(got, ref, rtol=1e-3, atol=1e-4), (r, rel, np.abs(got - ref).max())
    # scalars travel as [1] both ways (Triton has no rank 0 without batching); the model reshapes them
    gen_config = {i["name"]: i for i in generated["config"]["input"]}
    assert gen_config["max_new_tokens"]["dims"] == [1]
    assert generated["g"]["num_generated"].shape == (1,)
    want = grapec.load(generate, backend=BACKEND).run({k: v.reshape(()) if k != "prompt_ids" else v
                                                      for k, v in prompt.items()})
    assert "error" not in generated["g"], generated["g"]
    assert int(generated["g"]["num_generated"].reshape(-1)[0]) == int(want["num_generated"]) == 12
    np.testing.assert_array_equal(generated["g"]["generated"], want["generated"])
    assert "no bucket for input shapes input_ids=1x5" in answers["short"]["error"]
    assert "outside the valid range" in answers["oov"]["error"] and "input 'input_ids'" in answers["oov"]["error"]
