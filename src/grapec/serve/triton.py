"""A bundle as a Triton Inference Server model: `grapec export-triton model.grape REPO/`.

    REPO/<name>/config.pbtxt       inputs, outputs and their dims from the bundle (-1 where a dim
                                   varies between its buckets or over a --dynamic range)
    REPO/<name>/1/model.py         the Python-backend model (triton_model.py): loads the bundle once
                                   per instance, runs each request with grapec
    REPO/<name>/1/model.grape      the bundle

On the CUDA backend the instance group is KIND_GPU with `instances` per GPU: Triton starts that many
instances on every GPU it sees, each loading the bundle on its own device. On the CPU backend it is
KIND_CPU. max_batch_size is 0: a bundle's batch dim is part of its shapes (compile the batch sizes
you serve as buckets), so Triton does not batch requests for it.

The model directory is written into a temporary directory next to it and renamed into place; an
existing model of that name is refused unless `overwrite` is set.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile

from ..bundle.format import Bundle
from ..errors import GrapecError, InputError

TRITON_TYPES = {"float32": "TYPE_FP32", "float16": "TYPE_FP16", "bfloat16": "TYPE_BF16", "float64": "TYPE_FP64",
                "int8": "TYPE_INT8", "int16": "TYPE_INT16", "int32": "TYPE_INT32", "int64": "TYPE_INT64",
                "uint8": "TYPE_UINT8", "uint16": "TYPE_UINT16", "uint32": "TYPE_UINT32", "uint64": "TYPE_UINT64",
                "bool": "TYPE_BOOL"}
MODEL_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
MODEL_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "triton_model.py")


def varying_dims(shapes: list) -> list:
    """Per axis, the size every shape agrees on, or -1 where they differ."""
    first = list(shapes[0])
    if any(len(s) != len(first) for s in shapes):
        raise GrapecError("the bundle's buckets give an input different ranks; Triton needs one rank per input")
    return [d if all(s[i] == d for s in shapes) else -1 for i, d in enumerate(first)]


def input_dims(bundle: Bundle) -> dict:
    """input name -> Triton dims over all of the bundle's buckets."""
    buckets = bundle.manifest["buckets"]
    return {i["name"]: varying_dims([b["shapes"][i["name"]] for b in buckets])
            for i in bundle.manifest["inputs"] if i["name"] in buckets[0]["shapes"]}


def output_dims(bundle: Bundle) -> dict:
    """output name -> Triton dims. Plans are read for every bucket, or for a --dynamic range's
    smallest and largest sizes (an output size that follows a dynamic dim differs between them)."""
    n = len(bundle.manifest["buckets"])
    which = [0, n - 1] if bundle.manifest.get("dynamic") else range(n)
    shapes: dict = {}
    for bi in which:
        plan = bundle.plans[bi]
        for name, b in plan.outputs:
            shapes.setdefault(name, []).append(list(plan.buffers[b].shape))
    return {name: varying_dims(s) for name, s in shapes.items()}


def _dtype(info: dict, what: str) -> str:
    t = TRITON_TYPES.get(info["dtype"])
    if t is None:
        raise GrapecError(f"{what} '{info['name']}' has type {info['dtype']}, which Triton cannot carry")
    return t


def _tensor(name: str, dtype: str, dims: list, optional: bool = False) -> str:
    # a scalar travels as dims [ 1 ]: Triton has no rank 0 for a model without batching (nor an empty
    # reshape), so the served model reshapes it (triton_model.py)
    dims_text = ", ".join(str(d) for d in dims) if dims else "1"
    extra = ", optional: true" if optional else ""
    return f'  {{ name: "{name}", data_type: {dtype}, dims: [ {dims_text} ]{extra} }}'


def triton_config(bundle: Bundle, name: str, backend: str, instances: int = 1) -> str:
    """config.pbtxt for the bundle served by the Python backend."""
    m = bundle.manifest
    ins, outs = input_dims(bundle), output_dims(bundle)
    inputs = [_tensor(i["name"], _dtype(i, "input"), ins.get(i["name"], [])) for i in m["inputs"]]
    # inputs fixed at compile time (--value): optional, and only their compiled value is accepted
    inputs += [_tensor(f["name"], _dtype(f, "input"), list(f["shape"]), optional=True) for f in m.get("fixed_inputs", [])]
    outputs = [_tensor(o["name"], _dtype(o, "output"), outs[o["name"]]) for o in m["outputs"]]
    kind = "KIND_GPU" if backend == "cuda" else "KIND_CPU"
    return "\n".join([
        f'name: "{name}"',
        'backend: "python"',
        "max_batch_size: 0",
        "input [", ",\n".join(inputs), "]",
        "output [", ",\n".join(outputs), "]",
        f"instance_group [ {{ kind: {kind}, count: {instances} }} ]",
        f'parameters: {{ key: "grapec_backend", value: {{ string_value: "{backend}" }} }}',
        'parameters: { key: "grapec_bundle", value: { string_value: "model.grape" } }',
        # every size's CUDA graph built as the instance loads (Session.build_graphs): no request pays a build
        'parameters: { key: "grapec_build_graphs", value: { string_value: "true" } }',
        "",
    ])


def default_backend(bundle: Bundle) -> str:
    """cuda where the bundle carries GPU code, else cpu."""
    return "cuda" if bundle.manifest.get("cuda") else "cpu"


def export_triton(bundle_path: str, repo: str, name: str | None = None, backend: str = "auto",
                  instances: int = 1, overwrite: bool = False) -> str:
    """Write the Triton model for the bundle at bundle_path into repo; -> the model's directory."""
    bundle = Bundle.read(bundle_path)
    name = name or os.path.splitext(os.path.basename(bundle_path))[0]
    if not MODEL_NAME.match(name):
        raise InputError(f"--name {name!r}: a Triton model name is letters, digits, '_', '-' and '.'")
    if instances < 1:
        raise InputError(f"--instances {instances}: at least one instance per device")
    backend = default_backend(bundle) if backend == "auto" else backend
    if backend == "cuda" and not bundle.manifest.get("cuda"):
        raise InputError(f"{bundle_path} has no GPU code: recompile it with --target, or export with --backend cpu")
    if os.path.exists(repo) and not os.path.isdir(repo):
        raise InputError(f"{repo} is a file; the model repository must be a directory")
    os.makedirs(repo, exist_ok=True)
    final = os.path.join(repo, name)
    if os.path.exists(final) and not overwrite:
        raise InputError(f"{final} exists; choose another --name or pass --overwrite to replace it")
    config = triton_config(bundle, name, backend, instances)
    tmp = tempfile.mkdtemp(prefix=f".{name}-", dir=repo)
    try:
        os.makedirs(os.path.join(tmp, "1"))
        with open(os.path.join(tmp, "config.pbtxt"), "w") as f:
            f.write(config)
        shutil.copyfile(MODEL_FILE, os.path.join(tmp, "1", "model.py"))
        shutil.copyfile(bundle_path, os.path.join(tmp, "1", "model.grape"))
        os.chmod(tmp, 0o755)
        if os.path.exists(final):   # overwrite: the old model goes only once the new one is complete
            old = tempfile.mkdtemp(prefix=f".{name}-old-", dir=repo)
            os.replace(final, os.path.join(old, name))
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final
