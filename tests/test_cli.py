"""The CLI as a new user meets it: each bad input gives one clear message, exit code 2, no traceback."""
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from helpers import init, model, tinfo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def grapec(*args, cwd=None):
    # the CLI sees the packages this process sees (a GPU machine's onnxruntime-gpu, nvmath), ours first
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.path.join(ROOT, "src"), os.environ.get("PYTHONPATH")])))
    env.pop("GRAPEC_DEBUG", None)
    p = subprocess.run([sys.executable, "-m", "grapec.tools.cli", *map(str, args)], capture_output=True, text=True,
                       env=env, cwd=cwd, timeout=300)
    return p.returncode, p.stdout, p.stderr


def assert_user_error(rc, out, err, *needles):
    assert rc == 2, (rc, out, err)
    assert "Traceback" not in out + err
    for n in needles:
        assert n in err, (n, err)


@pytest.fixture
def mlp(tmp_path):
    rng = np.random.default_rng(0)
    m = model([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
              [tinfo("x", shape=["batch", 8])], [tinfo("y")], [init("w", rng.standard_normal((8, 4)).astype(np.float32))])
    p = tmp_path / "mlp.onnx"
    onnx.save(m, str(p))
    return p


def test_good_path_compile_inspect_run_check(mlp, tmp_path):
    out = tmp_path / "mlp.grape"
    rc, _, err = grapec("compile", mlp, "-o", out, "--dim", "batch=3")
    assert rc == 0, err
    assert "wrote" in err and out.exists()
    rc, text, _ = grapec("inspect", out)
    assert rc == 0 and "x: float32['batch', 8]" in text and "arena" in text
    rc, text, err = grapec("run", out, "--backend", "cpu")
    assert rc == 0, err
    assert "cpu backend" in text and "y: float32[3, 4]" in text
    rc, text, err = grapec("check", mlp, "--dim", "batch=2")
    assert rc == 0, text + err
    assert "PASS" in text


def test_a_closed_output_pipe_ends_the_cli_quietly(mlp, tmp_path):
    """`grapec inspect m.grape | head -1`: the reader is gone before grapec writes. No message, no
    traceback, the exit code `cat` would give (141)."""
    out = tmp_path / "mlp.grape"
    assert grapec("compile", mlp, "-o", out, "--dim", "batch=3")[0] == 0
    # the CLI sees the packages this process sees (a GPU machine's onnxruntime-gpu, nvmath), ours first
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.path.join(ROOT, "src"), os.environ.get("PYTHONPATH")])))
    p = subprocess.Popen([sys.executable, "-m", "grapec.tools.cli", "inspect", str(out)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env)
    p.stdout.close()   # before the interpreter has even started: every write meets a closed pipe
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141, err
    assert err == "", err


def test_missing_file(tmp_path):
    assert_user_error(*grapec("compile", tmp_path / "nope.onnx"), "nope.onnx", "no such file")


def test_not_onnx(tmp_path):
    p = tmp_path / "notes.onnx"
    p.write_text("these are not the weights you are looking for\n" * 10)
    assert_user_error(*grapec("compile", p), "notes.onnx", "not an ONNX model")


def test_unsupported_ops_all_named_at_once(tmp_path):
    m = model([helper.make_node("Relu", ["x"], ["a"]),
               helper.make_node("StringNormalizer", ["a"], ["b"], name="norm1"),
               helper.make_node("TfIdfVectorizer", ["b"], ["y"], name="tfidf")],
              [tinfo("x", shape=[2])], [tinfo("y")])
    p = tmp_path / "u.onnx"
    onnx.save(m, str(p))
    assert_user_error(*grapec("compile", p), "StringNormalizer", "norm1", "TfIdfVectorizer", "tfidf", "opset 17")


def test_dynamic_dim_not_given(mlp):
    rc, out, err = grapec("compile", mlp)
    assert_user_error(rc, out, err, "input 'x' dim 0 ('batch')", "--dim batch=N")


def test_bundle_truncated_by_one_byte(mlp, tmp_path):
    out = tmp_path / "m.grape"
    assert grapec("compile", mlp, "-o", out, "--dim", "batch=1")[0] == 0
    data = out.read_bytes()
    bad = tmp_path / "cut.grape"
    bad.write_bytes(data[:-1])
    assert_user_error(*grapec("run", bad, "--backend", "cpu"), "cut.grape", "truncated")


def test_bundle_with_one_byte_flipped(mlp, tmp_path):
    out = tmp_path / "m.grape"
    assert grapec("compile", mlp, "-o", out, "--dim", "batch=1")[0] == 0
    data = bytearray(out.read_bytes())
    data[len(data) // 2] ^= 0x10
    bad = tmp_path / "flip.grape"
    bad.write_bytes(bytes(data))
    assert_user_error(*grapec("inspect", bad), "flip.grape", "corrupted")


def test_wrong_input_name_shape_dtype_at_run(mlp, tmp_path):
    out = tmp_path / "m.grape"
    assert grapec("compile", mlp, "-o", out, "--dim", "batch=2")[0] == 0
    good = tmp_path / "good.npy"
    np.save(good, np.ones((2, 8), np.float32))
    assert grapec("run", out, "--backend", "cpu", "--input", f"x={good}")[0] == 0
    assert_user_error(*grapec("run", out, "--backend", "cpu", "--input", f"z={good}"), "unknown input(s) 'z'", "'x'")
    shp = tmp_path / "shape.npy"
    np.save(shp, np.ones((5, 8), np.float32))
    assert_user_error(*grapec("run", out, "--backend", "cpu", "--input", f"x={shp}"), "x=5x8", "x=2x8")
    dt = tmp_path / "dtype.npy"
    np.save(dt, np.ones((2, 8), np.int32))
    assert_user_error(*grapec("run", out, "--backend", "cpu", "--input", f"x={dt}"), "input 'x'", "float32", "int32")


def test_buckets_one_plan_each_picked_by_input_shape(mlp, tmp_path):
    out = tmp_path / "b.grape"
    rc, _, err = grapec("compile", mlp, "-o", out, "--bucket", "batch=2", "--bucket", "batch=5")
    assert rc == 0, err
    assert "bucket 0 x=2x8" in err and "bucket 1 x=5x8" in err
    rc, text, _ = grapec("inspect", out)
    assert "bucket 0 (x=2x8)" in text and "bucket 1 (x=5x8)" in text, text
    five = tmp_path / "five.npy"
    np.save(five, np.ones((5, 8), np.float32))
    rc, text, err = grapec("run", out, "--backend", "cpu", "--input", f"x={five}")
    assert rc == 0 and "y: float32[5, 4]" in text, text + err
    assert_user_error(*grapec("compile", mlp, "-o", out, "--bucket", "batch=2", "--bucket", "batch=2"),
                      "bucket 1 (x=2x8) repeats bucket 0")
    assert_user_error(*grapec("compile", mlp, "-o", out, "--bucket", "batch"), "--bucket: expected NAME=N")


def test_bench_vs_ort_without_its_cuda_provider_says_so(mlp):
    import onnxruntime
    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("onnxruntime's CUDA provider is installed here")
    assert_user_error(*grapec("bench", mlp, "--dim", "batch=2", "--vs", "ort"), "--vs ort", "CUDA provider",
                      "onnxruntime-gpu")


def test_check_against_onnxruntime_cuda_without_its_provider_says_so(mlp):
    import onnxruntime
    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("onnxruntime's CUDA provider is installed here")
    assert_user_error(*grapec("check", mlp, "--dim", "batch=2", "--backend", "cpu", "--reference", "onnxruntime-cuda"),
                      "--reference onnxruntime-cuda", "CUDA provider is not installed", "onnxruntime-gpu")


@pytest.mark.gpu
def test_check_against_onnxruntime_cuda_and_bench_vs_ort(mlp):
    """On a GPU machine with onnxruntime-gpu: check compares with its CUDA provider, bench times it."""
    import onnxruntime
    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        pytest.skip("onnxruntime-gpu (its CUDA provider) is not installed here")
    gpt2 = os.path.join(ROOT, "models", "tiny", "gpt2.onnx")
    rc, out, err = grapec("check", gpt2, "--dim", "batch=1,seq=8", "--backend", "cuda", "--reference", "onnxruntime-cuda")
    assert rc == 0, (out, err)
    assert "PASS" in out and "vs onnxruntime CUDA (no TF32)" in out
    rc, out, err = grapec("bench", gpt2, "--dim", "batch=1,seq=8", "--vs", "ort", "--iterations", "50")
    assert rc == 0, (out, err)
    assert "onnxruntime CUDA graph" in out, out


def test_bench_vs_host_control_needs_the_onnx_model(mlp, tmp_path):
    bundle = tmp_path / "mlp.grape"
    assert grapec("compile", mlp, "-o", bundle, "--dim", "batch=2", "--no-gpu")[0] == 0
    assert_user_error(*grapec("bench", bundle, "--vs", "host-control"), "--vs host-control", ".onnx")


def test_compile_never_overwrites_a_foreign_file(mlp, tmp_path):
    precious = tmp_path / "precious.grape"
    precious.write_text("my notes")
    assert_user_error(*grapec("compile", mlp, "-o", precious, "--dim", "batch=1"), "refusing to overwrite")
    assert precious.read_text() == "my notes"
    assert_user_error(*grapec("compile", mlp, "-o", mlp, "--dim", "batch=1"), "overwrite the input model")


def test_help_teaches():
    rc, out, _ = grapec("--help")
    assert rc == 0 and "grapec compile model.onnx" in out
    rc, out, _ = grapec("compile", "--help")
    assert rc == 0 and "--shapes" in out and "--dim" in out and "--strict" in out


def test_bench_finds_the_zoo_builders_from_a_script_outside_tests(tmp_path):
    """`grapec bench --vs torch` builds the peer from models/zoo.py, found from the package's own
    place in the repository (a path that broke when the tools moved into src/grapec/tools/)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    script = ("import sys; sys.path[:] = [p for p in sys.path if not p.rstrip('/').endswith(('tests', 'models'))]; "
              "from grapec.tools.bench import zoo_module; print(type(zoo_module('gpt2', 'tiny')).__name__)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "GPT2Logits", done.stderr[-2000:]
