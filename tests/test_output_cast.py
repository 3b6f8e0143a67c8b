"""A widening cast of a half GEMM's output folds into the GEMM (passes/epilogue.py): cuBLASLt writes
the float32 output itself (attrs out_dtype), where its rows are 16-byte aligned. With half_outputs
there is no widening at all: the float32 outputs are given in half (frontend/precision.py)."""
import os

import numpy as np
import pytest
from onnx import TensorProto, helper

import grapec
from grapec.plan import LibraryStep
from helpers import init, model, ort_run, rel_err, tinfo


def head(n: int, rows: int = 64, depth: int = 32):
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((depth, n)) / np.sqrt(depth)).astype(np.float32)
    return model([helper.make_node("MatMul", ["x", "w"], ["y"])],
                 [tinfo("x", TensorProto.FLOAT, [rows, depth])], [tinfo("y", TensorProto.FLOAT, [rows, n])],
                 [init("w", w)])


@pytest.mark.parametrize("n,folded", [(64, True), (50, False)])
def test_a_half_gemm_writes_its_float32_output_where_rows_are_aligned(n, folded):
    m = head(n)
    b = grapec.compile(m, precision="fp16", targets=[])
    steps = b.plans[0].steps
    gemm = [st for st in steps if isinstance(st, LibraryStep)]
    assert len(gemm) == 1
    assert (gemm[0].attrs.get("out_dtype") == "float32") is folded
    casts = [st for st in steps if not isinstance(st, LibraryStep) and "grapec_half_out_y" in st.origin]
    assert len(casts) == (0 if folded else 1)   # the output's cast kernel goes only with the fold
    assert b.plans[0].buffers[gemm[0].out].dtype == ("float32" if folded else "float16")
    x = np.random.default_rng(5).standard_normal((64, 32)).astype(np.float32)
    got = grapec.load(b, backend="cpu").run({"x": x})["y"]
    assert got.dtype == np.float32
    assert rel_err(got, ort_run(m, {"x": x})["y"]) < 2e-3


def test_few_rows_keep_the_cast_for_the_small_gemm_kernel():
    b = grapec.compile(head(64, rows=8), precision="fp16", targets=[])
    assert not any(isinstance(st, LibraryStep) and st.attrs.get("out_dtype") for st in b.plans[0].steps)


GPT2 = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models", "tiny", "gpt2.onnx")


def test_half_outputs_drop_the_widening_kernel_and_round_the_same_values():
    import onnx
    from grapec.bundle.inputs import bundle_inputs
    dims = {"batch": 2, "seq": 8}
    normal = grapec.compile(GPT2, dims=dims, precision="fp16", targets=[])
    half = grapec.compile(GPT2, dims=dims, precision="fp16", targets=[], half_outputs=True)
    assert [o["dtype"] for o in half.manifest["outputs"]] == ["float16"]
    assert half.manifest["mixed_precision"]["half_outputs"] is True
    assert not any("grapec_half_out_logits" in st.origin for st in half.plans[0].steps)
    assert any("grapec_half_out_logits" in st.origin for st in normal.plans[0].steps)
    feeds = bundle_inputs(half.manifest, 0, seed=4)
    got = grapec.load(half, backend="cpu").run(feeds)["logits"]
    assert got.dtype == np.float16
    # the float32 bundle widens the same half values exactly, so rounding them back gives these bits
    assert np.array_equal(grapec.load(normal, backend="cpu").run(feeds)["logits"].astype(np.float16), got)
    assert rel_err(got.astype(np.float32), ort_run(onnx.load(GPT2), feeds)["logits"]) < 1e-2


def test_an_output_a_float32_node_computes_is_rounded_to_half():
    m = model([helper.make_node("CumSum", ["x", "axis"], ["y"])], [tinfo("x", TensorProto.FLOAT, [4, 64])],
              [tinfo("y", TensorProto.FLOAT, [4, 64])], [init("axis", np.array(1, np.int64))])
    b = grapec.compile(m, precision="fp16", targets=[], half_outputs=True)
    assert b.manifest["mixed_precision"]["kept_fp32"], "CumSum stays float32"
    x = np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32)
    got = grapec.load(b, backend="cpu").run({"x": x})["y"]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), np.cumsum(x, axis=1), rtol=2e-3, atol=2e-3)


def test_half_outputs_need_a_half_precision():
    from click.testing import CliRunner
    from grapec.tools.cli import main
    r = CliRunner().invoke(main, ["compile", GPT2, "--dim", "batch=1", "--dim", "seq=4", "--half-outputs", "--no-gpu"])
    assert r.exit_code == 2 and "--half-outputs needs --precision fp16 or bf16" in r.output
