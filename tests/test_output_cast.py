"""A widening cast of a half GEMM's output folds into the GEMM (passes/epilogue.py): cuBLASLt writes
the float32 output itself (attrs out_dtype), where its rows are 16-byte aligned."""
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
