"""grapec model zoo: seeded, self-contained models exported to ONNX.

Every zoo model is built from a config and seeded random weights (``torch.manual_seed`` /
``numpy.random.default_rng``); nothing is downloaded.  Each builder takes ``size="tiny"|"full"``
and returns a :class:`ZooModel`.

    sys.path.insert(0, "models"); import zoo     # models/ is a folder of scripts, not a package
    zm = zoo.get("gpt2", size="tiny")             # ZooModel: module, inputs, dynamic_dims, export()
    zm.export("gpt2.onnx")
    feeds = zoo.random_inputs("gpt2", "tiny", seed=0, batch=2, seq=5)   # numpy only

torch / transformers are imported lazily: ``spec``, ``random_inputs``, ``op_types`` and the whole
control_flow model (graph, numpy reference) need only numpy + onnx.

Weights: transformers' own init (normal(0, 0.02)) leaves every bias at 0 and every LayerNorm at
(1, 0), and fresh BatchNorms are identities.  A compiler bug that drops a bias would then go
unnoticed, and the exporter's optimiser deduplicates the identical zero tensors; so parameters that
come out constant are perturbed with small seeded noise, and the CNNs' BatchNorm statistics are
calibrated on one seeded random batch (so activations stay O(1) through 50 layers).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Any, Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

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


# --------------------------------------------------------------------------------------------
# Helpers shared by the torch models
# --------------------------------------------------------------------------------------------


def _torch():
    import torch

    return torch


def _perturb_constant_params(module, seed: int, scale: float = 0.02) -> None:
    """Add seeded noise to parameters whose entries are all equal (zero biases, unit LN weights)."""
    torch = _torch()
    g = torch.Generator().manual_seed(seed + 12345)
    with torch.no_grad():
        for _, p in sorted(module.named_parameters(), key=lambda kv: kv[0]):
            flat = p.detach().reshape(-1)
            if flat.numel() and bool((flat == flat[0]).all()):
                p.add_(torch.randn(p.shape, generator=g) * scale)


def _calibrate_batchnorm(module, batch_shape, seed: int) -> None:
    """Randomise BN affine params, then set running stats from one seeded random batch.

    A BN with an ``init_gain`` attribute (the last BN of each ResNet residual branch) has its affine
    params scaled by it: it keeps the residual stream from drifting and the network well-conditioned
    (tiny fp32 vs fp64 logits error ~1e-5 instead of ~5e-5 with gain 1), in the spirit of zero_init_residual.
    A BN with an ``init_bias_mean`` attribute (GoogLeNet's) gets that mean added to its random bias: it sets
    the fraction of ReLUs that are active (~0.69 at 0.5 vs ~0.5 at 0).  With no residual path, a
    BN-ReLU chain at 50% active amplifies a relative perturbation ~1.2x per conv (~1.4x per inception
    block); at 0.5 the emulated fp16 logits error drops from ~1.4e-2 to ~5.5e-3 (and fp32 vs fp64 from ~9e-6 to ~3e-6).
    """
    torch = _torch()
    g = torch.Generator().manual_seed(seed + 777)
    bns = [m for m in module.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    with torch.no_grad():
        for bn in bns:
            gain = getattr(bn, "init_gain", 1.0)
            bn.weight.copy_(gain * (0.75 + 0.5 * torch.rand(bn.weight.shape, generator=g)))
            shift = getattr(bn, "init_bias_mean", 0.0)
            bn.bias.copy_(gain * (shift + 0.1 * torch.randn(bn.bias.shape, generator=g)))
            bn.reset_running_stats()
            bn.momentum = None  # cumulative average: after one batch, running stats = batch stats
        module.train()
        module(torch.randn(batch_shape, generator=g))
        module.eval()
        for bn in bns:
            bn.momentum = 0.1


def _tensor_bytes(model: onnx.ModelProto) -> int:
    total = 0
    for init in model.graph.initializer:
        n = int(np.prod(init.dims)) if len(init.dims) else 1
        total += n * np.dtype(helper.tensor_dtype_to_np_dtype(init.data_type)).itemsize
    return total


def _add_metadata(model: onnx.ModelProto, zm: ZooModel) -> None:
    meta = {
        "grapec.zoo.name": zm.name,
        "grapec.zoo.size": zm.size,
        "grapec.zoo.seed": str(zm.seed),
        "grapec.zoo.weights_sha256": zm.weights_digest(),
        "grapec.zoo.dynamic_dims": ",".join(
            f"{k}={v}:{lo}..{hi}" for k, v in zm.dynamic_dims.items() for lo, hi in [zm.spec.dim_ranges[k]]),
    }
    if zm.module is not None:
        import torch

        meta["grapec.zoo.torch"] = torch.__version__
        try:
            import transformers

            meta["grapec.zoo.transformers"] = transformers.__version__
        except ImportError:
            pass
    for name, (lo, hi) in zm.spec.value_ranges.items():
        meta[f"grapec.input_range.{name}"] = f"{lo}:{hi}"
    if zm.name == "gpt2_generate":   # `grapec bench` reports time per generated token
        meta["grapec.generated_tokens_output"] = "generated"
        meta["grapec.generated_count_output"] = "num_generated"
    del model.metadata_props[:]
    for k, v in meta.items():
        model.metadata_props.add(key=k, value=v)


def _strip_node_metadata(graph: onnx.GraphProto) -> None:
    """Drop the exporter's per-node/per-value metadata (stack traces, original names)."""
    for v in list(graph.input) + list(graph.output) + list(graph.value_info):
        del v.metadata_props[:]
    for init in graph.initializer:
        del init.metadata_props[:]
    for node in graph.node:
        del node.metadata_props[:]
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                _strip_node_metadata(attr.g)
            for sub in attr.graphs:
                _strip_node_metadata(sub)


def _used_names(graph: onnx.GraphProto, acc: set) -> set:
    for node in graph.node:
        acc.update(node.input)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                _used_names(attr.g, acc)
            for sub in attr.graphs:
                _used_names(sub, acc)
    acc.update(o.name for o in graph.output)
    return acc


def _remove_unused_initializers(graph: onnx.GraphProto) -> None:
    used = _used_names(graph, set())
    keep = [i for i in graph.initializer if i.name in used]
    if len(keep) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(keep)


def save_model(model: onnx.ModelProto, path: str) -> None:
    """Save with weights inline, or in ``<name>.data`` when initializers exceed 1.5 GB."""
    data_name = os.path.basename(path) + ".data"
    data_path = os.path.join(os.path.dirname(os.path.abspath(path)), data_name)
    if os.path.exists(data_path):
        os.remove(data_path)
    if _tensor_bytes(model) > EXTERNAL_DATA_THRESHOLD:
        onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                  location=data_name, size_threshold=1024)
    else:
        onnx.save(model, path)


def _finish_and_save(model: onnx.ModelProto, zm: ZooModel, path: str) -> None:
    """Inline local functions, strip exporter metadata, shape-infer, check, save."""
    if model.functions:
        model = onnx.inliner.inline_local_functions(model)
    _strip_node_metadata(model.graph)
    _remove_unused_initializers(model.graph)
    del model.graph.value_info[:]
    _add_metadata(model, zm)
    model.doc_string = f"grapec zoo model {zm.name} ({zm.size}), seeded random weights"
    large = _tensor_bytes(model) > EXTERNAL_DATA_THRESHOLD
    if not large:
        model = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
        onnx.checker.check_model(model, full_check=True)
        save_model(model, path)
    else:  # protobuf cannot hold > 2 GB: save first, then check / infer through the path APIs
        save_model(model, path)
        onnx.checker.check_model(path)
        onnx.shape_inference.infer_shapes_path(path, path)


def _explicit_splits(model: onnx.ModelProto) -> onnx.ModelProto:
    """Split(num_outputs=k) (opset 18) -> Split with an explicit `split` sizes input (valid since 13).

    onnx's version converter has no 18 -> 17 Split adapter, and torch's own fallback conversion leaves
    `num_outputs` in an opset-17 model (invalid), so the sizes are filled in here from shape inference
    (the split axis is static in all zoo models).
    """
    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    shapes = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
    for init in inferred.graph.initializer:
        shapes[init.name] = list(init.dims)
    new_inits = []
    for node in model.graph.node:
        if node.op_type != "Split" or node.domain not in ("", "ai.onnx"):
            continue
        attrs = {a.name: a for a in node.attribute}
        if "num_outputs" not in attrs:
            continue
        k = attrs["num_outputs"].i
        axis = attrs["axis"].i if "axis" in attrs else 0
        shape = shapes.get(node.input[0])
        if shape is None or shape[axis] is None:
            raise RuntimeError(f"Split {node.name}: split axis {axis} of {node.input[0]} is not static")
        n = shape[axis]
        chunk = -(-n // k)  # opset-18 semantics: equal chunks of ceil(n/k), the last one smaller
        sizes = [min(chunk, n - i * chunk) for i in range(k)]
        name = f"{node.name or node.output[0]}_sizes"
        new_inits.append(numpy_helper.from_array(np.array(sizes, dtype=np.int64), name))
        node.attribute.remove(attrs["num_outputs"])
        while len(node.input) < 2:
            node.input.append("")
        node.input[1] = name
    model.graph.initializer.extend(new_inits)
    return model


_REDUCE_AXES_INPUT_18 = {"ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean",
                         "ReduceMin", "ReduceProd", "ReduceSumSquare"}


def _to_opset17(model: onnx.ModelProto) -> onnx.ModelProto:
    """Rewrite a default-domain opset-18 graph (as torch's exporter writes it) as opset 17.

    onnx's version converter has no 18 -> 17 adapter for Split (and torch's own fallback leaves an
    invalid `num_outputs` attribute), so the handful of ops whose schema changed in 18 are rewritten
    here and anything else that changed is refused loudly:
      Split(num_outputs)        -> Split with explicit sizes (from shape inference)
      Reduce*(data, axes input) -> Reduce*(data, axes=attribute)   (ReduceSum keeps its input: 13)
      Pad / Resize / Scatter*   -> kept when they use no opset-18 feature
    """
    if model.functions:
        model = onnx.inliner.inline_local_functions(model)
    model = _explicit_splits(model)
    consts = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        attrs = {a.name: a for a in node.attribute}
        op = node.op_type
        if op in _REDUCE_AXES_INPUT_18:
            if attrs.get("noop_with_empty_axes") is not None:
                if attrs["noop_with_empty_axes"].i:
                    raise RuntimeError(f"{op} {node.name}: noop_with_empty_axes=1 has no opset-17 form")
                node.attribute.remove(attrs["noop_with_empty_axes"])
            if len(node.input) > 1 and node.input[1]:
                if node.input[1] not in consts:
                    raise RuntimeError(f"{op} {node.name}: axes input {node.input[1]} is not a constant")
                axes = [int(x) for x in np.atleast_1d(consts[node.input[1]])]
                del node.input[1:]
                node.attribute.append(helper.make_attribute("axes", axes))
        elif op == "Pad":
            if len(node.input) > 3 and node.input[3]:
                raise RuntimeError(f"Pad {node.name}: `axes` input is opset 18")
        elif op == "Resize":
            for name, default in (("antialias", 0), ("keep_aspect_ratio_policy", b"stretch")):
                if name in attrs and helper.get_attribute_value(attrs[name]) != default:
                    raise RuntimeError(f"Resize {node.name}: {name} is opset 18")
            for name in ("antialias", "keep_aspect_ratio_policy", "axes"):
                if name in attrs:
                    if name == "axes":
                        raise RuntimeError(f"Resize {node.name}: axes is opset 18")
                    node.attribute.remove(attrs[name])
        elif op in ("ScatterElements", "ScatterND"):
            if "reduction" in attrs and attrs["reduction"].s in (b"max", b"min"):
                raise RuntimeError(f"{op} {node.name}: reduction max/min is opset 18")
        elif op != "Split":
            schema = onnx.defs.get_schema(op, 18, "")
            if schema.since_version == 18:
                raise RuntimeError(f"{op} {node.name}: op changed in opset 18, no opset-17 rewrite here")
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = 17
    return model


def _export_torch(zm: ZooModel, path: str) -> None:
    """torch.onnx.export(dynamo=True) at opset 18, rewritten to opset 17, then cleaned and saved.

    Dynamic dims come from ``zm.spec`` (named "batch", "seq", "samples").  The trace uses batch=2:
    torch.export specialises a dim whose example value is 0 or 1.
    """
    import warnings

    torch = _torch()
    trace_dims = {**zm.dynamic_dims, **({"batch": 2} if "batch" in zm.dynamic_dims else {})}
    feeds = zm.random_inputs(1, **trace_dims)
    args = tuple(torch.from_numpy(feeds[k]) for k in zm.inputs)
    dim_objs = {k: torch.export.Dim(k, min=lo, max=hi) for k, (lo, hi) in zm.spec.dim_ranges.items()}
    dynamic_shapes = tuple(
        {ax: dim_objs[d] for ax, d in enumerate(zm.spec.input_dims[k]) if isinstance(d, str)} for k in zm.inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = torch.onnx.export(
            zm.module, args,
            input_names=list(zm.inputs), output_names=zm.output_names,
            opset_version=EXPORT_OPSET, dynamo=True, dynamic_shapes=dynamic_shapes,
            optimize=True, verbose=False, external_data=False,
        )
    _finish_and_save(_to_opset17(prog.model_proto), zm, path)


def _torch_zoo_model(name: str, size: str, seed: int, module) -> ZooModel:
    sp = spec(name, size)
    torch = _torch()
    feeds = sp.random_inputs(seed)
    return ZooModel(name=name, size=size, module=module.eval(),
                    inputs={k: torch.from_numpy(v) for k, v in feeds.items()},
                    dynamic_dims=dict(sp.dynamic_dims), spec=sp, exporter=_export_torch, seed=seed)


# --------------------------------------------------------------------------------------------
# Transformers: GPT-2, BERT, wav2vec2
# --------------------------------------------------------------------------------------------


def _wrappers():
    """Small modules giving the transformers models a plain tensor signature (tuple outputs)."""
    nn = _torch().nn

    class GPT2Logits(nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids):
            return self.model(input_ids=input_ids, use_cache=False, return_dict=False)[0]

    class BertEncoder(nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)
            return out[0], out[1]

    class Wav2Vec2Encoder(nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_values):
            return self.model(input_values=input_values, return_dict=False)[0]

    return GPT2Logits, BertEncoder, Wav2Vec2Encoder


def gpt2(size: str = "tiny", seed: int = SEED) -> ZooModel:
    """GPT-2 language model (GPT2LMHeadModel): input_ids -> logits, no KV cache."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch = _torch()
    config = GPT2Config(**CONFIGS["gpt2"][size], use_cache=False, bos_token_id=0, eos_token_id=0,
                        attn_implementation="eager")
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config).eval()
    _perturb_constant_params(model, seed)
    return _torch_zoo_model("gpt2", size, seed, _wrappers()[0](model))


def bert(size: str = "tiny", seed: int = SEED) -> ZooModel:
    """BERT encoder (BertModel): input_ids, attention_mask -> last_hidden_state, pooler_output."""
    from transformers import BertConfig, BertModel

    torch = _torch()
    config = BertConfig(**CONFIGS["bert"][size], attn_implementation="eager")
    torch.manual_seed(seed)
    model = BertModel(config).eval()
    _perturb_constant_params(model, seed)
    return _torch_zoo_model("bert", size, seed, _wrappers()[1](model))


def wav2vec2(size: str = "tiny", seed: int = SEED) -> ZooModel:
    """wav2vec 2.0 encoder (Wav2Vec2Model): input_values [batch, samples] -> last_hidden_state."""
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    torch = _torch()
    config = Wav2Vec2Config(**CONFIGS["wav2vec2"][size], feat_extract_norm="group", do_stable_layer_norm=False,
                            apply_spec_augment=False, attn_implementation="eager")
    torch.manual_seed(seed)
    model = Wav2Vec2Model(config).eval()
    _perturb_constant_params(model, seed)
    # The positional conv is weight-normed (a parametrization): bake w = g * v / ||v|| into a plain
    # weight.  Otherwise the exporter folds it for small weights only and the full model computes the
    # norm at run time (ReduceL2 / Div / Mul on weights), so tiny and full would differ.
    from torch.nn.utils import parametrize

    for mod in model.modules():
        if parametrize.is_parametrized(mod):
            for pname in list(mod.parametrizations):
                parametrize.remove_parametrizations(mod, pname, leave_parametrized=True)
    return _torch_zoo_model("wav2vec2", size, seed, _wrappers()[2](model))


# --------------------------------------------------------------------------------------------
# CNNs: ResNet-50 and GoogLeNet (Inception v1), plain torch.nn
# --------------------------------------------------------------------------------------------


def _cnn_classes():
    """Define the CNN modules (needs torch; called lazily)."""
    nn = _torch().nn

    class ConvBNReLU(nn.Sequential):
        def __init__(self, cin, cout, k, stride=1, padding=0, relu=True):
            layers = [nn.Conv2d(cin, cout, k, stride=stride, padding=padding, bias=False), nn.BatchNorm2d(cout)]
            if relu:
                layers.append(nn.ReLU(inplace=True))
            super().__init__(*layers)

    class Bottleneck(nn.Module):
        """ResNet v1.5 bottleneck: 1x1 -> 3x3 (stride here) -> 1x1 (x4), projection shortcut when needed."""

        expansion = 4

        def __init__(self, cin, width, stride):
            super().__init__()
            cout = width * self.expansion
            self.conv1 = ConvBNReLU(cin, width, 1)
            self.conv2 = ConvBNReLU(width, width, 3, stride=stride, padding=1)
            self.conv3 = ConvBNReLU(width, cout, 1, relu=False)
            self.conv3[1].init_gain = 0.5  # read by _calibrate_batchnorm
            self.downsample = ConvBNReLU(cin, cout, 1, stride=stride, relu=False) if (stride != 1 or cin != cout) else None
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):
            identity = x if self.downsample is None else self.downsample(x)
            return self.relu(self.conv3(self.conv2(self.conv1(x))) + identity)

    class ResNet50(nn.Module):
        def __init__(self, base_width=64, num_classes=1000, blocks=(3, 4, 6, 3)):
            super().__init__()
            w = base_width
            self.stem = nn.Sequential(ConvBNReLU(3, w, 7, stride=2, padding=3), nn.MaxPool2d(3, stride=2, padding=1))
            layers, cin = [], w
            for i, n in enumerate(blocks):
                width = w * 2**i
                for j in range(n):
                    layers.append(Bottleneck(cin, width, stride=2 if (j == 0 and i > 0) else 1))
                    cin = width * Bottleneck.expansion
            self.layers = nn.Sequential(*layers)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(cin, num_classes)

        def forward(self, x):
            x = self.pool(self.layers(self.stem(x)))
            return self.fc(x.flatten(1))

    class Inception(nn.Module):
        """Inception v1 block: 4 parallel branches (1x1 | 1x1->3x3 | 1x1->5x5 | maxpool->1x1), concatenated."""

        def __init__(self, cin, c1, c3r, c3, c5r, c5, cp):
            super().__init__()
            self.b1 = ConvBNReLU(cin, c1, 1)
            self.b2 = nn.Sequential(ConvBNReLU(cin, c3r, 1), ConvBNReLU(c3r, c3, 3, padding=1))
            self.b3 = nn.Sequential(ConvBNReLU(cin, c5r, 1), ConvBNReLU(c5r, c5, 5, padding=2))
            self.b4 = nn.Sequential(nn.MaxPool2d(3, stride=1, padding=1, ceil_mode=True), ConvBNReLU(cin, cp, 1))
            self.cout = c1 + c3 + c5 + cp

        def forward(self, x):
            return _torch().cat([self.b1(x), self.b2(x), self.b3(x), self.b4(x)], dim=1)

    # (name, in, 1x1, 3x3reduce, 3x3, 5x5reduce, 5x5, poolproj) from Szegedy et al. 2014, table 1
    GOOGLENET_BLOCKS = [
        ("3a", 192, 64, 96, 128, 16, 32, 32), ("3b", 256, 128, 128, 192, 32, 96, 64), "pool",
        ("4a", 480, 192, 96, 208, 16, 48, 64), ("4b", 512, 160, 112, 224, 24, 64, 64),
        ("4c", 512, 128, 128, 256, 24, 64, 64), ("4d", 512, 112, 144, 288, 32, 64, 64),
        ("4e", 528, 256, 160, 320, 32, 128, 128), "pool",
        ("5a", 832, 256, 160, 320, 32, 128, 128), ("5b", 832, 384, 192, 384, 48, 128, 128),
    ]

    class GoogLeNet(nn.Module):
        """Inception v1 (no auxiliary classifiers; BatchNorm after every conv, as torchvision, no LRN)."""

        def __init__(self, div=1, num_classes=1000):
            super().__init__()

            def c(n):
                return max(2, n // div)

            self.stem = nn.Sequential(
                ConvBNReLU(3, c(64), 7, stride=2, padding=3), nn.MaxPool2d(3, stride=2, ceil_mode=True),
                ConvBNReLU(c(64), c(64), 1), ConvBNReLU(c(64), c(192), 3, padding=1),
                nn.MaxPool2d(3, stride=2, ceil_mode=True),
            )
            blocks, cin, pools = [], c(192), 0
            for blk_spec in GOOGLENET_BLOCKS:
                if blk_spec == "pool":
                    pools += 1
                    # 3x3/2 after 3b, 2x2/2 after 4e (torchvision's choice; the paper's 3x3/2 also fits)
                    blocks.append(nn.MaxPool2d(3 if pools == 1 else 2, stride=2, ceil_mode=True))
                    continue
                _, _, *widths = blk_spec
                blk = Inception(cin, *[c(w) for w in widths])
                blocks.append(blk)
                cin = blk.cout
            self.blocks = nn.Sequential(*blocks)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.dropout = nn.Dropout(0.4)
            self.fc = nn.Linear(cin, num_classes)
            for m in self.modules():
                if isinstance(m, nn.BatchNorm2d):
                    m.init_bias_mean = 0.5  # read by _calibrate_batchnorm (fp16 conditioning, see there)

        def forward(self, x):
            x = self.pool(self.blocks(self.stem(x)))
            return self.fc(self.dropout(x.flatten(1)))

    class InceptionV3(nn.Module):
        """Inception v3 as torchvision builds it (no auxiliary classifier, no input transform): a
        stem, then Mixed_5b..7c: blocks of 4 parallel branches (factorised 1x7/7x1 and 1x3/3x1
        convolutions, average- and max-pool branches), concatenated. Widths divided by `div`."""

        def __init__(self, div=1, num_classes=1000):
            super().__init__()
            F = _torch().nn.functional

            def c(n):
                return max(2, n // div)

            def conv(cin, cout, k, **kw):
                block = ConvBNReLU(cin, c(cout), k, **kw)
                block[1].eps = 1e-3   # torchvision's BasicConv2d
                block[1].init_bias_mean = 0.5
                return block

            def seq(cin, *specs):   # a chain of convs: (cout, kernel, kwargs) each
                layers = []
                for cout, k, kw in specs:
                    layers.append(conv(cin, cout, k, **kw))
                    cin = c(cout)
                return nn.Sequential(*layers)

            def avg_pool(x):
                return F.avg_pool2d(x, 3, stride=1, padding=1)

            def max_pool(x):
                return F.max_pool2d(x, 3, stride=2)

            class Block(nn.Module):
                """Branches and a pool branch, concatenated; forks[i]: convs branch i ends in, side
                by side (Mixed_7b/7c split a branch into a 1x3 and a 3x1)."""

                def __init__(self, branches, pool, pool_conv=None, forks=()):
                    super().__init__()
                    self.branches, self.pool, self.pool_conv = nn.ModuleList(branches), pool, pool_conv
                    self.forks = nn.ModuleList(nn.ModuleList(f) for f in forks)

                def forward(self, x):
                    outs = []
                    for i, b in enumerate(self.branches):
                        y = b(x)
                        ends = self.forks[i] if i < len(self.forks) else []
                        outs += [f(y) for f in ends] if len(ends) else [y]
                    p = self.pool(x)
                    outs.append(self.pool_conv(p) if self.pool_conv is not None else p)
                    return _torch().cat(outs, 1)

            P1, P2 = dict(padding=1), dict(padding=2)
            r17, r71 = dict(padding=(0, 3)), dict(padding=(3, 0))
            r13, r31 = dict(padding=(0, 1)), dict(padding=(1, 0))

            def block_a(cin, pool_features):
                return Block([seq(cin, (64, 1, {})), seq(cin, (48, 1, {}), (64, 5, P2)),
                              seq(cin, (64, 1, {}), (96, 3, P1), (96, 3, P1))], avg_pool, conv(cin, pool_features, 1)), \
                    c(64) + c(64) + c(96) + c(pool_features)

            def block_b(cin):
                return Block([seq(cin, (384, 3, dict(stride=2))),
                              seq(cin, (64, 1, {}), (96, 3, P1), (96, 3, dict(stride=2)))], max_pool), c(384) + c(96) + cin

            def block_c(cin, c7):
                return Block([seq(cin, (192, 1, {})), seq(cin, (c7, 1, {}), (c7, (1, 7), r17), (192, (7, 1), r71)),
                              seq(cin, (c7, 1, {}), (c7, (7, 1), r71), (c7, (1, 7), r17), (c7, (7, 1), r71),
                                  (192, (1, 7), r17))], avg_pool, conv(cin, 192, 1)), 4 * c(192)

            def block_d(cin):
                return Block([seq(cin, (192, 1, {}), (320, 3, dict(stride=2))),
                              seq(cin, (192, 1, {}), (192, (1, 7), r17), (192, (7, 1), r71), (192, 3, dict(stride=2)))],
                             max_pool), c(320) + c(192) + cin

            def block_e(cin):
                forks = [[], *([conv(c(384), 384, (1, 3), **r13), conv(c(384), 384, (3, 1), **r31)] for _ in range(2))]
                return Block([seq(cin, (320, 1, {})), seq(cin, (384, 1, {})), seq(cin, (448, 1, {}), (384, 3, P1))],
                             avg_pool, conv(cin, 192, 1), forks), c(320) + 4 * c(384) + c(192)

            self.stem = nn.Sequential(seq(3, (32, 3, dict(stride=2)), (32, 3, {}), (64, 3, P1)), nn.MaxPool2d(3, stride=2),
                                      seq(c(64), (80, 1, {}), (192, 3, {})), nn.MaxPool2d(3, stride=2))
            blocks, cin = [], c(192)
            for make, args in [(block_a, (32,)), (block_a, (64,)), (block_a, (64,)), (block_b, ()),
                               (block_c, (128,)), (block_c, (160,)), (block_c, (160,)), (block_c, (192,)),
                               (block_d, ()), (block_e, ()), (block_e, ())]:
                blk, cin = make(cin, *args)
                blocks.append(blk)
            self.blocks = nn.Sequential(*blocks)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.dropout = nn.Dropout(0.5)
            self.fc = nn.Linear(cin, num_classes)

        def forward(self, x):
            x = self.pool(self.blocks(self.stem(x)))
            return self.fc(self.dropout(x.flatten(1)))

    return ResNet50, GoogLeNet, InceptionV3


def _cnn_zoo_model(name: str, size: str, seed: int, build) -> ZooModel:
    """build(cfg) -> the network, made after seeding torch; BatchNorm calibrated on a random batch."""
    torch = _torch()
    cfg = CONFIGS[name][size]
    torch.manual_seed(seed)
    net = build(cfg)
    _calibrate_batchnorm(net, (8, 3, cfg["image_size"], cfg["image_size"]), seed)
    return _torch_zoo_model(name, size, seed, net)


def resnet50(size: str = "tiny", seed: int = SEED) -> ZooModel:
    """ResNet-50 (v1.5: bottleneck blocks [3, 4, 6, 3], stride in the 3x3): input -> logits."""
    ResNet50, _, _ = _cnn_classes()
    return _cnn_zoo_model("resnet50", size, seed,
                          lambda cfg: ResNet50(base_width=cfg["base_width"], num_classes=cfg["num_classes"]))


def googlenet(size: str = "tiny", seed: int = SEED) -> ZooModel:
    """GoogLeNet / Inception v1 (9 inception blocks of 4 concatenated branches): input -> logits."""
    _, GoogLeNet, _ = _cnn_classes()
    return _cnn_zoo_model("googlenet", size, seed,
                          lambda cfg: GoogLeNet(div=cfg["width_div"], num_classes=cfg["num_classes"]))


def inception_v3(size: str = "tiny", seed: int = SEED) -> ZooModel:
    """Inception v3 (torchvision's layout: 11 blocks of parallel branches, Opara's headline model):
    input -> logits."""
    _, _, InceptionV3 = _cnn_classes()
    return _cnn_zoo_model("inception_v3", size, seed,
                          lambda cfg: InceptionV3(div=cfg["width_div"], num_classes=cfg["num_classes"]))


# --------------------------------------------------------------------------------------------
# control_flow: greedy decoding with Loop (data-dependent trip count) + If, built with onnx.helper
# --------------------------------------------------------------------------------------------

def _cf_weights(cfg: dict, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    V, H = cfg["vocab"], cfg["hidden"]
    s = 1.0 / np.sqrt(H)
    w = {
        "embedding": rng.standard_normal((V, H)) * 1.0,  # [V, H]
        "w_in": rng.standard_normal((H, H)) * s,  # x @ w_in
        "w_rec": rng.standard_normal((H, H)) * s * 1.5,  # h @ w_rec
        "b_h": rng.standard_normal((H,)) * 0.1,
        "w_first": rng.standard_normal((H, H)) * s,  # first-step branch: extra projection of x
        "w_out": rng.standard_normal((H, V)) * (8.0 * s),  # logits = h @ w_out + b_out
        "b_out": rng.standard_normal((V,)) * 0.1,
    }
    w["b_out"][cfg["eos"]] += cfg["eos_bias"]
    return {k: v.astype(np.float32) for k, v in w.items()}


def _cf_reference(w: dict, cfg: dict):
    """Numpy reference of the control_flow graph: (start_token [1], h0 [H]) -> (tokens, count, h_final)."""
    M, eos = cfg["max_len"], cfg["eos"]

    def run(feeds):
        tok = np.asarray(feeds["start_token"], dtype=np.int64).reshape(1)
        h = np.asarray(feeds["h0"], dtype=np.float32)
        buf = np.full((M,), -1, dtype=np.int64)
        n = np.int64(0)
        cond = bool(tok[0] != eos)
        i = 0
        while i < M and cond:
            x = w["embedding"][tok[0]]  # [H]
            pre = x @ w["w_in"] + h @ w["w_rec"] + w["b_h"]
            if i == 0:  # then-branch: first step also projects the start token directly
                h = np.tanh(pre + np.tanh(x @ w["w_first"]))
            else:  # else-branch: leaky (residual) update
                h = np.float32(0.5) * h + np.float32(0.5) * np.tanh(pre)
            h = h.astype(np.float32)
            logits = h @ w["w_out"] + w["b_out"]
            tok = np.array([int(np.argmax(logits))], dtype=np.int64)
            buf[i] = tok[0]
            n = np.int64(n + 1)
            cond = bool(tok[0] != eos)
            i += 1
        return [buf, np.array(n, dtype=np.int64), h]

    return run


def _cf_graph(w: dict, cfg: dict) -> onnx.ModelProto:
    """Build the ONNX model.

    inputs : start_token int64 [1], h0 float32 [H]
    outputs: tokens int64 [M] (generated ids, -1 after the end), count int64 [] (tokens generated,
             including the EOS if one was emitted), h_final float32 [H]
    Loop (max trip count M, cond = token != EOS) carries: token [1], h [H], tokens [M], count [].
    Body: Gather embedding; If(iter == 0) picks between two different hidden-state updates
    (each branch reads outer-scope values); MatMul+Add -> logits; ArgMax; the token is written into
    the buffer with a one-hot Where mask at the iteration index.
    """
    V, H, M, eos = cfg["vocab"], cfg["hidden"], cfg["max_len"], cfg["eos"]
    mk = helper.make_node
    f32, i64, b = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL

    def const(name, arr):
        return numpy_helper.from_array(np.asarray(arr), name)

    # ---- If branches (no inputs; they capture body / outer-scope values) ----
    then_graph = helper.make_graph(
        [
            mk("MatMul", ["x", "w_first"], ["t_proj"]),
            mk("Tanh", ["t_proj"], ["t_tanh"]),
            mk("Add", ["pre", "t_tanh"], ["t_sum"]),
            mk("Tanh", ["t_sum"], ["h_then"]),
        ],
        "first_step", [], [helper.make_tensor_value_info("h_then", f32, [H])],
    )
    else_graph = helper.make_graph(
        [
            mk("Tanh", ["pre"], ["e_tanh"]),
            mk("Mul", ["h_in", "half"], ["e_keep"]),
            mk("Mul", ["e_tanh", "half"], ["e_new"]),
            mk("Add", ["e_keep", "e_new"], ["h_else"]),
        ],
        "later_step", [], [helper.make_tensor_value_info("h_else", f32, [H])],
    )

    # ---- Loop body ----
    body_nodes = [
        mk("Gather", ["embedding", "tok_in"], ["x2d"], axis=0),  # [1, H]
        mk("Squeeze", ["x2d", "axes0"], ["x"]),  # [H]
        mk("MatMul", ["x", "w_in"], ["xw"]),
        mk("MatMul", ["h_in", "w_rec"], ["hw"]),
        mk("Add", ["xw", "hw"], ["xh"]),
        mk("Add", ["xh", "b_h"], ["pre"]),
        mk("Equal", ["iter", "zero_i64"], ["is_first"]),
        mk("If", ["is_first"], ["h_out"], then_branch=then_graph, else_branch=else_graph),
        mk("MatMul", ["h_out", "w_out"], ["logits_nb"]),
        mk("Add", ["logits_nb", "b_out"], ["logits"]),  # [V]
        mk("ArgMax", ["logits"], ["tok_out"], axis=0, keepdims=1),  # [1] int64
        # write the token at position `iter` of the buffer: one-hot mask + Where
        mk("Equal", ["positions", "iter"], ["at_iter"]),  # [M] bool
        mk("Expand", ["tok_out", "m_shape"], ["tok_bcast"]),  # [M]
        mk("Where", ["at_iter", "tok_bcast", "buf_in"], ["buf_out"]),
        mk("Add", ["count_in", "one_i64"], ["count_out"]),
        mk("Equal", ["tok_out", "eos"], ["is_eos1"]),
        mk("Not", ["is_eos1"], ["go1"]),
        mk("Squeeze", ["go1", "axes0"], ["cond_out"]),  # scalar bool
    ]
    body = helper.make_graph(
        body_nodes,
        "decode_step",
        [
            helper.make_tensor_value_info("iter", i64, []),
            helper.make_tensor_value_info("cond_in", b, []),
            helper.make_tensor_value_info("tok_in", i64, [1]),
            helper.make_tensor_value_info("h_in", f32, [H]),
            helper.make_tensor_value_info("buf_in", i64, [M]),
            helper.make_tensor_value_info("count_in", i64, []),
        ],
        [
            helper.make_tensor_value_info("cond_out", b, []),
            helper.make_tensor_value_info("tok_out", i64, [1]),
            helper.make_tensor_value_info("h_out", f32, [H]),
            helper.make_tensor_value_info("buf_out", i64, [M]),
            helper.make_tensor_value_info("count_out", i64, []),
        ],
    )

    # ---- main graph ----
    nodes = [
        mk("Equal", ["start_token", "eos"], ["start_is_eos"]),
        mk("Not", ["start_is_eos"], ["start_go"]),
        mk("Squeeze", ["start_go", "axes0"], ["cond0"]),
        mk("Loop", ["max_len", "cond0", "start_token", "h0", "buf_init", "count_init"],
           ["tok_final", "h_final", "tokens", "count"], body=body),
    ]
    inits = [const(k, v) for k, v in sorted(w.items())] + [
        const("max_len", np.array(M, dtype=np.int64)),
        const("eos", np.array([eos], dtype=np.int64)),
        const("axes0", np.array([0], dtype=np.int64)),
        const("zero_i64", np.array(0, dtype=np.int64)),
        const("one_i64", np.array(1, dtype=np.int64)),
        const("half", np.array(0.5, dtype=np.float32)),
        const("positions", np.arange(M, dtype=np.int64)),
        const("m_shape", np.array([M], dtype=np.int64)),
        const("buf_init", np.full((M,), -1, dtype=np.int64)),
        const("count_init", np.array(0, dtype=np.int64)),
    ]
    graph = helper.make_graph(
        nodes, "greedy_decode",
        [helper.make_tensor_value_info("start_token", i64, [1]), helper.make_tensor_value_info("h0", f32, [H])],
        [
            helper.make_tensor_value_info("tokens", i64, [M]),
            helper.make_tensor_value_info("count", i64, []),
            helper.make_tensor_value_info("h_final", f32, [H]),
        ],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="grapec-zoo", ir_version=8)
    return model


def control_flow(size: str = "tiny", seed: int = SEED) -> ZooModel:
    """Greedy decoding of a tiny RNN decoder: Loop with a data-dependent trip count, If inside."""
    sp = spec("control_flow", size)
    w = _cf_weights(sp.config, seed)

    def exporter(zm, path):
        _finish_and_save(_cf_graph(w, sp.config), zm, path)

    return ZooModel(name="control_flow", size=size, module=None, inputs=sp.random_inputs(seed), dynamic_dims={},
                    spec=sp, exporter=exporter, reference=_cf_reference(w, sp.config), weights=w, seed=seed)


def gpt2_generate(size: str = "tiny", seed: int = SEED) -> ZooModel:
    """GPT-2 greedy generation with a static KV cache, the whole decode loop as one ONNX Loop."""
    import generate

    sp = spec("gpt2_generate", size)
    cfg = sp.config
    from transformers import GPT2Config, GPT2LMHeadModel

    torch = _torch()
    # GPT-2's tied lm_head makes a random-weight model repeat its input token forever; an untied one
    # (also seeded) gives tokens that depend on the whole context, which is what a test needs.
    gpt2_cfg = {k: v for k, v in cfg.items() if k not in ("prompt_len", "max_new_tokens")}
    config = GPT2Config(**gpt2_cfg, tie_word_embeddings=False, bos_token_id=0, eos_token_id=0,
                        attn_implementation="eager")
    torch.manual_seed(seed)
    hf = GPT2LMHeadModel(config).eval()
    _perturb_constant_params(hf, seed)
    module = generate.greedy_decode_module(hf, cfg["prompt_len"], cfg["max_new_tokens"])

    def exporter(zm, path):
        _finish_and_save(generate.decode_graph(generate.gpt2_weights(hf), cfg, OPSET), zm, path)

    feeds = sp.random_inputs(seed)
    return ZooModel(name="gpt2_generate", size=size, module=module,
                    inputs={k: torch.from_numpy(v) for k, v in feeds.items()}, dynamic_dims={}, spec=sp,
                    exporter=exporter, seed=seed)


# --------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------

MODELS: dict[str, Callable[..., ZooModel]] = {
    "gpt2": gpt2,
    "bert": bert,
    "wav2vec2": wav2vec2,
    "resnet50": resnet50,
    "googlenet": googlenet,
    "inception_v3": inception_v3,
    "gpt2_generate": gpt2_generate,
    "control_flow": control_flow,
}
TORCH_MODELS = ("gpt2", "bert", "wav2vec2", "resnet50", "googlenet", "inception_v3", "gpt2_generate")


def get(name: str, size: str = "tiny", seed: int = SEED) -> ZooModel:
    """Build a zoo model (imports torch/transformers for all but control_flow)."""
    spec(name, size)  # validates name and size
    return MODELS[name](size=size, seed=seed)


def op_types(model: onnx.ModelProto) -> dict[str, int]:
    """Op types used by a model (including inside subgraphs), with counts; keys are 'domain::Op' off the default domain."""
    counts: dict[str, int] = {}

    def walk(g):
        for n in g.node:
            key = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}"
            counts[key] = counts.get(key, 0) + 1
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g)
                for sub in a.graphs:
                    walk(sub)

    walk(model.graph)
    return dict(sorted(counts.items()))
