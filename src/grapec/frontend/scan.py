"""Scan as a Loop: rewrite ONNX Scan (opset 9+) nodes before import, so that one control structure
(Loop: a WHILE region inside the CUDA graph, the same walker on the CPU) runs both.

    Scan(states.., xs..; body(states.., x_t..) -> (states.., y_t..))
      = trip := xs[0].shape[axis_0]
        Loop(trip, "", states..; body'(t, cond, states..)):
            x_t := Gather(xs[j], t or trip-1-t, axis_j)     per scan input
            <the Scan body>
            -> (cond, states.., y_t..)
        then each stacked y: reversed along axis 0 where its direction is reverse, and axis 0 moved
        to its scan_output_axis.

Loop stacks scan outputs along axis 0 and its body reads the outer scope, which is all Scan needs.
"""
from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from .proto import subgraphs


def scans_as_loops(graph: onnx.GraphProto, opset: int, problems: list) -> None:
    """Rewrite every Scan node of graph (and of its subgraphs) in place."""
    nodes = []
    for i, n in enumerate(graph.node):
        for body in subgraphs(n):
            scans_as_loops(body, opset, problems)
        if n.op_type == "Scan" and n.domain in ("", "ai.onnx") and opset >= 9:
            nodes += _scan_to_loop(n, n.name or f"Scan_{i}", problems)
        else:
            nodes.append(n)
    del graph.node[:]
    graph.node.extend(nodes)


def _scan_to_loop(n, name: str, problems: list) -> list:
    attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
    body: onnx.GraphProto = attrs["body"]
    m = int(attrs["num_scan_inputs"])
    n_states = len(n.input) - m
    k = len(body.output) - n_states
    in_axes = list(attrs.get("scan_input_axes") or [0] * m)
    in_dirs = list(attrs.get("scan_input_directions") or [0] * m)
    out_axes = list(attrs.get("scan_output_axes") or [0] * k)
    out_dirs = list(attrs.get("scan_output_directions") or [0] * k)
    p = f"{name}__scan"
    states, xs = list(n.input[:n_states]), list(n.input[n_states:])
    out = [helper.make_node("Shape", [xs[0]], [f"{p}_shape"]),
           helper.make_node("Constant", [], [f"{p}_axis"], value=helper.make_tensor("a", TensorProto.INT64, [], [in_axes[0]])),
           helper.make_node("Gather", [f"{p}_shape", f"{p}_axis"], [f"{p}_trip"], axis=0)]

    t, cond = f"{p}_t", f"{p}_cond"
    inner = [helper.make_node("Identity", [cond], [f"{p}_cond_out"])]
    one = f"{p}_one"
    if any(in_dirs):
        inner += [helper.make_node("Constant", [], [one], value=helper.make_tensor("o", TensorProto.INT64, [], [1])),
                  helper.make_node("Sub", [f"{p}_trip", t], [f"{p}_rest"]),
                  helper.make_node("Sub", [f"{p}_rest", one], [f"{p}_t_rev"])]
    for j, (x, elem) in enumerate(zip(xs, body.input[n_states:])):
        at = f"{p}_t_rev" if in_dirs[j] else t
        inner.append(helper.make_node("Gather", [x, at], [elem.name], axis=in_axes[j]))
    inner += list(body.node)
    loop_body = helper.make_graph(
        inner, f"{name}_body",
        [helper.make_tensor_value_info(t, TensorProto.INT64, []), helper.make_tensor_value_info(cond, TensorProto.BOOL, [])]
        + list(body.input[:n_states]),
        [helper.make_tensor_value_info(f"{p}_cond_out", TensorProto.BOOL, [])] + list(body.output),
        list(body.initializer), value_info=list(body.value_info))

    stacked = [f"{p}_y{j}" for j in range(k)]
    out.append(helper.make_node("Loop", [f"{p}_trip", ""] + states, list(n.output[:n_states]) + stacked,
                                name=name, body=loop_body))
    for j, (y, final) in enumerate(zip(stacked, n.output[n_states:])):
        if out_dirs[j]:
            rev = f"{y}_rev"
            out += [helper.make_node("Constant", [], [f"{rev}_s"], value=helper.make_tensor("s", TensorProto.INT64, [1], [-1])),
                    helper.make_node("Constant", [], [f"{rev}_e"], value=helper.make_tensor("e", TensorProto.INT64, [1], [-(2**63)])),
                    helper.make_node("Constant", [], [f"{rev}_a"], value=helper.make_tensor("a", TensorProto.INT64, [1], [0])),
                    helper.make_node("Slice", [y, f"{rev}_s", f"{rev}_e", f"{rev}_a", f"{rev}_s"], [rev])]
            y = rev
        axis = out_axes[j]
        if axis == 0:
            out.append(helper.make_node("Identity", [y], [final]))
            continue
        rank = _rank(body.output[n_states + j])
        if rank is None:
            problems.append(f"node '{name}' (Scan): scan_output_axes {axis} needs the rank of body output "
                            f"'{body.output[n_states + j].name}', which the model does not declare")
            continue
        axis = axis + rank + 1 if axis < 0 else axis
        perm = list(range(1, axis + 1)) + [0] + list(range(axis + 1, rank + 1))
        out.append(helper.make_node("Transpose", [y], [final], perm=perm))
    return out


def _rank(info: onnx.ValueInfoProto):
    t = info.type.tensor_type
    return len(t.shape.dim) if t.HasField("shape") else None
