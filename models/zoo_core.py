"""The zoo's core: configs, input specs and seeded random inputs (numpy only), and ZooModel."""
from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Any, Callable

import numpy as np

SIZES = ("tiny", "full")
OPSET = 17
EXPORT_OPSET = 18  # the torch exporter's lowest opset; we convert to OPSET ourselves (see _to_opset17)
SEED = 0
EXTERNAL_DATA_THRESHOLD = int(1.5 * 1024**3)  # bytes of initializers above which weights go to a .data file
# Largest value a dynamic dim may take in the exported graph (torch.export wants a range).
MAX_BATCH = 1024


# --------------------------------------------------------------------------------------------
# Specs: configs, input names/shapes/dtypes, random inputs.  numpy only (no torch needed).
# --------------------------------------------------------------------------------------------

CONFIGS: dict[str, dict[str, dict[str, Any]]] = {
    "gpt2": {
        "tiny": dict(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=64),
        "full": dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024),  # GPT-2 small
    },
    "bert": {
        "tiny": dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                     vocab_size=512, max_position_embeddings=64),
        "full": dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, intermediate_size=3072,
                     vocab_size=30522, max_position_embeddings=512),  # bert-base
    },
    "wav2vec2": {
        "tiny": dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                     conv_dim=(32, 32, 32), conv_kernel=(10, 3, 3), conv_stride=(5, 2, 2),
                     num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4),
        "full": dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, intermediate_size=3072,
                     conv_dim=(512,) * 7, conv_kernel=(10, 3, 3, 3, 3, 2, 2), conv_stride=(5, 2, 2, 2, 2, 2, 2),
                     num_conv_pos_embeddings=128, num_conv_pos_embedding_groups=16),  # wav2vec2-base
    },
    "resnet50": {
        "tiny": dict(base_width=8, num_classes=10, image_size=64),
        "full": dict(base_width=64, num_classes=1000, image_size=224),
    },
    "googlenet": {
        "tiny": dict(width_div=8, num_classes=10, image_size=64),
        "full": dict(width_div=1, num_classes=1000, image_size=224),
    },
    "inception_v3": {
        "tiny": dict(width_div=8, num_classes=10, image_size=75),   # 75: the smallest input its stem takes
        "full": dict(width_div=1, num_classes=1000, image_size=299),
    },
    "gpt2_generate": {   # the gpt2 model's weights; a prompt of prompt_len ids, room for max_new_tokens more
        "tiny": dict(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=64, prompt_len=8, max_new_tokens=24),
        "full": dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024, prompt_len=16,
                     max_new_tokens=128),
    },
    "control_flow": {
        # vocab V, hidden H, max_len M, end token, bias added to the EOS logit (tuned so that about a
        # third to a half of random inputs stop early; see tests/test_zoo_models.py)
        "tiny": dict(vocab=32, hidden=16, max_len=16, eos=0, eos_bias=2.0),
        "full": dict(vocab=4096, hidden=512, max_len=64, eos=0, eos_bias=6.0),
    },
}

# dynamic dim -> value in the example inputs
EXAMPLE_DIMS: dict[str, dict[str, dict[str, int]]] = {
    "gpt2": {"tiny": {"batch": 1, "seq": 8}, "full": {"batch": 1, "seq": 128}},
    "bert": {"tiny": {"batch": 1, "seq": 8}, "full": {"batch": 1, "seq": 128}},
    "wav2vec2": {"tiny": {"batch": 1, "samples": 1600}, "full": {"batch": 1, "samples": 16000}},
    "resnet50": {"tiny": {"batch": 1}, "full": {"batch": 1}},
    "googlenet": {"tiny": {"batch": 1}, "full": {"batch": 1}},
    "inception_v3": {"tiny": {"batch": 1}, "full": {"batch": 1}},
    "gpt2_generate": {"tiny": {}, "full": {}},
    "control_flow": {"tiny": {}, "full": {}},
}


@dataclasses.dataclass(frozen=True)
class Spec:
    """What a zoo model looks like from the outside (no torch needed).

    input_dims:   input name -> dims, each an int or a dynamic dim name (in graph input order)
    input_dtypes: input name -> numpy dtype name
    dynamic_dims: dynamic dim name -> value in the example inputs
    dim_ranges:   dynamic dim name -> (min, max) the exported graph is valid for
    value_ranges: input name -> (min, max) of its values where the graph is valid only for those (written
                  to the file's metadata as ``grapec.input_range.<name>``, which grapec checks at run time)
    """

    name: str
    size: str
    config: dict[str, Any]
    input_dims: dict[str, tuple]
    input_dtypes: dict[str, str]
    output_names: tuple[str, ...]
    dynamic_dims: dict[str, int]
    dim_ranges: dict[str, tuple[int, int]]
    value_ranges: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)

    def random_inputs(self, seed: int = 0, **dims: int) -> dict[str, np.ndarray]:
        """Fresh seeded random inputs (never all zeros; token ids within the vocab; BERT's
        attention_mask is ones with trailing zeros on padded rows).  Dynamic dims default to
        ``dynamic_dims``."""
        unknown = set(dims) - set(self.dynamic_dims)
        if unknown:
            raise ValueError(f"{self.name}: unknown dynamic dims {sorted(unknown)}")
        d = {**self.dynamic_dims, **dims}
        for k, v in d.items():
            lo, hi = self.dim_ranges[k]
            if not lo <= v <= hi:
                raise ValueError(f"{self.name}: {k}={v} outside the exported range [{lo}, {hi}]")
        return _INPUT_MAKERS[self.name](self.config, np.random.default_rng(seed), d)

    def shapes(self, **dims: int) -> dict[str, tuple[int, ...]]:
        d = {**self.dynamic_dims, **dims}
        return {k: tuple(d[x] if isinstance(x, str) else x for x in v) for k, v in self.input_dims.items()}


def _gpt2_inputs(cfg, rng, d):
    return {"input_ids": rng.integers(0, cfg["vocab_size"], size=(d["batch"], d["seq"]), dtype=np.int64)}


def _bert_inputs(cfg, rng, d):
    b, s = d["batch"], d["seq"]
    mask = np.ones((b, s), dtype=np.int64)
    for i in range(b):  # padding: every row but the first (or the only row) ends in 1..s/2 zeros
        if i > 0 or b == 1:
            mask[i, s - int(rng.integers(1, max(1, s // 2) + 1)):] = 0
    mask[:, 0] = 1
    return {"input_ids": rng.integers(0, cfg["vocab_size"], size=(b, s), dtype=np.int64), "attention_mask": mask}


def _wav2vec2_inputs(cfg, rng, d):
    return {"input_values": rng.standard_normal((d["batch"], d["samples"])).astype(np.float32)}


def _image_inputs(cfg, rng, d):
    hw = cfg["image_size"]
    return {"input": rng.standard_normal((d["batch"], 3, hw, hw)).astype(np.float32)}


def _gpt2_generate_inputs(cfg, rng, d):
    return {"prompt_ids": rng.integers(0, cfg["vocab_size"], size=(1, cfg["prompt_len"]), dtype=np.int64),
            "max_new_tokens": np.array(cfg["max_new_tokens"], np.int64),
            "eos_token_id": np.array(-1, np.int64)}   # -1: run to max_new_tokens (tests pick a real eos)


def _control_flow_inputs(cfg, rng, d):
    return {
        "start_token": rng.integers(1, cfg["vocab"], size=(1,), dtype=np.int64),  # never EOS (0)
        "h0": rng.standard_normal((cfg["hidden"],)).astype(np.float32),
    }


_INPUT_MAKERS = {
    "gpt2": _gpt2_inputs,
    "bert": _bert_inputs,
    "wav2vec2": _wav2vec2_inputs,
    "resnet50": _image_inputs,
    "googlenet": _image_inputs,
    "inception_v3": _image_inputs,
    "gpt2_generate": _gpt2_generate_inputs,
    "control_flow": _control_flow_inputs,
}


def spec(name: str, size: str = "tiny") -> Spec:
    """The torch-free description of a zoo model."""
    if name not in CONFIGS:
        raise KeyError(f"unknown zoo model {name!r}; known: {', '.join(CONFIGS)}")
    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES}, got {size!r}")
    cfg = dict(CONFIGS[name][size])
    dims = dict(EXAMPLE_DIMS[name][size])
    batch = (1, MAX_BATCH)
    if name == "gpt2":
        return Spec(name, size, cfg, {"input_ids": ("batch", "seq")}, {"input_ids": "int64"}, ("logits",),
                    dims, {"batch": batch, "seq": (2, cfg["n_positions"])})
    if name == "bert":
        return Spec(name, size, cfg, {"input_ids": ("batch", "seq"), "attention_mask": ("batch", "seq")},
                    {"input_ids": "int64", "attention_mask": "int64"}, ("last_hidden_state", "pooler_output"),
                    dims, {"batch": batch, "seq": (2, cfg["max_position_embeddings"])})
    if name == "wav2vec2":
        # shortest input: the conv feature extractor's receptive field (400 samples for base)
        rf, stride = 1, 1
        for k, st in zip(cfg["conv_kernel"], cfg["conv_stride"]):
            rf += (k - 1) * stride
            stride *= st
        return Spec(name, size, cfg, {"input_values": ("batch", "samples")}, {"input_values": "float32"},
                    ("last_hidden_state",), dims, {"batch": batch, "samples": (rf, 16000 * 30)})
    if name in ("resnet50", "googlenet", "inception_v3"):
        hw = cfg["image_size"]
        return Spec(name, size, cfg, {"input": ("batch", 3, hw, hw)}, {"input": "float32"}, ("logits",),
                    dims, {"batch": batch})
    if name == "gpt2_generate":
        return Spec(name, size, cfg, {"prompt_ids": (1, cfg["prompt_len"]), "max_new_tokens": (), "eos_token_id": ()},
                    {"prompt_ids": "int64", "max_new_tokens": "int64", "eos_token_id": "int64"},
                    ("generated", "num_generated"), dims, {},
                    {"prompt_ids": (0, cfg["vocab_size"] - 1), "max_new_tokens": (1, cfg["max_new_tokens"]),
                     "eos_token_id": (-1, cfg["vocab_size"] - 1)})
    assert name == "control_flow"
    return Spec(name, size, cfg, {"start_token": (1,), "h0": (cfg["hidden"],)},
                {"start_token": "int64", "h0": "float32"}, ("tokens", "count", "h_final"), dims, {})


def random_inputs(name: str, size: str = "tiny", seed: int = 0, **dims: int) -> dict[str, np.ndarray]:
    """Seeded random numpy inputs for a zoo model (no torch needed)."""
    return spec(name, size).random_inputs(seed, **dims)


# --------------------------------------------------------------------------------------------
# ZooModel
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class ZooModel:
    """One zoo model, ready to export.

    name:          registry name ("gpt2", ...)
    size:          "tiny" or "full"
    module:        torch.nn.Module in eval mode with seeded weights (None for control_flow); its
                   forward takes the inputs positionally, in ``inputs`` order, and returns the outputs
    inputs:        example inputs, name -> torch tensor (torch models) or numpy array (control_flow)
    dynamic_dims:  dynamic dim name -> its value in ``inputs``, e.g. {"batch": 1, "seq": 8}
    spec:          the torch-free description (input dims / dtypes, output names, dim ranges, config)
    reference:     numpy reference (control_flow only): feeds -> outputs
    weights:       the numpy weights (control_flow only)
    """

    name: str
    size: str
    module: Any
    inputs: dict[str, Any]
    dynamic_dims: dict[str, int]
    spec: Spec
    exporter: Callable[["ZooModel", str], None]
    reference: Callable[[dict[str, np.ndarray]], list[np.ndarray]] | None = None
    weights: dict[str, np.ndarray] | None = None
    seed: int = SEED

    @property
    def output_names(self) -> list[str]:
        return list(self.spec.output_names)

    @property
    def config(self) -> dict[str, Any]:
        return self.spec.config

    def export(self, path: str | os.PathLike) -> str:
        """Write the ONNX file to ``path`` (weights inline, or in ``<path>.data`` above 1.5 GB)."""
        path = os.fspath(path)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.exporter(self, path)
        return path

    def random_inputs(self, seed: int = 0, **dims: int) -> dict[str, np.ndarray]:
        """Fresh seeded random numpy inputs; dynamic dims default to ``dynamic_dims``."""
        return self.spec.random_inputs(seed, **dims)

    def numpy_inputs(self) -> dict[str, np.ndarray]:
        """``inputs`` as numpy arrays."""
        return {k: (v.detach().cpu().numpy() if hasattr(v, "detach") else np.asarray(v))
                for k, v in self.inputs.items()}

    def run_torch(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Run the torch module (the numpy reference for control_flow) on numpy feeds; outputs in order."""
        if self.module is None:
            assert self.reference is not None
            return self.reference(feeds)
        import torch

        with torch.no_grad():
            outs = self.module(*[torch.from_numpy(np.ascontiguousarray(feeds[k])) for k in self.inputs])
        if not isinstance(outs, (tuple, list)):
            outs = (outs,)
        return [o.detach().numpy() for o in outs]

    def weights_digest(self) -> str:
        """sha256 over the module's state dict (or the numpy weights): identifies the seeded weights.

        Stored in the exported file's metadata (``grapec.zoo.weights_sha256``) so a test can tell
        whether this torch/transformers version reproduces the committed weights."""
        h = hashlib.sha256()
        if self.module is not None:
            items = ((k, v.detach().contiguous().cpu().numpy()) for k, v in self.module.state_dict().items())
        else:
            items = (self.weights or {}).items()
        for k, v in sorted(items, key=lambda kv: kv[0]):
            h.update(k.encode())
            h.update(np.ascontiguousarray(v).tobytes())
        return h.hexdigest()
