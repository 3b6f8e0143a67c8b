"""Decoders as onnxruntime-genai's model builder writes them (models/real/llama_genai_*.onnx, built by
models/real.py: a tiny Llama-shaped model with grouped-query attention, at fp32 and int4), compiled and
run step by step as a generation loop runs them: a prompt with an empty past, decode steps of rows of
their own lengths, and a chunk of prompt after a past, against onnxruntime's CPU kernels."""
import os

import numpy as np
import onnx
import pytest

import grapec
from grapec.bundle.format import Bundle
from grapec.runtime.devices import gpu_count
from grapec.tools.check import check_model, reference_outputs
from helpers import only_float32_attention_notes, rel_err

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REAL = os.path.join(ROOT, "models", "real")
LAYERS, KV_HEADS, HEAD, VOCAB = 2, 2, 16, 256


def step_feeds(batch: int, new: int, past: int, lengths=None, seed: int = 0, total=None, dtype=np.float32) -> dict:
    """Token ids for `new` positions after `past` cached ones; lengths: each row's valid tokens
    (past + new where not given), the rest of its attention mask 0 (right padding). total: the mask's
    length where the past buffer is longer than what it holds (onnxruntime-genai's shared buffer)."""
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, total or past + new), np.int64)
    for row, n in enumerate(lengths or []):
        mask[row, n:] = 0
    feeds = {"input_ids": rng.integers(0, VOCAB, (batch, new)).astype(np.int64), "attention_mask": mask}
    for layer in range(LAYERS):
        for kv in ("key", "value"):
            feeds[f"past_key_values.{layer}.{kv}"] = rng.standard_normal((batch, KV_HEADS, past, HEAD)).astype(dtype)
    return feeds


@pytest.mark.parametrize("precision", ["fp32", "int4"])
@pytest.mark.parametrize("batch, new, past, lengths", [(1, 6, 0, None), (2, 1, 5, None), (3, 1, 5, [6, 3, 5]),
                                                        (1, 3, 4, None), (2, 4, 0, [4, 2])])
def test_builder_decoder_steps_match_onnxruntime(precision, batch, new, past, lengths):
    path = os.path.join(REAL, f"llama_genai_{precision}.onnx")
    m = onnx.load(path)
    ops = {n.op_type for n in m.graph.node}
    assert "GroupQueryAttention" in ops and ("MatMulNBits" in ops) == (precision == "int4")
    feeds = step_feeds(batch, new, past, lengths)
    b = grapec.compile(m, shapes={k: v.shape for k, v in feeds.items()}, targets=[])
    only_float32_attention_notes(b)
    got = grapec.load(Bundle.from_bytes(b.to_bytes())).run(feeds)
    # the builder asks onnxruntime's CPU MatMulNBits for int8 activations (accuracy_level 4), which moves
    # its logits by ~1e-2 from exact arithmetic; grapec computes in float, as grapec check's reference
    # then does (MatMulNBits at level 0)
    want = reference_outputs(path, feeds)
    for name in ("logits", "present.0.key", "present.1.value"):
        assert got[name].shape == want[name].shape, name
        assert rel_err(got[name], want[name]) < 1e-5, (name, rel_err(got[name], want[name]))
        np.testing.assert_allclose(got[name], want[name], atol=1e-4, rtol=1e-3, err_msg=name)


@pytest.mark.parametrize("name", ["cuda_fp16", "cuda_int4"])
@pytest.mark.parametrize("batch, new, past, total, lengths", [(1, 5, 16, 5, None), (2, 1, 16, 7, [7, 4]), (2, 1, 6, 7, None)])
def test_the_cuda_builds_share_one_buffer_for_past_and_present(name, batch, new, past, total, lengths):
    """The builder's CUDA models (fp16), run as onnxruntime-genai runs them: the past a max-length buffer
    (16) that the present keeps the length of, the mask as long as what it holds; and a past that grows."""
    path = os.path.join(REAL, f"llama_genai_{name}.onnx")
    feeds = step_feeds(batch, new, past, lengths, total=total, dtype=np.float16)
    b = grapec.compile(path, shapes={k: v.shape for k, v in feeds.items()}, targets=[], precision="fp16")
    # its attention (the mask built over the grouped query rows) is one fused attention kernel
    assert not [n for n in b.manifest["notes"] if "GroupQueryAttention" in n and "stays GEMM + " in n]
    assert any(isinstance(k, dict) and k.get("kind") == "attention" for k in b.kernels)
    got = grapec.load(Bundle.from_bytes(b.to_bytes())).run(feeds)
    want = reference_outputs(path, feeds)
    assert want["present.0.key"].shape[2] == max(past, total)
    for name_ in ("logits", "present.0.key", "present.1.value"):
        assert got[name_].shape == want[name_].shape, name_
        # both in half: onnxruntime's CPU kernels round the attention and the norms at other points
        assert rel_err(got[name_], want[name_]) < 2e-3, (name_, rel_err(got[name_], want[name_]))



@pytest.mark.parametrize("batch", [1, 2])
def test_a_decode_steps_output_projection_is_a_small_gemm(batch):
    """At one query the attention's output, its heads merged, is read by the output projection through a view
    of the whole buffer in row-major order (passes/strided_operands.py); the small GEMM takes it with the
    residual as its epilogue, where cuBLASLt ran one row at a quarter of the DRAM bandwidth."""
    from grapec.ir.kinds import kernel_from_json
    from grapec.ir.small_gemm import SmallGemmKernel
    path = os.path.join(REAL, "llama_genai_cuda_fp16.onnx")
    feeds = step_feeds(batch, 1, 16, total=17, dtype=np.float16)
    b = grapec.compile(path, shapes={k: v.shape for k, v in feeds.items()}, targets=[], precision="fp16")
    steps = [st for st in b.plans[0].steps if any("o_proj/MatMul" in o for o in st.origin)]
    assert len(steps) == LAYERS and all(st.op == "kernel" for st in steps), [(st.op, st.origin) for st in steps]
    assert all(isinstance(kernel_from_json(b.kernels[st.kernel]), SmallGemmKernel) for st in steps)
    got = grapec.load(Bundle.from_bytes(b.to_bytes())).run(feeds)
    want = reference_outputs(path, feeds)
    for name in ("logits", "present.1.value"):
        assert rel_err(got[name], want[name]) < 2e-3, (name, rel_err(got[name], want[name]))

def test_int4_weights_stay_packed():
    fp32 = grapec.compile(os.path.join(REAL, "llama_genai_fp32.onnx"), shapes={k: v.shape for k, v in step_feeds(1, 1, 4).items()},
                          targets=[])
    int4 = grapec.compile(os.path.join(REAL, "llama_genai_int4.onnx"), shapes={k: v.shape for k, v in step_feeds(1, 1, 4).items()},
                          targets=[])
    assert len(int4.weights) < len(fp32.weights) / 3, (len(int4.weights), len(fp32.weights))


def test_check_compares_the_int4_model_with_float_activations():
    said = []
    dims = {"batch_size": 1, "sequence_length": 5, "past_sequence_length": 0, "total_sequence_length": 5,
            "kv_cache_dim": HEAD}
    results, _ = check_model(os.path.join(REAL, "llama_genai_int4.onnx"), dims=dims, progress=said.append)
    assert all(r.ok for r in results), [(r.name, r.rel) for r in results]
    assert any("accuracy_level 4 run at level 0" in m for m in said), said


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_count(), reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("precision", ["fp32", "int4"])
def test_builder_decoder_steps_on_the_cuda_backend(precision):
    path = os.path.join(REAL, f"llama_genai_{precision}.onnx")
    for batch, new, past, lengths in [(1, 6, 0, None), (3, 1, 5, [6, 3, 5])]:
        feeds = step_feeds(batch, new, past, lengths)
        b = grapec.compile(path, shapes={k: v.shape for k, v in feeds.items()})
        only_float32_attention_notes(b)
        got = grapec.load(Bundle.from_bytes(b.to_bytes()), backend="cuda").run(feeds)
        want = reference_outputs(path, feeds)
        for name in ("logits", "present.0.key", "present.1.value"):
            assert rel_err(got[name], want[name]) < 1e-5, (precision, batch, new, past, name, rel_err(got[name], want[name]))


def test_a_half_decoder_in_its_generation_loop_folds_its_scalars_and_fuses_attention():
    """Inside the --generate wrapper, shape inference leaves the builder's fp16 attention without an
    element type, so its rewrite casts each scalar like a run-time tensor (CastLike(0.0, keys)). Those
    fold at compile time (they read only the tensor's type): no kernel of the bundle computes one (12
    here before; a Llama-1B decode step went from 322 to 226 steps, its attention products fused with
    the softmax once the scale and the mask's fill were constants). Its packed query and key heads
    rotate in one kernel."""
    from grapec.plan import KernelStep, LoopStep, walk_steps
    b = grapec.compile(os.path.join(REAL, "llama_genai_cuda_fp16.onnx"), dims={"kv_cache_dim": HEAD}, generate=4,
                       bucket_dims=[{"batch": 1, "prompt": 8}], targets=[])
    loop = [s for s in b.plans[0].steps if isinstance(s, LoopStep)][0]
    scalar_casts = [s.origin for s in walk_steps(b.plans[0].steps) if isinstance(s, KernelStep) and s.origin
                    and all("castlike" in o.lower() for o in s.origin)]
    assert scalar_casts == []
    # the packed query's and key's heads rotate in one kernel a layer (they rotate alike), not two
    rotations = [s for s in loop.body.steps if any("rotaryembedding" in o.lower() for o in s.origin or ())]
    assert len(rotations) == LAYERS, [s.origin for s in rotations]


def test_a_batch_of_one_updates_its_kv_cache_in_place_inside_the_generation_loop():
    """Each decode step writes the present keys and values over the past ones (one kernel reads each
    element before writing it), so no carried cache is copied home at the end of the step. At batch 1
    the kernel indexes the batch axis by the constant 0, which names the thread's own position as well
    as its index would (a Llama-1B decode step lost 32 such copies)."""
    from grapec.plan import LoopStep
    b = grapec.compile(os.path.join(REAL, "llama_genai_cuda_fp16.onnx"), dims={"kv_cache_dim": HEAD}, generate=4,
                       bucket_dims=[{"batch": 1, "prompt": 8}], targets=[])
    plan = b.plans[0]
    loop = [s for s in plan.steps if isinstance(s, LoopStep)][0]
    slots = {st.out for st in loop.enter}
    cache = {s for s in slots if "past_key_values" in plan.buffers[s].name}
    assert len(cache) == 2 * LAYERS, [plan.buffers[s].name for s in slots]
    copied_home = [plan.buffers[st.out].name for st in loop.body.steps if getattr(st, "out", None) in cache
                   and st.origin == loop.origin]
    assert copied_home == []


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_count(), reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("batch", [1, 2])
def test_a_decode_step_of_the_fp16_cuda_build_on_the_cuda_backend(batch):
    """The output projection as a small GEMM reading the attention's output through its plain view, and the
    norm as the QKV projection's prologue, run by the GPU's kernels: against onnxruntime's CPU kernels."""
    path = os.path.join(REAL, "llama_genai_cuda_fp16.onnx")
    feeds = step_feeds(batch, 1, 16, total=17, dtype=np.float16)
    b = grapec.compile(path, shapes={k: v.shape for k, v in feeds.items()}, precision="fp16")
    assert not [st for st in b.plans[0].steps if st.op == "library" and any("o_proj" in o for o in st.origin)]
    got = grapec.load(Bundle.from_bytes(b.to_bytes()), backend="cuda").run(feeds)
    want = reference_outputs(path, feeds)
    for name in ("logits", "present.0.key", "present.1.value"):
        assert rel_err(got[name], want[name]) < 2e-3, (name, rel_err(got[name], want[name]))
