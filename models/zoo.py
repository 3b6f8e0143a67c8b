"""grapec model zoo: seeded, self-contained models exported to ONNX.

Every zoo model is built from a config and seeded random weights (``torch.manual_seed`` /
``numpy.random.default_rng``); nothing is downloaded.  Each builder takes ``size="tiny"|"full"``
and returns a :class:`ZooModel`.

    from models import zoo            # or: sys.path.insert(0, "models"); import zoo
    zm = zoo.get("gpt2", size="tiny")
    zm.export("gpt2.onnx")
    feeds = zm.random_inputs(seed=0, batch=2, seq=5)   # numpy only, any dynamic-dim values

torch / transformers are imported lazily, so this module (``MODELS``, ``random_inputs``, the
control-flow model and its numpy reference) works on a machine with only numpy + onnx.

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
import time
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
# ZooModel
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class ZooModel:
    """One zoo model.

    name:          registry name ("gpt2", ...)
    size:          "tiny" or "full"
    module:        torch.nn.Module in eval mode with seeded weights (None for control_flow)
    inputs:        example inputs, name -> torch tensor (torch models) or numpy array (control_flow)
    dynamic_dims:  dynamic dim name -> its value in ``inputs``, e.g. {"batch": 1, "seq": 8}
    input_dims:    input name -> list of dims, each an int or a dynamic dim name
    output_names:  ONNX output names, in order
    make_inputs:   (rng, dims) -> dict of numpy inputs; random, never all-zero, correct dtypes
    reference:     numpy reference implementation (control_flow only): feeds -> list of outputs
    config:        the hyper-parameters used (for the README / reproducibility)
    """

    name: str
    size: str
    module: Any
    inputs: dict[str, Any]
    dynamic_dims: dict[str, int]
    input_dims: dict[str, list]
    output_names: list[str]
    make_inputs: Callable[[np.random.Generator, dict[str, int]], dict[str, np.ndarray]]
    exporter: Callable[["ZooModel", str], None]
    reference: Callable[[dict[str, np.ndarray]], list[np.ndarray]] | None = None
    config: dict[str, Any] = dataclasses.field(default_factory=dict)

    def export(self, path: str | os.PathLike) -> str:
        """Write the ONNX file to ``path`` (weights inline, or in ``<path>.data`` above 1.5 GB)."""
        path = os.fspath(path)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.exporter(self, path)
        return path

    def random_inputs(self, seed: int = 0, **dims: int) -> dict[str, np.ndarray]:
        """Fresh seeded random numpy inputs; dynamic dims default to ``dynamic_dims``."""
        unknown = set(dims) - set(self.dynamic_dims)
        if unknown:
            raise ValueError(f"{self.name}: unknown dynamic dims {sorted(unknown)}")
        full = {**self.dynamic_dims, **dims}
        return self.make_inputs(np.random.default_rng(seed), full)

    def numpy_inputs(self) -> dict[str, np.ndarray]:
        """``inputs`` as numpy arrays."""
        return {k: (v.detach().cpu().numpy() if hasattr(v, "detach") else np.asarray(v))
                for k, v in self.inputs.items()}

    def run_torch(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Run the torch module on numpy feeds; returns outputs in ``output_names`` order."""
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
        """sha256 over the module's state dict (or the numpy weights): identifies the seeded weights."""
        h = hashlib.sha256()
        if self.module is not None:
            for k, v in sorted(self.module.state_dict().items()):
                h.update(k.encode())
                h.update(v.detach().contiguous().cpu().numpy().tobytes())
        else:
            for k, v in sorted(self.config.get("_weights", {}).items()):
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


def _calibrate_batchnorm(module, example, seed: int) -> None:
    """Randomise BN affine params, then set running stats from one seeded random batch.

    A BN with an ``init_gain`` attribute (the last BN of each ResNet residual branch) has its affine
    params scaled by it: it keeps the residual stream from drifting and the network well-conditioned
    (fp32 vs fp64 error ~1e-6 instead of ~5e-5 with gain 1), in the spirit of zero_init_residual.
    """
    torch = _torch()
    g = torch.Generator().manual_seed(seed + 777)
    bns = [m for m in module.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    with torch.no_grad():
        for bn in bns:
            gain = getattr(bn, "init_gain", 1.0)
            bn.weight.copy_(gain * (0.75 + 0.5 * torch.rand(bn.weight.shape, generator=g)))
            bn.bias.copy_(gain * 0.1 * torch.randn(bn.bias.shape, generator=g))
            bn.reset_running_stats()
            bn.momentum = None  # cumulative average: after one batch, running stats = batch stats
        module.train()
        module(torch.randn(example.shape, generator=g))
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
        "grapec.zoo.seed": str(zm.config.get("seed", SEED)),
        "grapec.zoo.weights_sha256": zm.weights_digest(),
        "grapec.zoo.dynamic_dims": ",".join(f"{k}={v}" for k, v in zm.dynamic_dims.items()),
    }
    try:
        import torch

        meta["grapec.zoo.torch"] = torch.__version__
        import transformers

        meta["grapec.zoo.transformers"] = transformers.__version__
    except ImportError:
        pass
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

    onnx's version converter keeps `num_outputs` when going 18 -> 17, which makes an invalid model, so
    the sizes are filled in here from shape inference (the split axis is static in all zoo models).
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


def _torch_exporter(dynamic_axes: dict[str, dict[int, str]], trace_dims: dict[str, int]):
    """Build an ``exporter(zm, path)`` using torch.onnx.export(dynamo=True) at opset 17.

    ``trace_dims`` overrides dynamic dims for tracing: torch.export specialises dims whose example
    value is 0 or 1, so e.g. batch is traced at 2.
    """

    def exporter(zm: ZooModel, path: str) -> None:
        torch = _torch()
        dims = {**zm.dynamic_dims, **trace_dims}
        feeds = zm.make_inputs(np.random.default_rng(1), dims)
        args = tuple(torch.from_numpy(feeds[k]) for k in zm.inputs)
        dim_objs = {}
        for name, d in dims.items():
            lo, hi = zm.config.get("dim_ranges", {}).get(name, (1, MAX_BATCH))
            dim_objs[name] = torch.export.Dim(name, min=lo, max=hi)
        dynamic_shapes = {k: {ax: dim_objs[d] for ax, d in dynamic_axes.get(k, {}).items()} for k in zm.inputs}
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prog = torch.onnx.export(
                zm.module,
                args,
                input_names=list(zm.inputs),
                output_names=zm.output_names,
                opset_version=EXPORT_OPSET,
                dynamo=True,
                dynamic_shapes=tuple(dynamic_shapes[k] for k in zm.inputs),
                optimize=True,
                verbose=False,
                external_data=False,
            )
        model = _to_opset17(prog.model_proto)
        _finish_and_save(model, zm, path)

    return exporter


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


def _token_ids(rng: np.random.Generator, shape, vocab: int) -> np.ndarray:
    return rng.integers(0, vocab, size=shape, dtype=np.int64)


def gpt2(size: str = "tiny", seed: int = SEED) -> ZooModel:
    """GPT-2 language model (GPT2LMHeadModel), input_ids -> logits, no KV cache."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch = _torch()
    if size == "full":  # GPT-2 small
        cfg = dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)
        dims = {"batch": 1, "seq": 128}
    elif size == "tiny":
        cfg = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=64)
        dims = {"batch": 1, "seq": 8}
    else:
        raise ValueError(size)
    config = GPT2Config(**cfg, use_cache=False, bos_token_id=0, eos_token_id=0,
                        attn_implementation="eager")
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config).eval()
    _perturb_constant_params(model, seed)
    module = _wrappers()[0](model).eval()
    vocab = cfg["vocab_size"]

    def make_inputs(rng, d):
        return {"input_ids": _token_ids(rng, (d["batch"], d["seq"]), vocab)}

    axes = {"input_ids": {0: "batch", 1: "seq"}}
    return ZooModel(
        name="gpt2", size=size, module=module,
        inputs={k: torch.from_numpy(v) for k, v in make_inputs(np.random.default_rng(seed), dims).items()},
        dynamic_dims=dims, input_dims={"input_ids": ["batch", "seq"]}, output_names=["logits"],
        make_inputs=make_inputs, exporter=_torch_exporter(axes, {"batch": 2}),
        config={**cfg, "seed": seed, "dim_ranges": {"batch": (1, MAX_BATCH), "seq": (2, cfg["n_positions"])}},
    )


def bert(size: str = "tiny", seed: int = SEED) -> ZooModel:
    """BERT encoder (BertModel): input_ids, attention_mask -> last_hidden_state, pooler_output."""
    from transformers import BertConfig, BertModel

    torch = _torch()
    if size == "full":  # bert-base-uncased shape
        cfg = dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, intermediate_size=3072,
                   vocab_size=30522, max_position_embeddings=512)
        dims = {"batch": 1, "seq": 128}
    elif size == "tiny":
        cfg = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                   vocab_size=512, max_position_embeddings=64)
        dims = {"batch": 1, "seq": 8}
    else:
        raise ValueError(size)
    config = BertConfig(**cfg, attn_implementation="eager")
    torch.manual_seed(seed)
    model = BertModel(config).eval()
    _perturb_constant_params(model, seed)
    module = _wrappers()[1](model).eval()
    vocab = cfg["vocab_size"]

    def make_inputs(rng, d):
        b, s = d["batch"], d["seq"]
        mask = np.ones((b, s), dtype=np.int64)
        for i in range(b):  # padding: every row but the first (the only one if b == 1) ends in zeros
            if i > 0 or b == 1:
                mask[i, s - int(rng.integers(1, max(1, s // 2) + 1)):] = 0
        mask[:, 0] = 1
        return {"input_ids": _token_ids(rng, (b, s), vocab), "attention_mask": mask}

    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
    return ZooModel(
        name="bert", size=size, module=module,
        inputs={k: torch.from_numpy(v) for k, v in make_inputs(np.random.default_rng(seed), dims).items()},
        dynamic_dims=dims, input_dims={"input_ids": ["batch", "seq"], "attention_mask": ["batch", "seq"]},
        output_names=["last_hidden_state", "pooler_output"],
        make_inputs=make_inputs, exporter=_torch_exporter(axes, {"batch": 2}),
        config={**cfg, "seed": seed,
                "dim_ranges": {"batch": (1, MAX_BATCH), "seq": (2, cfg["max_position_embeddings"])}},
    )


def wav2vec2(size: str = "tiny", seed: int = SEED) -> ZooModel:
    """wav2vec 2.0 encoder (Wav2Vec2Model): input_values [batch, samples] -> last_hidden_state."""
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    torch = _torch()
    if size == "full":  # facebook/wav2vec2-base shape
        cfg = dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, intermediate_size=3072,
                   conv_dim=(512,) * 7, conv_kernel=(10, 3, 3, 3, 3, 2, 2), conv_stride=(5, 2, 2, 2, 2, 2, 2),
                   num_conv_pos_embeddings=128, num_conv_pos_embedding_groups=16)
        dims = {"batch": 1, "samples": 16000}
        samples_range = (400, 16000 * 30)
    elif size == "tiny":
        cfg = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                   conv_dim=(32, 32, 32), conv_kernel=(10, 3, 3), conv_stride=(5, 2, 2),
                   num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)
        dims = {"batch": 1, "samples": 1600}
        samples_range = (400, 16000)
    else:
        raise ValueError(size)
    config = Wav2Vec2Config(**cfg, feat_extract_norm="group", do_stable_layer_norm=False,
                            apply_spec_augment=False, attn_implementation="eager")
    torch.manual_seed(seed)
    model = Wav2Vec2Model(config).eval()
    _perturb_constant_params(model, seed)
    module = _wrappers()[2](model).eval()

    def make_inputs(rng, d):
        return {"input_values": rng.standard_normal((d["batch"], d["samples"])).astype(np.float32)}

    axes = {"input_values": {0: "batch", 1: "samples"}}
    return ZooModel(
        name="wav2vec2", size=size, module=module,
        inputs={k: torch.from_numpy(v) for k, v in make_inputs(np.random.default_rng(seed), dims).items()},
        dynamic_dims=dims, input_dims={"input_values": ["batch", "samples"]},
        output_names=["last_hidden_state"],
        make_inputs=make_inputs, exporter=_torch_exporter(axes, {"batch": 2}),
        config={**{k: (list(v) if isinstance(v, tuple) else v) for k, v in cfg.items()}, "seed": seed,
                "dim_ranges": {"batch": (1, MAX_BATCH), "samples": samples_range}},
    )


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
            for spec in GOOGLENET_BLOCKS:
                if spec == "pool":
                    pools += 1
                    # 3x3/2 after 3b, 2x2/2 after 4e (torchvision's choice; the paper's 3x3/2 also fits)
                    blocks.append(nn.MaxPool2d(3 if pools == 1 else 2, stride=2, ceil_mode=True))
                    continue
                _, _, *widths = spec
                blk = Inception(cin, *[c(w) for w in widths])
                blocks.append(blk)
                cin = blk.cout
            self.blocks = nn.Sequential(*blocks)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.dropout = nn.Dropout(0.4)
            self.fc = nn.Linear(cin, num_classes)

        def forward(self, x):
            x = self.pool(self.blocks(self.stem(x)))
            return self.fc(self.dropout(x.flatten(1)))

    return ResNet50, GoogLeNet


def _cnn_model(name: str, net, size: str, seed: int, hw: int, cfg: dict) -> ZooModel:
    torch = _torch()
    dims = {"batch": 1}

    def make_inputs(rng, d):
        return {"input": rng.standard_normal((d["batch"], 3, hw, hw)).astype(np.float32)}

    _calibrate_batchnorm(net, torch.zeros(8, 3, hw, hw), seed)
    net.eval()
    return ZooModel(
        name=name, size=size, module=net,
        inputs={k: torch.from_numpy(v) for k, v in make_inputs(np.random.default_rng(seed), dims).items()},
        dynamic_dims=dims, input_dims={"input": ["batch", 3, hw, hw]}, output_names=["logits"],
        make_inputs=make_inputs, exporter=_torch_exporter({"input": {0: "batch"}}, {"batch": 2}),
        config={**cfg, "input_hw": hw, "seed": seed, "dim_ranges": {"batch": (1, MAX_BATCH)}},
    )


def resnet50(size: str = "tiny", seed: int = SEED) -> ZooModel:
    """ResNet-50 (v1.5, bottleneck blocks [3, 4, 6, 3]); input [batch, 3, H, W] -> logits."""
    torch = _torch()
    ResNet50, _ = _cnn_classes()
    if size == "full":
        cfg, hw = dict(base_width=64, num_classes=1000), 224
    elif size == "tiny":
        cfg, hw = dict(base_width=8, num_classes=10), 64
    else:
        raise ValueError(size)
    torch.manual_seed(seed)
    return _cnn_model("resnet50", ResNet50(**cfg), size, seed, hw, cfg)


def googlenet(size: str = "tiny", seed: int = SEED) -> ZooModel:
    """GoogLeNet / Inception v1 (9 inception blocks of 4 concatenated branches); input -> logits."""
    torch = _torch()
    _, GoogLeNet = _cnn_classes()
    if size == "full":
        cfg, hw = dict(div=1, num_classes=1000), 224
    elif size == "tiny":
        cfg, hw = dict(div=8, num_classes=10), 64
    else:
        raise ValueError(size)
    torch.manual_seed(seed)
    return _cnn_model("googlenet", GoogLeNet(**cfg), size, seed, hw, cfg)


# --------------------------------------------------------------------------------------------
# control_flow: greedy decoding with Loop (data-dependent trip count) + If, built with onnx.helper
# --------------------------------------------------------------------------------------------

_CF_SIZES = {
    # vocab V, hidden H, max_len M, eos token, logit bias on EOS
    "tiny": dict(vocab=32, hidden=16, max_len=16, eos=0, eos_bias=2.0),
    "full": dict(vocab=4096, hidden=512, max_len=64, eos=0, eos_bias=6.0),
}


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
    """Greedy decoding of a tiny RNN decoder: Loop with data-dependent trip count, If inside."""
    if size not in _CF_SIZES:
        raise ValueError(size)
    cfg = dict(_CF_SIZES[size])
    w = _cf_weights(cfg, seed)
    V, H, M, eos = cfg["vocab"], cfg["hidden"], cfg["max_len"], cfg["eos"]

    def make_inputs(rng, d):
        return {
            "start_token": rng.integers(1, V, size=(1,), dtype=np.int64),  # never starts at EOS
            "h0": rng.standard_normal((H,)).astype(np.float32),
        }

    def exporter(zm, path):
        model = _cf_graph(w, cfg)
        _finish_and_save(model, zm, path)

    return ZooModel(
        name="control_flow", size=size, module=None,
        inputs=make_inputs(np.random.default_rng(seed), {}), dynamic_dims={},
        input_dims={"start_token": [1], "h0": [H]}, output_names=["tokens", "count", "h_final"],
        make_inputs=make_inputs, exporter=exporter, reference=_cf_reference(w, cfg),
        config={**cfg, "seed": seed, "_weights": w},
    )


# --------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------

MODELS: dict[str, Callable[..., ZooModel]] = {
    "gpt2": gpt2,
    "bert": bert,
    "wav2vec2": wav2vec2,
    "resnet50": resnet50,
    "googlenet": googlenet,
    "control_flow": control_flow,
}
TORCH_MODELS = ("gpt2", "bert", "wav2vec2", "resnet50", "googlenet")


def get(name: str, size: str = "tiny", seed: int = SEED) -> ZooModel:
    if name not in MODELS:
        raise KeyError(f"unknown zoo model {name!r}; known: {', '.join(MODELS)}")
    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES}, got {size!r}")
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


def export_all(out_dir: str, size: str = "tiny", names=None) -> list[tuple[str, str, float, float]]:
    rows = []
    for name in names or MODELS:
        t = time.time()
        zm = get(name, size)
        path = zm.export(os.path.join(out_dir, f"{name}.onnx"))
        rows.append((name, path, os.path.getsize(path) / 1e6, time.time() - t))
    return rows
