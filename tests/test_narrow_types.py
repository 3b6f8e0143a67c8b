"""8-, 4- and 2-bit types (float8 in four flavours, float4e2m1, int4/uint4, int2/uint2).

The generated C conversions (codegen/cuda.py NARROW_CONVERSIONS, the same code NVRTC compiles for
the GPU) are compiled for the host and checked bit for bit against ml_dtypes, which onnx's reference
uses: every code decodes, and every float16 value plus a million random float32 bit patterns
encode, to what ml_dtypes gives. Then ONNX's node tests for these types run through both the numpy
interpreter and the host-compiled generated code."""
import ctypes
import shutil
import subprocess

import ml_dtypes
import numpy as np
import pytest

import grapec
from grapec import dtypes
from grapec.codegen.cuda import _MINIFLOAT
from grapec.tools.onnx_backend import _as_array, node_testcases, run_case

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to compile the generated C for the host")


def _probe_source() -> str:
    from grapec.codegen.prelude import COMMON, NARROW_CONVERSIONS, TYPES
    from grapec.codegen.host import HOST_SHIM
    fns = []
    for i, (dt, (e, m, b, k)) in enumerate(sorted(_MINIFLOAT.items())):
        fns.append(f'extern "C" void dec{i}(const unsigned char* x, float* y, long n) '
                   f'{{ for (long j = 0; j < n; ++j) y[j] = g_mf_decode<{e}, {m}, {b}, {k}>(x[j]); }}')
        fns.append(f'extern "C" void enc{i}(const float* x, unsigned char* y, long n) '
                   f'{{ for (long j = 0; j < n; ++j) y[j] = g_mf_encode<{e}, {m}, {b}, {k}>(x[j]); }}')
    for bits in (2, 4):
        fns.append(f'extern "C" void sdec{bits}(const unsigned char* x, signed char* y, long n) '
                   f'{{ for (long j = 0; j < n; ++j) y[j] = g_int_decode<{bits}>(x[j]); }}')
        fns.append(f'extern "C" void enc_int{bits}(const long long* x, unsigned char* y, long n) '
                   f'{{ for (long j = 0; j < n; ++j) y[j] = g_int_encode<{bits}>(x[j]); }}')
    return HOST_SHIM + TYPES + COMMON + NARROW_CONVERSIONS + "\n".join(fns)


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    d = tmp_path_factory.mktemp("narrow")
    (d / "p.cpp").write_text(_probe_source())
    r = subprocess.run(["g++", "-std=c++17", "-O1", "-shared", "-fPIC", "-w", "-o", str(d / "p.so"), str(d / "p.cpp")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[:3000]
    return ctypes.CDLL(str(d / "p.so"))


def _call(fn, x: np.ndarray, out_dtype) -> np.ndarray:
    y = np.empty(x.shape, out_dtype)
    fn(ctypes.c_void_p(x.ctypes.data), ctypes.c_void_p(y.ctypes.data), ctypes.c_long(x.size))
    return y


def _probe_floats() -> np.ndarray:
    """Every float16 value (all the ties and subnormal steps of the 8- and 4-bit formats are among
    them), a million random float32 bit patterns, and the specials."""
    rng = np.random.default_rng(0)
    halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    rand = rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32).view(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, 3.4e38], np.float32)
    return np.concatenate([halves, rand, special])


@needs_gxx
@pytest.mark.parametrize("dt", sorted(_MINIFLOAT))
def test_minifloat_conversions_match_ml_dtypes_bit_for_bit(probe, dt):
    i = sorted(_MINIFLOAT).index(dt)
    np_dt = dtypes.np_dtype(dt)
    n_codes = 16 if dt == "float4e2m1" else 256
    codes = np.arange(n_codes, dtype=np.uint8)
    want = codes.view(np_dt).astype(np.float32)
    got = _call(getattr(probe, f"dec{i}"), codes, np.float32)
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    assert same.all(), f"{dt} decode differs at codes {codes[~same][:8]}: {got[~same][:8]} vs {want[~same][:8]}"

    x = _probe_floats()
    with np.errstate(all="ignore"):
        want = x.astype(np_dt).view(np.uint8)
    got = _call(getattr(probe, f"enc{i}"), x, np.uint8)
    bad = got != want
    assert not bad.any(), f"{dt} encode differs for {x[bad][:8]}: {got[bad][:8]} vs {want[bad][:8]}"


@needs_gxx
@pytest.mark.parametrize("dt", ["int4", "uint4", "int2", "uint2"])
def test_subbyte_integer_conversions_wrap_like_ml_dtypes(probe, dt):
    bits = int(dt[-1])
    v = np.arange(-300, 300, dtype=np.int64)
    want = v.astype(np.int32).astype(dtypes.np_dtype(dt)).view(np.uint8)   # wraps to the low bits
    got = _call(getattr(probe, f"enc_int{bits}"), v, np.uint8)
    np.testing.assert_array_equal(got, want)
    if dt.startswith("int"):
        codes = np.arange(1 << bits, dtype=np.uint8)
        np.testing.assert_array_equal(_call(getattr(probe, f"sdec{bits}"), codes, np.int8),
                                      codes.view(dtypes.np_dtype(dt)).astype(np.int8))


NARROW_TESTS = r"^test_(cast|castlike|quantizelinear|dequantizelinear)_.*(float8|FLOAT8|e4m3|e5m2|INT4|UINT4|INT2|UINT2|int4|uint4|int2|uint2|FLOAT4|float4)"


def test_narrow_type_node_tests_pass_on_the_cpu_backend():
    cases = node_testcases(NARROW_TESTS)
    assert len(cases) > 120
    results = {c.name: run_case(c) for c in cases}
    passed = [k for k, (s, _) in results.items() if s == "pass"]
    # float8e8m0 (round_mode up/down) is the one narrow type not supported
    others = {k: d for k, (s, d) in results.items() if s != "pass" and "E8M0" not in k and "e8m0" not in k}
    assert not others, others
    assert len(passed) >= 150


@needs_gxx
def test_narrow_type_node_tests_through_generated_c_on_host(tmp_path):
    """The CUDA C path: each test's plan runs with every kernel host-compiled from the generated
    source, and must give the test's expected output exactly as the interpreter does."""
    from test_codegen import HostCodegenRunner
    checked = 0
    for case in node_testcases(r"^test_(cast|quantizelinear|dequantizelinear)_.*(FLOAT8|FLOAT4|INT4|UINT2|e4m3fn|e5m2|int4|uint2|float4)"):
        if "E8M0" in case.name:
            continue
        inputs, outputs = case.data_sets[0]
        feeds = {i.name: _as_array(x) for i, x in zip(case.model.graph.input, inputs)}
        b = grapec.compile(case.model, shapes={k: v.shape for k, v in feeds.items()}, targets=[])
        outs = HostCodegenRunner(b, tmp_path).run(0, feeds)
        for o, ref in zip(case.model.graph.output, outputs):
            ref = _as_array(ref)
            got = outs[o.name]
            assert got.dtype == ref.dtype, case.name
            g, r = got.astype(np.float32), ref.astype(np.float32)
            assert ((g == r) | (np.isnan(g) & np.isnan(r))).all(), (case.name, got, ref)
        checked += 1
    assert checked >= 40
