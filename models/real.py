"""The real-model test set: small models made by the public exporters and quantizers users run.

    python models/real.py --out models/real                # the torch and onnxruntime ones
    /path/to/tf-venv/bin/python models/real.py keras_cnn   # the Keras one (tensorflow-cpu, tf2onnx)
    /path/to/genai-venv/bin/python models/real.py llama_genai   # onnxruntime-genai's builder (2 files)
    /path/to/optimum-venv/bin/python models/real.py llama_optimum phi3_optimum gptj_optimum gptj_optimum_fp16

| model          | made by                                                    | what it exercises                      |
|----------------|------------------------------------------------------------|----------------------------------------|
| textdet_head   | torch.onnx.export (TorchScript exporter)                   | a text-detection (DBNet-style) head:   |
|                |                                                            | Conv, BatchNorm, ConvTranspose upsampling |
| lstm_tagger    | torch.onnx.export (TorchScript exporter)                   | Embedding + bidirectional LSTM tagger  |
| bert_int8      | onnxruntime.quantization.quantize_dynamic of tiny BERT     | DynamicQuantizeLinear, MatMulInteger   |
| resnet_qlinear | onnxruntime.quantization.quantize_static (QOperator) of    | QuantizeLinear, QLinearConv,           |
|                | tiny ResNet-50                                             | DequantizeLinear                       |
| keras_cnn      | tf2onnx.convert.from_function of a Keras 3 model           | NHWC Transposes, Conv, BatchNorm,      |
|                |                                                            | Conv2DTranspose, Dense, Softmax        |
| llama_genai_   | onnxruntime-genai's model builder (-p fp32 / int4 -e cpu,  | GroupQueryAttention (rotary inside),   |
| fp32, _int4,   | -p fp16 / int4 -e cuda) of a tiny Llama-shaped decoder     | SkipSimplifiedLayerNormalization,      |
| cuda_fp16, ... | (save_pretrained)                                          |                                        |
|                |                                                            | MatMulNBits, GatherBlockQuantized      |
| llama_optimum  | optimum-cli export onnx --task text-generation-with-past   | the same decoder as torch.onnx writes  |
|                | (torch.onnx underneath) of the same Llama shape            | it: RoPE, GQA and RMSNorm as plain ops,|
|                |                                                            | a past grown by Concat, position_ids   |
| phi3_optimum   | the same exporter, a Phi-3-shaped decoder                  | fused qkv_proj and gate_up_proj, Split |
| gptj_optimum   | the same exporter, a GPT-J-shaped decoder (Grape's model)  | parallel attention and MLP, partial    |
|                |                                                            | interleaved rotary, GELU, LM head bias |
| gptj_optimum_  | the same, exported with --dtype fp16                       | q and k widened to float32 for q·kᵀ    |
| fp16           |                                                            | and the softmax, cast back to half     |

Weights are seeded random; every file is committed (each well under 1 MB). The models are
written as the tools write them: no cleanup, whatever opset and naming the tool chose.
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))


def textdet_head(path):
    import torch
    from torch import nn

    def block(cin, cout, stride):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

    class DBHead(nn.Module):
        """Backbone (stride 4) and the DBNet probability head: conv, then two stride-2 transposed
        convolutions back to full resolution, then a sigmoid."""

        def __init__(self):
            super().__init__()
            self.backbone = nn.Sequential(block(3, 16, 2), block(16, 32, 2), block(32, 32, 1))
            self.head = nn.Sequential(
                block(32, 8, 1),
                nn.ConvTranspose2d(8, 8, 2, 2), nn.BatchNorm2d(8), nn.ReLU(),
                nn.ConvTranspose2d(8, 1, 2, 2))

        def forward(self, image):
            return torch.sigmoid(self.head(self.backbone(image)))

    torch.manual_seed(0)
    model = _calibrated(DBHead(), torch.randn(4, 3, 64, 64))
    torch.onnx.export(model, (torch.randn(1, 3, 64, 64),), path, input_names=["image"], output_names=["prob_map"],
                      dynamic_axes={"image": {0: "batch"}, "prob_map": {0: "batch"}}, opset_version=17, dynamo=False)


def lstm_tagger(path):
    import torch
    from torch import nn

    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(100, 16)
            self.lstm = nn.LSTM(16, 24, batch_first=True, bidirectional=True)
            self.out = nn.Linear(48, 5)

        def forward(self, tokens):
            h, _ = self.lstm(self.embed(tokens))
            return self.out(h)

    torch.manual_seed(0)
    model = Tagger().eval()
    torch.onnx.export(model, (torch.randint(0, 100, (1, 12)),), path, input_names=["tokens"], output_names=["tags"],
                      dynamic_axes={"tokens": {0: "batch", 1: "seq"}, "tags": {0: "batch", 1: "seq"}},
                      opset_version=17, dynamo=False)


def bert_int8(path):
    from onnxruntime.quantization import QuantType, quantize_dynamic
    quantize_dynamic(os.path.join(HERE, "tiny", "bert.onnx"), path, weight_type=QuantType.QInt8)


def resnet_qlinear(path):
    import numpy as np
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Images(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(0)
            self.batches = iter([{"input": rng.standard_normal((1, 3, 64, 64)).astype(np.float32)} for _ in range(8)])

        def get_next(self):
            return next(self.batches, None)

    quantize_static(os.path.join(HERE, "tiny", "resnet50.onnx"), path, Images(), quant_format=QuantFormat.QOperator,
                    op_types_to_quantize=["Conv"], activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    per_channel=True)


def keras_cnn(path):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras
    import numpy as np
    import tensorflow as tf
    import tf2onnx

    keras.utils.set_random_seed(0)
    inp = keras.Input((32, 32, 3), name="pixels")
    x = keras.layers.Conv2D(16, 3, strides=2, padding="same", activation="relu")(inp)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(x)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Conv2DTranspose(16, 2, strides=2, activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dense(32, activation="swish")(x)   # tf2onnx has no Erfc, so no gelu
    out = keras.layers.Dense(10, activation="softmax", name="probs")(x)
    model = keras.Model(inp, out)
    model(np.random.default_rng(0).standard_normal((8, 32, 32, 3)).astype(np.float32), training=True)  # BN statistics move

    @tf.function(input_signature=[tf.TensorSpec([None, 32, 32, 3], tf.float32, name="pixels")])
    def serve(pixels):
        return {"probs": model(pixels, training=False)}

    tf2onnx.convert.from_function(serve, input_signature=serve.input_signature, opset=17, output_path=path)


def llama_genai(path):
    """A Llama-3-shaped decoder (grouped-query attention: 4 query heads on 2 key/value heads, RMSNorm,
    SwiGLU, RoPE theta 500000, tied embeddings), 2 layers of hidden 64, random weights, through
    onnxruntime-genai's model builder at fp32 and int4 for the CPU, and fp16 and int4 for CUDA (whose
    runtime shares one max-length buffer between past and present): `path`'s folder gets
    llama_genai_{fp32,int4,cuda_fp16,cuda_int4}.onnx (external data inlined)."""
    import subprocess
    import tempfile

    import onnx
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    out = os.path.dirname(path)
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "hf")
        torch.manual_seed(0)
        LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, head_dim=16, vocab_size=256, max_position_embeddings=256,
                                     rope_theta=500000.0, tie_word_embeddings=True)).save_pretrained(src)
        # the builder copies a tokenizer: one word per token id is enough
        tok = Tokenizer(models.WordLevel(vocab={f"t{i}": i for i in range(256)}, unk_token="t0"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", bos_token="t1", eos_token="t2").save_pretrained(src)
        for name, precision, provider in (("fp32", "fp32", "cpu"), ("int4", "int4", "cpu"),
                                          ("cuda_fp16", "fp16", "cuda"), ("cuda_int4", "int4", "cuda")):
            built = os.path.join(tmp, name)
            subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", src, "-o", built, "-p",
                            precision, "-e", provider, "-c", os.path.join(tmp, "cache")], check=True)
            onnx.save(onnx.load(os.path.join(built, "model.onnx")), os.path.join(out, f"llama_genai_{name}.onnx"))


def llama_optimum(path):
    """The same Llama-3 shape as llama_genai (its weights drawn with std 0.2, so that greedy tokens vary
    at this size), exported by optimum's ONNX exporter (`optimum-cli export onnx --task
    text-generation-with-past`, torch.onnx underneath): past_key_values.N.key/value in, each present
    the past with the new keys concatenated (HF's DynamicCache), position_ids an input."""
    from transformers import LlamaConfig, LlamaForCausalLM
    _optimum_export(lambda: LlamaForCausalLM(LlamaConfig(**_DECODER, head_dim=16, rope_theta=500000.0,
                                                         tie_word_embeddings=True)), path)


def phi3_optimum(path):
    """A Phi-3-shaped decoder through the same exporter: one fused qkv_proj and one gate_up_proj a layer
    (Split by the graph), untied embeddings."""
    from transformers import Phi3Config, Phi3ForCausalLM
    _optimum_export(lambda: Phi3ForCausalLM(Phi3Config(**_DECODER, pad_token_id=0)), path)


def gptj_optimum(path, dtype: str = "fp32"):
    """A GPT-J-shaped decoder (Grape's model) through the same exporter: attention and MLP side by side on one
    LayerNorm, rotary on the first rotary_dim of each head's dims with its pairs interleaved, GELU, an LM
    head with a bias."""
    from transformers import GPTJConfig, GPTJForCausalLM
    _optimum_export(lambda: GPTJForCausalLM(GPTJConfig(n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_inner=128,
                                                       vocab_size=256, n_positions=256, initializer_range=0.2)),
                    path, dtype)


def gptj_optimum_fp16(path):
    """gptj_optimum in fp16, as optimum writes HF's GPT-J in half: q and k widened to float32 for q·kᵀ and the
    softmax, the probabilities cast back to half."""
    gptj_optimum(path, "fp16")


# 2 layers of hidden 64, 4 query heads on 2 key/value heads, a vocabulary of 256; weights with std 0.2
_DECODER = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                vocab_size=256, max_position_embeddings=256, initializer_range=0.2)


def _optimum_export(make, path, dtype: str = "fp32"):
    """The transformers model make() builds under seed 0, saved, exported by optimum-cli (in `dtype`), written
    to path."""
    import subprocess
    import tempfile

    import onnx
    import torch
    with tempfile.TemporaryDirectory() as tmp:
        src, built = os.path.join(tmp, "hf"), os.path.join(tmp, "onnx")
        torch.manual_seed(0)
        make().save_pretrained(src)
        subprocess.run([sys.executable, "-m", "optimum.commands.optimum_cli", "export", "onnx", "--model", src,
                        "--task", "text-generation-with-past", "--dtype", dtype, built], check=True)
        onnx.save(onnx.load(os.path.join(built, "model.onnx")), path)


def _calibrated(model, x):
    """BatchNorm running statistics from a few forward passes (random init leaves them at 0/1)."""
    import torch
    model.train()
    with torch.no_grad():
        for _ in range(4):
            model(x)
    return model.eval()


MODELS = {"textdet_head": textdet_head, "lstm_tagger": lstm_tagger, "bert_int8": bert_int8,
          "resnet_qlinear": resnet_qlinear, "keras_cnn": keras_cnn, "llama_genai": llama_genai,
          "llama_optimum": llama_optimum, "phi3_optimum": phi3_optimum, "gptj_optimum": gptj_optimum,
          "gptj_optimum_fp16": gptj_optimum_fp16}
# keras_cnn needs tensorflow, llama_genai onnxruntime-genai (and onnx_ir, onnxscript, its builder's),
# llama_optimum, phi3_optimum and gptj_optimum(_fp16) optimum-onnx (with torch and transformers)
DEFAULT = ["textdet_head", "lstm_tagger", "bert_int8", "resnet_qlinear"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*", help=f"models to build [default: {' '.join(DEFAULT)}]")
    ap.add_argument("--out", default=os.path.join(HERE, "real"))
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    warnings.filterwarnings("ignore")
    for name in args.names or DEFAULT:
        if name not in MODELS:
            sys.exit(f"unknown model {name}; choose from {', '.join(MODELS)}")
        path = os.path.join(args.out, f"{name}.onnx")
        MODELS[name](path)
        for made in sorted(f for f in os.listdir(args.out) if f.startswith(name)):
            print(f"{os.path.join(args.out, made)}: {os.path.getsize(os.path.join(args.out, made)) / 1e3:.0f} kB")


if __name__ == "__main__":
    main()
