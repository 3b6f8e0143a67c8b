"""LLM-sized decoders for benchmarks/llm.py (issue 35): built from a config with random weights saved by
`save_pretrained` (nothing downloaded), then exported by onnxruntime-genai's model builder, as its
users export them. Too large for the repository or CI: build them where they are measured.

    /path/to/genai-venv/bin/python models/llm.py llama1b --out /tmp/llm --precision fp16
    /path/to/genai-venv/bin/python models/llm.py llama1b --out /tmp/llm --precision int4

writes OUT/llama1b_{precision}/ (model.onnx + model.onnx.data, genai_config.json, ...) and
OUT/llama1b_hf/ (the transformers checkpoint the peers load). With --exporter optimum (optimum-onnx
installed) the same checkpoint goes through optimum's exporter instead, into
OUT/llama1b_optimum_{precision}/: the decoder as torch.onnx writes it, its past grown by Concat. The builder needs onnxruntime-genai,
onnx_ir and onnxscript; --builder-dir runs the builder from an unpacked wheel's
onnxruntime_genai/models folder without importing the package's native library (the GPU machine
has no onnxruntime the wheel's library links against).

| name    | shape                                                                                   |
|---------|-----------------------------------------------------------------------------------------|
| llama1b | Llama-3.2-1B: 16 layers, hidden 2048, 32 query / 8 KV heads of 64, SwiGLU 8192,         |
|         | RoPE theta 500000, vocab 128256, tied embeddings (1.24 B parameters)                     |
| llama1b-2l | llama1b's layers at full width, 2 of them, vocab 32000 (its plans in seconds)         |
| tiny    | the same layout at hidden 64, 2 layers, vocab 256 (a check of the script in seconds)     |
| gptj6b  | GPT-J-6B (Grape's model): 28 layers, hidden 4096, 16 heads of 256, rotary on 64 of them  |
|         | (interleaved), parallel attention and MLP (16384, GELU), vocab 50400 (6.05 B parameters) |
|         | through --exporter optimum only (the builder does not take GPT-J); gptj6b-2l: 2 layers   |
| gptj-tiny | GPT-J's layout at hidden 64, 2 layers, vocab 256                                       |
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

CONFIGS = {
    "llama1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                    num_key_value_heads=8, head_dim=64, vocab_size=128256, max_position_embeddings=4096,
                    rope_theta=500000.0, tie_word_embeddings=True, rms_norm_eps=1e-5),
    "llama1b-2l": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=2, num_attention_heads=32,
                       num_key_value_heads=8, head_dim=64, vocab_size=32000, max_position_embeddings=4096,
                       rope_theta=500000.0, tie_word_embeddings=True, rms_norm_eps=1e-5),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, vocab_size=256, max_position_embeddings=512,
                 rope_theta=500000.0, tie_word_embeddings=True),
    # GPT-J (transformers' GPTJConfig): Grape's model. onnxruntime-genai's builder does not take it; optimum does
    "gptj6b": dict(n_embd=4096, n_layer=28, n_head=16, rotary_dim=64, n_inner=16384, vocab_size=50400,
                   n_positions=2048),
    "gptj6b-2l": dict(n_embd=4096, n_layer=2, n_head=16, rotary_dim=64, n_inner=16384, vocab_size=50400,
                      n_positions=2048),
    "gptj-tiny": dict(n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_inner=128, vocab_size=256, n_positions=512),
}


def _architecture(name: str) -> tuple:
    """(config class, model class) of a CONFIGS entry: GPT-J's for the gptj ones, Llama's otherwise."""
    import transformers
    if name.startswith("gptj"):
        return transformers.GPTJConfig, transformers.GPTJForCausalLM
    return transformers.LlamaConfig, transformers.LlamaForCausalLM


def save_checkpoint(name: str, out: str, seed: int = 0) -> str:
    """The transformers checkpoint (fp16 safetensors) and a word-level tokenizer the builder copies."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    path = os.path.join(out, f"{name}_hf")
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    torch.manual_seed(seed)
    config_class, model_class = _architecture(name)
    cfg = config_class(**CONFIGS[name], torch_dtype="float16")
    # on a GPU where there is one: GPT-J-6B's 6 B parameters initialize in seconds there, minutes on a CPU
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = model_class(cfg).to(torch.float16)
    model.save_pretrained(path)
    vocab = CONFIGS[name]["vocab_size"]
    tok = Tokenizer(models.WordLevel(vocab={f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", bos_token="t1", eos_token="t2").save_pretrained(path)
    return path


def export(name: str, out: str, precision: str, provider: str = "cuda", builder_dir: str | None = None) -> str:
    """onnxruntime-genai's builder on the checkpoint: OUT/NAME_PRECISION/model.onnx."""
    if name.startswith("gptj"):
        raise SystemExit(f"{name}: onnxruntime-genai's builder does not take GPT-J; use --exporter optimum")
    src = save_checkpoint(name, out)
    dst = os.path.join(out, f"{name}_{precision}")
    if os.path.exists(os.path.join(dst, "model.onnx")):
        return dst
    env = dict(os.environ)
    if builder_dir:   # a package of just the builder: no native library imported
        pkg = os.path.join(out, "_builder", "onnxruntime_genai")
        os.makedirs(pkg, exist_ok=True)
        open(os.path.join(pkg, "__init__.py"), "w").close()
        link = os.path.join(pkg, "models")
        if not os.path.exists(link):
            os.symlink(os.path.abspath(builder_dir), link)
        env["PYTHONPATH"] = os.path.join(out, "_builder") + os.pathsep + env.get("PYTHONPATH", "")
    subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", src, "-o", dst, "-p", precision,
                    "-e", provider, "-c", os.path.join(out, "_cache")], check=True, env=env)
    return dst


def export_optimum(name: str, out: str, precision: str, provider: str = "cuda") -> str:
    """optimum's ONNX exporter (torch.onnx underneath) on the same checkpoint, as HF users export a
    decoder with its past: OUT/NAME_optimum_PRECISION/model.onnx (+ external data past 2 GB). Its
    presents grow by Concat, which grapec --generate runs as a sliding window (frontend/generation.py)."""
    if precision == "int4":
        raise SystemExit("optimum exports fp32 or fp16; int4 is onnxruntime-genai's builder's")
    src = save_checkpoint(name, out)
    dst = os.path.join(out, f"{name}_optimum_{precision}")
    if os.path.exists(os.path.join(dst, "model.onnx")):
        return dst
    # what `optimum-cli export onnx` runs, less its validation: that runs the whole model in onnxruntime on the
    # CPU against PyTorch (GPT-J-6B in fp16: minutes of a GPU call); grapec's own checks compare with onnxruntime
    export = ("from optimum.exporters.onnx import main_export; "
              f"main_export({src!r}, {dst!r}, task='text-generation-with-past', dtype={precision!r}, "
              f"device={'cuda' if provider == 'cuda' else 'cpu'!r}, do_validation=False)")
    subprocess.run([sys.executable, "-c", export], check=True)
    return dst


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", choices=sorted(CONFIGS))
    ap.add_argument("--out", required=True)
    ap.add_argument("--precision", default="fp16", choices=["fp16", "int4", "fp32"])
    ap.add_argument("--provider", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--builder-dir", help="an unpacked onnxruntime_genai/models folder to run the builder from")
    ap.add_argument("--exporter", default="builder", choices=["builder", "optimum"],
                    help="onnxruntime-genai's model builder, or optimum's exporter (optimum-onnx installed)")
    a = ap.parse_args()
    if a.exporter == "optimum":
        print(export_optimum(a.name, a.out, a.precision, a.provider))
    else:
        print(export(a.name, a.out, a.precision, a.provider, a.builder_dir))


if __name__ == "__main__":
    main()
