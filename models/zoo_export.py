"""How the torch zoo models become ONNX files: the torch exporter at opset 18, converted to opset 17,
weights perturbed off their constant inits, BatchNorms calibrated, metadata and external data."""
from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import helper, numpy_helper

import zoo_core
from zoo_core import EXPORT_OPSET, ZooModel, spec

# --------------------------------------------------------------------------------------------
# Helpers shared by the torch models
# --------------------------------------------------------------------------------------------


def import_torch():
    import torch

    return torch


def perturb_constant_params(module, seed: int, scale: float = 0.02) -> None:
    """Add seeded noise to parameters whose entries are all equal (zero biases, unit LN weights)."""
    torch = import_torch()
    g = torch.Generator().manual_seed(seed + 12345)
    with torch.no_grad():
        for _, p in sorted(module.named_parameters(), key=lambda kv: kv[0]):
            flat = p.detach().reshape(-1)
            if flat.numel() and bool((flat == flat[0]).all()):
                p.add_(torch.randn(p.shape, generator=g) * scale)


def calibrate_batchnorm(module, batch_shape, seed: int) -> None:
    """Randomise BN affine params, then set running stats from one seeded random batch.

    A BN with an ``init_gain`` attribute (the last BN of each ResNet residual branch) has its affine
    params scaled by it: it keeps the residual stream from drifting and the network well-conditioned
    (tiny fp32 vs fp64 logits error ~1e-5 instead of ~5e-5 with gain 1), in the spirit of zero_init_residual.
    A BN with an ``init_bias_mean`` attribute (GoogLeNet's) gets that mean added to its random bias: it sets
    the fraction of ReLUs that are active (~0.69 at 0.5 vs ~0.5 at 0).  With no residual path, a
    BN-ReLU chain at 50% active amplifies a relative perturbation ~1.2x per conv (~1.4x per inception
    block); at 0.5 the emulated fp16 logits error drops from ~1.4e-2 to ~5.5e-3 (and fp32 vs fp64 from ~9e-6 to ~3e-6).
    """
    torch = import_torch()
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
    if _tensor_bytes(model) > zoo_core.EXTERNAL_DATA_THRESHOLD:
        onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                  location=data_name, size_threshold=1024)
    else:
        onnx.save(model, path)


def finish_and_save(model: onnx.ModelProto, zm: ZooModel, path: str) -> None:
    """Inline local functions, strip exporter metadata, shape-infer, check, save."""
    if model.functions:
        model = onnx.inliner.inline_local_functions(model)
    _strip_node_metadata(model.graph)
    _remove_unused_initializers(model.graph)
    del model.graph.value_info[:]
    _add_metadata(model, zm)
    model.doc_string = f"grapec zoo model {zm.name} ({zm.size}), seeded random weights"
    large = _tensor_bytes(model) > zoo_core.EXTERNAL_DATA_THRESHOLD
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

    torch = import_torch()
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
    finish_and_save(_to_opset17(prog.model_proto), zm, path)


def torch_zoo_model(name: str, size: str, seed: int, module) -> ZooModel:
    sp = spec(name, size)
    torch = import_torch()
    feeds = sp.random_inputs(seed)
    return ZooModel(name=name, size=size, module=module.eval(),
                    inputs={k: torch.from_numpy(v) for k, v in feeds.items()},
                    dynamic_dims=dict(sp.dynamic_dims), spec=sp, exporter=_export_torch, seed=seed)
