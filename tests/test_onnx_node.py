"""ONNX's backend node tests through compile + bundle + CPU backend.

The pass count is pinned so it can only go up: raise PINNED_PASSES when more pass. Wrong answers
are never acceptable, whatever the count (unsupported ops are reported, not failed).
"""
import io

import pytest

from grapec.tools.onnx_backend import run_suite

PINNED_PASSES = 1695   # + NonZero, Compress, NonMaxSuppression and Unique on run-time data (2026-11-26); narrow types, If on a known condition, GridSample, AffineGrid, DFT, STFT, windows, RoiAlign (2026-11-23)
# Known wrong answers, each with its reason; anything else failing is a regression.
KNOWN_FAILURES = {
    "test_attention_4d_causal_fp16_expanded":
        "the expanded fp16 graph: our MatMul accumulates in fp32 and rounds once, the reference rounds "
        "every op in fp16; 2 of 192 elements differ by 2 fp16 ulp (closer to a float64 reference)",
    "test_attention_4d_causal_fp16":
        "fused softmax keeps its max and sum in fp32 and rounds once (our fp16 policy); the reference "
        "rounds each step to fp16. 2 of 192 elements differ by 1 ulp; against a float64 evaluation of "
        "the same graph our max error is 3.96e-4, the reference output's 4.91e-4",
    "test_resize_downsample_scales_linear_align_corners":
        "align_corners with scales: the reference divides by the unrounded resized length (in * scale); "
        "onnxruntime and PyTorch divide by the integer output length, and so do we (our output equals onnxruntime's)",
    "test_dft_inverse":
        "the expected output carries numpy's complex64 FFT rounding (1.9e-7 where the answer is 0); we sum "
        "in float64: against a float64 FFT of the same input our max error is 4.4e-7, the reference's 1.5e-6",
    "test_dft_inverse_opset19": "as test_dft_inverse",
    "test_resize_downsample_scales_cubic_align_corners":
        "as test_resize_downsample_scales_linear_align_corners: we match onnxruntime, not the reference",
}
# bfloat16 attention: as the fp16 cases, we round once where the reference rounds every step to
# bfloat16. At most 2 bf16 ulp apart; on test_attention_4d_causal_bf16 our max error against a
# float64 evaluation is 3.4e-3, the reference output's 4.4e-3.
KNOWN_FAILURES.update({
    f"test_attention_{case}_bf16{x}": "rounds once in float32 registers; the reference rounds every step to bfloat16"
    for case in ("4d_causal", "4d_padded_kv", "4d_causal_padded_kv", "4d_attn_mask_causal", "3d_causal")
    for x in ("", "_expanded")})


@pytest.mark.no_round_trip("the backend already runs every bundle through to_bytes/from_bytes with the node "
                            "test's own inputs; random ones are not valid for index inputs (RoiAlign's batch ids)")
def test_onnx_node_tests_cpu_backend():
    buf = io.StringIO()
    results = run_suite(backend="cpu", out=buf)
    print(buf.getvalue())
    passed = sum(1 for s, _ in results.values() if s == "pass")
    failed = {k: d for k, (s, d) in results.items() if s == "fail" and k not in KNOWN_FAILURES}
    assert not failed, "wrong answers:\n" + "\n".join(f"{k}: {d}" for k, d in sorted(failed.items()))
    assert passed >= PINNED_PASSES, f"{passed} pass, fewer than the pinned {PINNED_PASSES}"
