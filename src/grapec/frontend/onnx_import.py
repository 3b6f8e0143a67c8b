"""Load an ONNX file (external data too) and import it into the graph IR, weights as numpy arrays.

Opsets: lowerings accept every form an op has had since opset 7 (axes as attribute or input, etc.),
the way onnx.reference does, so models are imported as they are; only models older than opset 7 go
through onnx.version_converter. (Converting everything to one opset fails on real models, e.g.
Upsample/Resize, and would rewrite what the user wrote.)
"""
from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .. import dtypes
from ..errors import ModelError, UnsupportedError
from ..ir.graph import Graph, Node, Value
from ..ops import lowering
from .external_data import bind_external_data, tensor_array, uses_external_data
from .proto import all_nodes, copy_model
from .recurrent import GATES, QUANTIZED_LSTM, recurrent_as_loops
from .scan import scans_as_loops

MIN_OPSET = 7


def load_model(path_or_model) -> onnx.ModelProto:
    if isinstance(path_or_model, onnx.ModelProto):
        return path_or_model
    path = os.fspath(path_or_model)
    if not os.path.exists(path):
        raise ModelError(f"{path}: no such file")
    if os.path.isdir(path):
        raise ModelError(f"{path}: is a directory, expected an .onnx file")
    try:
        model = onnx.load(path, load_external_data=False)   # external data is mapped, not read (external_data.py)
    except onnx.onnx_cpp2py_export.checker.ValidationError as e:  # pragma: no cover - defensive
        raise ModelError(f"{path}: invalid ONNX model: {e}") from None
    except FileNotFoundError as e:
        raise ModelError(f"{path}: external data file missing: {e.filename or e}") from None
    except Exception as e:  # protobuf DecodeError and friends: not an ONNX file
        raise ModelError(f"{path}: not an ONNX model ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'cannot parse'})") from None
    if not model.graph.node and not model.graph.output:
        raise ModelError(f"{path}: not an ONNX model (no graph found)")
    bind_external_data(model, os.path.dirname(os.path.abspath(path)), path)
    return model


def without_weight_data(model: onnx.ModelProto, at_least: int = 1 << 16) -> onnx.ModelProto:
    """A copy of the model whose initializers of at least `at_least` bytes keep their names, types and
    dims but not their values. Once imported, a compile holds its weights as numpy arrays; the proto
    is read on for its names, shapes and metadata only. (Clearing the fields in place frees nothing:
    protobuf keeps a message's memory until the whole message goes.)"""
    out = onnx.ModelProto()
    _copy_fields(model, out, skip="graph")
    _copy_fields(model.graph, out.graph, skip="initializer")
    for t in model.graph.initializer:
        if t.ByteSize() < at_least:
            out.graph.initializer.append(t)
        else:
            out.graph.initializer.append(onnx.TensorProto(name=t.name, data_type=t.data_type, dims=t.dims))
    return out


def _copy_fields(src, dst, skip: str):
    for field, value in src.ListFields():
        if field.name == skip:
            continue
        if field.is_repeated:
            getattr(dst, field.name).extend(value)
        elif field.type == field.TYPE_MESSAGE:
            getattr(dst, field.name).CopyFrom(value)
        else:
            setattr(dst, field.name, value)


def opset_of(model: onnx.ModelProto) -> int:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return o.version
    return 0


def import_model(model: onnx.ModelProto, where: str = "model", problems: list | None = None) -> Graph:
    """ModelProto -> Graph. Reports every unsupported op and dtype at once, after `problems` an
    earlier rewrite found (contrib.py)."""
    opset = opset_of(model)
    if 0 < opset < MIN_OPSET:
        try:
            model = onnx.version_converter.convert_version(model, MIN_OPSET)
            opset = MIN_OPSET
        except Exception as e:
            raise ModelError(f"{where}: opset {opset} is older than {MIN_OPSET} and could not be converted: {e}") from None
    problems = list(problems or [])
    unsupported_ops: dict = {}
    if any(n.op_type in ("Scan", QUANTIZED_LSTM, *GATES) for n in all_nodes(model.graph)):
        model = copy_model(model)   # the caller's model stays as given
        scans_as_loops(model.graph, opset, problems)
        recurrent_as_loops(model.graph, opset, problems)
    g = _import_graph(model.graph, None, opset, problems, unsupported_ops)
    for (op_type, dom), names in unsupported_ops.items():
        shown = ", ".join(f"'{n}'" for n in names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        problems.insert(0, f"op {op_type}{dom} (opset {opset}) is not supported: {len(names)} node(s), {shown}")
    if problems:
        problems = sorted(set(problems), key=problems.index)
        raise UnsupportedError(problems, header=f"{where}: {len(problems)} unsupported construct(s)")
    return g


def _value_from_info(info, problems, where) -> Value:
    t = info.type
    if not t.HasField("tensor_type"):
        problems.append(f"{where} '{info.name}': non-tensor type ({t.WhichOneof('value')}) is not supported")
        return Value(info.name)
    et = t.tensor_type.elem_type
    try:
        dt = dtypes.from_onnx(et) if et else None
    except KeyError:
        problems.append(f"{where} '{info.name}': element type {dtypes.onnx_name(et)} is not supported")
        dt = None
    shape = None
    if t.tensor_type.HasField("shape"):
        # paddle2onnx and some tf2onnx exports write an unknown dim as dim_value -1
        shape = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else (d.dim_param or "?")
                      for d in t.tensor_type.shape.dim)
    return Value(info.name, dt, shape)


def _const_array(tensor, problems, where):
    try:
        dtypes.from_onnx(tensor.data_type)
    except KeyError:
        problems.append(f"{where} '{tensor.name}': element type {dtypes.onnx_name(tensor.data_type)} is not supported")
        return None
    if uses_external_data(tensor):   # a read-only view of the file's bytes: never copied here
        return tensor_array(tensor)
    arr = numpy_helper.to_array(tensor)
    return np.array(arr, order="C")  # (ascontiguousarray would turn a 0-d scalar into shape (1,))


def _import_graph(gp, parent, opset, problems, unsupported_ops) -> Graph:
    g = Graph([], [], [o.name for o in gp.output], {}, gp.name or "main", parent, opset)
    inits = {t.name for t in gp.initializer}
    for t in gp.initializer:
        arr = _const_array(t, problems, "initializer")
        if arr is not None:
            g.values[t.name] = Value(t.name, dtypes.from_numpy(arr.dtype), tuple(arr.shape), arr)
    for t in gp.sparse_initializer:
        problems.append(f"sparse initializer '{t.values.name}' is not supported")
    for inp in gp.input:
        if inp.name in inits:
            continue  # IR < 4 lists weights as inputs too; they are constants here
        if parent is not None and inp.type.WhichOneof("value") is None:
            g.values[inp.name] = Value(inp.name)   # a body may leave its inputs untyped: Loop/Scan/If type them
        else:
            g.values[inp.name] = _value_from_info(inp, problems, "input")
        g.inputs.append(inp.name)
    for info in list(gp.value_info) + list(gp.output):
        if info.name not in g.values:
            v = _value_from_info(info, [], "value")  # declared types are hints only
            g.values.setdefault(info.name, Value(info.name, v.dtype, None))
    for i, n in enumerate(gp.node):
        name = n.name or f"{n.op_type}_{i}"
        if lowering(n.op_type, n.domain) is None:
            dom = f" (domain {n.domain})" if n.domain not in ("", "ai.onnx") else ""
            unsupported_ops.setdefault((n.op_type, dom), []).append(name)
        attrs, subgraphs = {}, {}
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                subgraphs[a.name] = _import_graph(a.g, g, opset, problems, unsupported_ops)
            elif a.type == onnx.AttributeProto.TENSOR:
                attrs[a.name] = _const_array(a.t, problems, f"attribute {a.name} of node '{name}'")
            elif a.type in (onnx.AttributeProto.GRAPHS, onnx.AttributeProto.SPARSE_TENSOR,
                            onnx.AttributeProto.TYPE_PROTO, onnx.AttributeProto.TYPE_PROTOS):
                problems.append(f"node '{name}' ({n.op_type}): attribute {a.name} of type "
                                f"{onnx.AttributeProto.AttributeType.Name(a.type)} is not supported")
            elif a.ref_attr_name:
                problems.append(f"node '{name}' ({n.op_type}): attribute reference {a.ref_attr_name} is not supported")
            else:
                v = helper.get_attribute_value(a)
                if isinstance(v, bytes):
                    v = v.decode("utf-8", "replace")
                elif isinstance(v, list) and v and isinstance(v[0], bytes):
                    v = [x.decode("utf-8", "replace") for x in v]
                attrs[a.name] = v
        g.nodes.append(Node(n.op_type, list(n.input), list(n.output), name, attrs, subgraphs, n.domain))
        for o in n.output:
            if o:
                g.values.setdefault(o, Value(o))
    return g
