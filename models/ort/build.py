"""The tiny GPT-2 and BERT as onnxruntime's transformer optimizer writes them (com.microsoft ops):
the usual route from a Hugging Face export to a production ONNX file.

    pip install torch sympy     # onnxruntime.transformers.optimizer imports both
    python models/ort/build.py          # writes models/ort/*_optimized.onnx

Writes bert_optimized.onnx (BiasGelu, SkipLayerNormalization) and gpt2_optimized.onnx (FastGelu),
from models/tiny: the optimizer's attention and embedding fusions expect the TorchScript exporter's
patterns, and on these dynamo exports they do not fire. So it also writes bert_fused.onnx: a tiny
BERT written as Hugging Face's modeling code writes it (seeded weights), exported by the TorchScript
exporter, where they do: EmbedLayerNormalization, Attention (mask_index from the embedding),
SkipLayerNormalization, BiasGelu.
"""
import argparse
import collections
import os
import tempfile

import onnx

HERE = os.path.dirname(os.path.abspath(__file__))
TINY = os.path.join(os.path.dirname(HERE), "tiny")
MODELS = {"bert": ("bert", 4, 64), "gpt2": ("gpt2", 4, 64)}   # model_type, heads, hidden (tiny)


def hf_style_bert(path: str):
    """2 layers, hidden 64, 4 heads, vocab 512, 64 positions, exported at batch 2, seq 8 (dynamic)."""
    import math
    import torch
    from torch import nn
    torch.manual_seed(0)
    hidden, heads, layers, vocab, positions, ffn = 64, 4, 2, 512, 64, 128

    class SelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.query, self.key, self.value = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, hidden)

        def heads(self, x):
            b, s, _ = x.size()
            return x.view(b, s, heads, hidden // heads).permute(0, 2, 1, 3)

        def forward(self, x, mask):
            q, k, v = self.heads(self.query(x)), self.heads(self.key(x)), self.heads(self.value(x))
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(hidden // heads) + mask
            ctx = torch.matmul(nn.functional.softmax(scores, dim=-1), v).permute(0, 2, 1, 3).contiguous()
            return ctx.view(ctx.size(0), ctx.size(1), hidden)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention, self.out = SelfAttention(), nn.Linear(hidden, hidden)
            self.ln1, self.ln2 = nn.LayerNorm(hidden, eps=1e-12), nn.LayerNorm(hidden, eps=1e-12)
            self.up, self.down = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)

        def forward(self, x, mask):
            a = self.ln1(self.out(self.attention(x, mask)) + x)
            h = self.up(a)
            return self.ln2(self.down(h * 0.5 * (1.0 + torch.erf(h / math.sqrt(2.0)))) + a)

    class Bert(nn.Module):
        def __init__(self):
            super().__init__()
            self.word, self.pos, self.typ = nn.Embedding(vocab, hidden), nn.Embedding(positions, hidden), nn.Embedding(2, hidden)
            self.ln = nn.LayerNorm(hidden, eps=1e-12)
            self.layers = nn.ModuleList([Layer() for _ in range(layers)])
            self.register_buffer("position_ids", torch.arange(positions).expand((1, -1)))

        def forward(self, input_ids, attention_mask, token_type_ids):
            x = self.ln(self.word(input_ids) + self.typ(token_type_ids) + self.pos(self.position_ids[:, :input_ids.size(1)]))
            mask = (1.0 - attention_mask.unsqueeze(1).unsqueeze(2).to(torch.float32)) * -10000.0
            for layer in self.layers:
                x = layer(x, mask)
            return x

    names = ["input_ids", "attention_mask", "token_type_ids"]
    example = (torch.randint(0, vocab, (2, 8)), torch.ones(2, 8, dtype=torch.int64), torch.zeros(2, 8, dtype=torch.int64))
    torch.onnx.export(Bert().eval(), example, path, input_names=names, output_names=["last_hidden_state"],
                      dynamic_axes={n: {0: "batch", 1: "seq"} for n in names + ["last_hidden_state"]}, opset_version=14,
                      dynamo=False)


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
    with tempfile.TemporaryDirectory() as tmp:
        exported = os.path.join(tmp, "bert_torchscript.onnx")
        hf_style_bert(exported)
        m = optimize_model(exported, model_type="bert", num_heads=4, hidden_size=64, opt_level=0, use_gpu=False)
        path = os.path.join(args.out, "bert_fused.onnx")
        m.save_model_to_file(path)
        ops = collections.Counter(n.op_type for n in onnx.load(path).graph.node if n.domain == "com.microsoft")
        print(f"{path}: {dict(ops)}")


if __name__ == "__main__":
    main()
