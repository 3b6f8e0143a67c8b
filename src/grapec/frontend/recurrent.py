"""LSTM, GRU and RNN as Loops: rewritten before import into ONNX ops the compiler already has, so
the sequence runs as one WHILE region inside the CUDA graph (the same walker on the CPU).

Per direction:
    XW   := X @ W^T + Wb                      all time steps in one GEMM, before the loop
    Loop(seq_len, "", H0 [, C0]; body(t, cond, H [, C])):
        xw_t := Gather(XW, t or seq_len-1-t)  (reverse direction walks backwards)
        gates := xw_t + H @ R^T + Rb          (GRU's candidate gate: as the spec's linear_before_reset says)
        the op's equations (clip, peepholes, input_forget, activations) -> H' [, C']
        -> (cond, H' [, C'], H')              H' also stacked as the scan output
    Y := the stacked H' (reversed back for the reverse direction); Y_h, Y_c := the final states.

Only the recurrence H @ R^T stays in the loop; the input projection is batched over the sequence.
With `sequence_lens` (forward direction), steps past a sequence's length keep its state and write
zeros to Y, as the spec says.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .proto import NodeBuilder, subgraphs

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
# onnxruntime's quantizer writes LSTM with int8 weights as this contrib op: W [dirs, in, 4h] and
# R [dirs, h, 4h] (stored transposed) with per-direction (or per-column) scales and zero points,
# inputs 8..11. onnxruntime's kernel quantizes the activations to uint8 on the fly (min/max range
# including 0, round half to even): X once for all steps, and H at each step, one batch row at a
# time (its rows are split over threads; with as many threads as rows, one row each), then takes
# the products in int32 and scales them. The rewrite does the same, so it agrees to float rounding
# (7e-8 on ddddocr's LSTM); where onnxruntime groups several rows per thread, its answer differs
# by their shared quantization range.
QUANTIZED_LSTM = "DynamicQuantizeLSTM"
DEFAULT_ACTS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}
WITH_ALPHA = {"LeakyRelu": 0.01, "ThresholdedRelu": 1.0, "Elu": 1.0, "HardSigmoid": 0.2, "ScaledTanh": 1.0, "Affine": 1.0}
WITH_BETA = {"HardSigmoid": 0.5, "ScaledTanh": 1.0, "Affine": 0.0}


def recurrent_as_loops(graph: onnx.GraphProto, opset: int, problems: list) -> None:
    """Rewrite every LSTM/GRU/RNN node of graph (and of its subgraphs) in place."""
    nodes = []
    for i, n in enumerate(graph.node):
        for body in subgraphs(n):
            recurrent_as_loops(body, opset, problems)
        if (n.op_type in GATES and n.domain in ("", "ai.onnx")) or (n.op_type == QUANTIZED_LSTM and n.domain == "com.microsoft"):
            name = n.name or f"{n.op_type}_{i}"
            try:
                nodes += _Rewrite(n, name, opset, graph).nodes()
            except _Unsupported as e:
                problems.append(f"node '{name}' ({n.op_type}): {e}")
                nodes.append(n)
        else:
            nodes.append(n)
    del graph.node[:]
    graph.node.extend(nodes)


class _Unsupported(Exception):
    pass


class _Builder(NodeBuilder):
    """NodeBuilder with the recurrent ops' activations."""

    def act(self, name: str, x: str, alpha: float, beta: float) -> str:
        if name in ("Sigmoid", "Tanh", "Relu", "Softsign", "Softplus"):
            return self.node(name, [x])
        if name in ("LeakyRelu", "ThresholdedRelu", "Elu"):
            return self.node(name, [x], alpha=alpha)
        if name == "HardSigmoid":
            return self.node(name, [x], alpha=alpha, beta=beta)
        if name == "ScaledTanh":   # alpha * tanh(beta * x)
            return self.node("Mul", [self.node("Tanh", [self.node("Mul", [x, self.fconst(beta)])]), self.fconst(alpha)])
        if name == "Affine":       # alpha * x + beta
            return self.node("Add", [self.node("Mul", [x, self.fconst(alpha)]), self.fconst(beta)])
        raise _Unsupported(f"activation {name} is not supported")



class _Rewrite:
    def __init__(self, n, name: str, opset: int, graph):
        self.quantized = n.op_type == QUANTIZED_LSTM
        self.n, self.op, self.name = n, "LSTM" if self.quantized else n.op_type, name
        self.attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        self.ins = list(n.input) + [""] * (12 - len(n.input))
        self.b = _Builder(f"{name}__rnn", opset, _float_dtype(graph, self.ins[0]))
        if opset < 10:
            raise _Unsupported(f"opset {opset}: the rewrite needs opset 10 or later")
        if self.ins[4] and _text(self.attrs.get("direction", "forward")) != "forward":
            raise _Unsupported("sequence_lens with a reverse direction is not supported (forward is)")
        self.hidden = self.attrs.get("hidden_size")
        if not self.hidden:
            raise _Unsupported("the hidden_size attribute is required")
        self.dirs = {"forward": [0], "reverse": [1], "bidirectional": [0, 1]}.get(
            _text(self.attrs.get("direction", "forward")))
        if self.dirs is None:
            raise _Unsupported(f"direction {self.attrs.get('direction')!r}")
        self.layout = int(self.attrs.get("layout", 0))
        self.clip = self.attrs.get("clip")
        self.acts = self._activations()

    def _activations(self) -> list:
        """Per direction, the op's activations with their alpha and beta."""
        names = [_text(a) for a in self.attrs.get("activations", [])] or DEFAULT_ACTS[self.op] * len(self.dirs)
        names = [{"sigmoid": "Sigmoid", "tanh": "Tanh", "relu": "Relu"}.get(a.lower(), a) for a in names]
        alphas, betas = list(self.attrs.get("activation_alpha", [])), list(self.attrs.get("activation_beta", []))
        per = len(DEFAULT_ACTS[self.op])
        if len(names) != per * len(self.dirs):
            raise _Unsupported(f"{len(names)} activations, expected {per * len(self.dirs)}")
        out = []
        for a in names:
            alpha = alphas.pop(0) if a in WITH_ALPHA and alphas else WITH_ALPHA.get(a, 0.0)
            beta = betas.pop(0) if a in WITH_BETA and betas else WITH_BETA.get(a, 0.0)
            out.append((a, alpha, beta))
        return [out[i * per:(i + 1) * per] for i in range(len(self.dirs))]

    def nodes(self) -> list:
        b, outs = self.b, list(self.n.output) + [""] * 3
        x = self.ins[0]
        if self.layout:
            x = b.node("Transpose", [x], perm=[1, 0, 2])
        trip = b.node("Gather", [b.node("Shape", [x]), b.const(0)], axis=0)
        ys, hs, cs = [], [], []
        for k, d in enumerate(self.dirs):
            y, h, c = self._direction(x, trip, k, d == 1)
            ys.append(b.unsqueeze(y, 1))
            hs.append(b.unsqueeze(h, 0))
            cs.append(b.unsqueeze(c, 0) if c else None)
        y_all = b.node("Concat", ys, axis=1) if len(ys) > 1 else ys[0]
        h_all = b.node("Concat", hs, axis=0) if len(hs) > 1 else hs[0]
        if outs[0]:
            b.node("Transpose" if self.layout else "Identity", [y_all], out=outs[0],
                   **({"perm": [2, 0, 1, 3]} if self.layout else {}))
        if outs[1]:
            b.node("Transpose" if self.layout else "Identity", [h_all], out=outs[1],
                   **({"perm": [1, 0, 2]} if self.layout else {}))
        if self.op == "LSTM" and outs[2]:
            c_all = b.node("Concat", cs, axis=0) if len(cs) > 1 else cs[0]
            b.node("Transpose" if self.layout else "Identity", [c_all], out=outs[2],
                   **({"perm": [1, 0, 2]} if self.layout else {}))
        return b.out

    def _initial(self, idx: int, k: int, x: str) -> str:
        """initial_h / initial_c of direction k, [batch, hidden]; zeros where not given."""
        b = self.b
        if self.ins[idx]:
            init = self.ins[idx]
            if self.layout:
                init = b.node("Transpose", [init], perm=[1, 0, 2])
            return b.pick(init, k)
        batch = b.node("Gather", [b.node("Shape", [x]), b.const([1])], axis=0)
        shape = b.node("Concat", [batch, b.const([self.hidden])], axis=0)
        return b.node("ConstantOfShape", [shape], value=numpy_helper.from_array(np.zeros(1, self.b.float_dtype), "z"))

    def _weight(self, idx: int, k: int):
        """Direction k's W (idx 1) or R (idx 2), as the [in, g*h] operand of x @ W^T: a float
        tensor, or for the quantized op (int8 weights, scale, zero point)."""
        b = self.b
        if not self.quantized:
            return b.node("Transpose", [b.pick(self.ins[idx], k)], perm=[1, 0])
        scale, zp = (8, 9) if idx == 1 else (10, 11)
        wq, w_scale = b.pick(self.ins[idx], k), b.pick(self.ins[scale], k)
        w_zp = b.pick(self.ins[zp], k) if self.ins[zp] else ""
        if idx == 2:   # R: as integers (minus the zero point) in float, exact; scaled after the product
            centered = b.node("Cast", [wq], to=TensorProto.FLOAT)
            if w_zp:
                centered = b.node("Sub", [centered, b.node("Cast", [w_zp], to=TensorProto.FLOAT)])
            return _RowQuantized(centered, w_scale)
        return wq, w_scale, w_zp

    def _direction(self, x: str, trip: str, k: int, reverse: bool):
        b, h, g = self.b, self.hidden, GATES[self.op]
        bias = b.pick(self.ins[3], k) if self.ins[3] else None                       # [2*g*h]
        xw = _times(b, x, self._weight(1, k))                                        # [seq, batch, g*h]
        if bias is not None:
            xw = b.node("Add", [xw, b.span(bias, 0, g * h)])
            rb = b.span(bias, g * h, 2 * g * h)
        else:
            rb = None
        rt = self._weight(2, k)                                                      # [h, g*h]
        h0 = self._initial(5, k, x)
        c0 = self._initial(6, k, x) if self.op == "LSTM" else None
        peep = b.pick(self.ins[7], k) if self.op == "LSTM" and self.ins[7] else None
        lens = b.unsqueeze(b.node("Cast", [self.ins[4]], to=TensorProto.INT64), 1) if self.ins[4] else None
        body = self._body(xw, trip, rt, rb, peep, k, reverse, lens)
        carried = [h0] + ([c0] if c0 else [])
        finals = [b.name("h_last")] + ([b.name("c_last")] if c0 else [])
        stacked = b.name("y")
        b.out.append(helper.make_node("Loop", [trip, ""] + carried, finals + [stacked], name=f"{self.name}_dir{k}",
                                      body=body))
        y = stacked
        if reverse:
            y = b.node("Slice", [y, b.const([-1]), b.const([-(2 ** 63)]), b.const([0]), b.const([-1])])   # reversed
        return y, finals[0], finals[1] if c0 else None

    def _body(self, xw, trip, rt, rb, peep, k, reverse, lens):
        outer = self.b
        b = _Builder(f"{outer.prefix}_d{k}", outer.opset, outer.float_dtype)
        t, cond, hin = b.name("t"), b.name("cond"), b.name("h")
        cin = b.name("c") if self.op == "LSTM" else None
        at = b.node("Sub", [b.node("Sub", [trip, t]), b.const(1)]) if reverse else t
        xw_t = b.node("Gather", [xw, at], axis=0)                                    # [batch, g*h]
        h, acts = self.hidden, self.acts[k]
        f = lambda i, v: b.act(acts[i][0], v, acts[i][1], acts[i][2])  # noqa: E731
        clip = (lambda v: b.node("Clip", [v, b.fconst(-self.clip), b.fconst(self.clip)])) if self.clip else (lambda v: v)

        def gate(src, i):
            return b.span(src, i * h, (i + 1) * h, axis=1)

        if self.op == "GRU":
            hr = _times(b, hin, rt)
            if rb is not None:
                hr = b.node("Add", [hr, rb])
            z = f(0, clip(b.node("Add", [gate(xw_t, 0), gate(hr, 0)])))
            rr = f(0, clip(b.node("Add", [gate(xw_t, 1), gate(hr, 1)])))
            if self.attrs.get("linear_before_reset", 0):
                cand = b.node("Add", [gate(xw_t, 2), b.node("Mul", [rr, gate(hr, 2)])])
            else:
                rh = b.node("MatMul", [b.node("Mul", [rr, hin]), b.span(rt, 2 * h, 3 * h, axis=1)])
                cand = b.node("Add", [gate(xw_t, 2), rh])
                if rb is not None:
                    cand = b.node("Add", [cand, b.span(rb, 2 * h, 3 * h)])
            ht = f(1, clip(cand))
            # H' = (1 - z) * ht + z * H = ht + z * (H - ht)
            hout = b.node("Add", [ht, b.node("Mul", [z, b.node("Sub", [hin, ht])])], "h_out")
            cout = None
        else:
            pre = b.node("Add", [xw_t, _times(b, hin, rt)])
            if rb is not None:
                pre = b.node("Add", [pre, rb])
            if self.op == "RNN":
                hout, cout = f(0, clip(pre)), None
            else:   # LSTM, gates i o f c
                def peephole(v, which, cell):
                    """+ P[which] * cell; P holds the i, o, f peepholes in that order."""
                    if peep is None:
                        return v
                    return b.node("Add", [v, b.node("Mul", [b.span(peep, which * h, (which + 1) * h), cell])])
                gi = f(0, clip(peephole(gate(pre, 0), 0, cin)))
                if self.attrs.get("input_forget", 0):
                    gf = b.node("Sub", [b.fconst(1.0), gi])
                else:
                    gf = f(0, clip(peephole(gate(pre, 2), 2, cin)))
                gc = f(1, clip(gate(pre, 3)))
                cout = b.node("Add", [b.node("Mul", [gf, cin]), b.node("Mul", [gi, gc])], "c_out")
                go = peephole(gate(pre, 1), 1, cout)
                go = f(0, clip(go))
                hout = b.node("Mul", [go, f(2, cout)], "h_out")
        if lens is not None:   # past its length a sequence keeps its state and writes zeros
            live = b.node("Less", [t, lens])                                       # [batch, 1]
            y = b.node("Where", [live, hout, b.fconst(0.0)], "y_t")
            hout = b.node("Where", [live, hout, hin], "h_keep")
            if cout:
                cout = b.node("Where", [live, cout, cin], "c_keep")
        else:
            y = b.node("Identity", [hout], "y_t")
        cond_out = b.node("Identity", [cond], "cond_out")
        fdt = helper.np_dtype_to_tensor_dtype(np.dtype(b.float_dtype))
        ins = [helper.make_tensor_value_info(t, TensorProto.INT64, []), helper.make_tensor_value_info(cond, TensorProto.BOOL, []),
               helper.make_tensor_value_info(hin, fdt, None)] + ([helper.make_tensor_value_info(cin, fdt, None)] if cin else [])
        outs = [helper.make_tensor_value_info(cond_out, TensorProto.BOOL, []), helper.make_tensor_value_info(hout, fdt, None)]
        if cin:
            outs.append(helper.make_tensor_value_info(cout, fdt, None))
        outs.append(helper.make_tensor_value_info(y, fdt, None))
        return helper.make_graph(b.out, f"{self.name}_body{k}", ins, outs)


class _RowQuantized:
    """A quantized recurrent weight: its integers minus the zero point (float), and its scale."""

    def __init__(self, centered: str, scale: str):
        self.centered, self.scale = centered, scale


def _times(b: NodeBuilder, x: str, w) -> str:
    """x @ w for a float w; for a quantized (w, scale, zero point), x is quantized to uint8 on the
    fly and the product taken in int32, then scaled; for a _RowQuantized w, each row of x [B, K]
    is quantized on its own range, as onnxruntime's quantized LSTM does."""
    if isinstance(w, str):
        return b.node("MatMul", [x, w])
    if isinstance(w, _RowQuantized):
        f = b.fconst
        lo = b.node("Min", [b.reduce("ReduceMin", x, [1], keepdims=1), f(0.0)])
        hi = b.node("Max", [b.reduce("ReduceMax", x, [1], keepdims=1), f(0.0)])
        span = b.node("Sub", [hi, lo])
        scale = b.node("Where", [b.node("Equal", [span, f(0.0)]), f(1.0), b.node("Div", [span, f(255.0)])])
        clamp = lambda v: b.node("Max", [b.node("Min", [v, f(255.0)]), f(0.0)])  # noqa: E731
        zp = clamp(b.node("Round", [b.node("Div", [b.node("Neg", [lo]), scale])]))
        q = clamp(b.node("Add", [b.node("Round", [b.node("Div", [x, scale])]), zp]))
        acc = b.node("MatMul", [b.node("Sub", [q, zp]), w.centered])    # integers, exact in float32
        return b.node("Mul", [acc, b.node("Mul", [scale, w.scale])])
    wq, w_scale, w_zp = w
    xq, x_scale, x_zp = b.multi("DynamicQuantizeLinear", [x], ["", "", ""])
    acc = b.node("MatMulInteger", [xq, wq, x_zp] + ([w_zp] if w_zp else []))
    return b.node("Mul", [b.node("Cast", [acc], to=TensorProto.FLOAT), b.node("Mul", [x_scale, w_scale])])


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _float_dtype(graph, name: str):
    """The element type of X (value info, input or initializer), float32 if the model does not say."""
    for v in list(graph.input) + list(graph.value_info):
        if v.name == name and v.type.tensor_type.elem_type:
            return helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)
    for t in graph.initializer:
        if t.name == name:
            return helper.tensor_dtype_to_np_dtype(t.data_type)
    return np.float32
