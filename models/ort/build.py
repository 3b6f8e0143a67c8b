"""The tiny GPT-2 and BERT as onnxruntime's transformer optimizer writes them (com.microsoft ops):
the usual route from a Hugging Face export to a production ONNX file.

    pip install torch sympy     # onnxruntime.transformers.optimizer imports both
    python models/ort/build.py          # writes models/ort/*_optimized.onnx

Writes bert_optimized.onnx (BiasGelu, SkipLayerNormalization) and gpt2_optimized.onnx (FastGelu),
from models/tiny. The optimizer's attention and embedding fusions expect the TorchScript exporter's
patterns; on these dynamo exports they do not fire, so Attention, MultiHeadAttention and
EmbedLayerNormalization are tested one node at a time (tests/test_contrib_ops.py).
"""
import argparse
import collections
import os

import onnx

HERE = os.path.dirname(os.path.abspath(__file__))
TINY = os.path.join(os.path.dirname(HERE), "tiny")
MODELS = {"bert": ("bert", 4, 64), "gpt2": ("gpt2", 4, 64)}   # model_type, heads, hidden (tiny)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=HERE)
    args = ap.parse_args()
    from onnxruntime.transformers.optimizer import optimize_model
    for name, (model_type, heads, hidden) in MODELS.items():
        m = optimize_model(os.path.join(TINY, f"{name}.onnx"), model_type=model_type, num_heads=heads,
                           hidden_size=hidden, opt_level=2, use_gpu=False)
        path = os.path.join(args.out, f"{name}_optimized.onnx")
        m.save_model_to_file(path)
        ops = collections.Counter(n.op_type for n in onnx.load(path).graph.node if n.domain == "com.microsoft")
        print(f"{path}: {dict(ops)}")


if __name__ == "__main__":
    main()
