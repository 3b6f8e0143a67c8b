"""Models as onnxruntime's own tools write them: the transformer optimizer (com.microsoft fusions,
models/ort/build.py made the committed files) and quantize_dynamic (MatMulInteger,
DynamicQuantizeLSTM), compiled, run on the CPU backend and compared with onnxruntime."""
import os

import onnx
import pytest

from grapec.tools.check import check_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "models", "tiny")
ORT = os.path.join(ROOT, "models", "ort")


@pytest.mark.parametrize("name,ops", [("bert_optimized", {"BiasGelu", "SkipLayerNormalization"}),
                                      ("gpt2_optimized", {"FastGelu"})])
@pytest.mark.parametrize("dims", [{"batch": 1, "seq": 8}, {"batch": 3, "seq": 17}])
def test_transformer_optimizer_output_matches_onnxruntime(name, ops, dims):
    path = os.path.join(ORT, f"{name}.onnx")
    assert {n.op_type for n in onnx.load(path).graph.node if n.domain == "com.microsoft"} == ops
    results, _ = check_model(path, dims=dims, seed=dims["seq"])
    assert all(r.ok for r in results), [(r.name, r.rel, r.note) for r in results]


@pytest.mark.parametrize("name", ["bert_optimized", "gpt2_optimized"])
def test_transformer_optimizer_output_in_fp16(name):
    results, _ = check_model(os.path.join(ORT, f"{name}.onnx"), dims={"batch": 2, "seq": 8}, precision="fp16")
    assert all(r.ok for r in results), [(r.name, r.rel, r.note) for r in results]


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    from onnxruntime.quantization import QuantType, quantize_dynamic
    out = tmp_path_factory.mktemp("quantized")
    paths = {}
    for name, src in (("lstm_tagger", os.path.join(ROOT, "models", "real", "lstm_tagger.onnx")),
                      ("gpt2", os.path.join(TINY, "gpt2.onnx")), ("bert", os.path.join(TINY, "bert.onnx"))):
        paths[name] = str(out / f"{name}_int8.onnx")
        # reduce_range: 7-bit weights, as onnxruntime's docs advise for x86 without VNNI, where its u8 x s8
        # kernels add products in pairs into int16 and saturate with full-range weights (the reference
        # would be off; it was, on an AVX2 machine: the LSTM's tags by 20%)
        quantize_dynamic(src, paths[name], weight_type=QuantType.QInt8, reduce_range=True)
    return paths


@pytest.mark.parametrize("dims", [{"batch": 1, "seq": 5}, {"batch": 2, "seq": 9}])
def test_a_dynamically_quantized_lstm_matches_onnxruntime(quantized, dims):
    """DynamicQuantizeLSTM: the activations quantized on the fly as onnxruntime's kernel does (with
    one batch row per thread, as on a machine with at least as many threads as rows)."""
    ops = {n.op_type for n in onnx.load(quantized["lstm_tagger"]).graph.node}
    assert "DynamicQuantizeLSTM" in ops
    results, _ = check_model(quantized["lstm_tagger"], dims=dims, seed=dims["seq"])
    assert all(r.ok for r in results), [(r.name, r.rel, r.note) for r in results]


@pytest.mark.parametrize("name", ["gpt2", "bert"])
def test_dynamically_quantized_transformers_match_onnxruntime(quantized, name):
    ops = {n.op_type for n in onnx.load(quantized[name]).graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops
    results, _ = check_model(quantized[name], dims={"batch": 2, "seq": 7})
    assert all(r.ok for r in results), [(r.name, r.rel, r.note) for r in results]


@pytest.mark.parametrize("batch,seq", [(1, 1), (2, 8), (5, 33)])
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_fused_bert_attention_and_embeddings_match_onnxruntime(batch, seq, precision):
    """EmbedLayerNormalization (its mask_index: each row's count of ones) feeding Attention, with
    right-padded rows, as the optimizer writes a Hugging Face-style BERT."""
    import numpy as np
    path = os.path.join(ORT, "bert_fused.onnx")
    ops = {n.op_type for n in onnx.load(path).graph.node if n.domain == "com.microsoft"}
    assert {"EmbedLayerNormalization", "Attention", "SkipLayerNormalization", "BiasGelu"} <= ops
    rng = np.random.default_rng(batch * 100 + seq)
    lengths = rng.integers(1, seq + 1, batch)
    feeds = {"input_ids": rng.integers(0, 512, (batch, seq)).astype(np.int64),
             "attention_mask": (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int64),
             "token_type_ids": rng.integers(0, 2, (batch, seq)).astype(np.int64)}
    results, _ = check_model(path, inputs=feeds, precision=precision)
    assert all(r.ok for r in results), [(r.name, r.rel, r.note) for r in results]
