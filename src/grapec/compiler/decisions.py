"""Integer outputs made by decisions on float values (a greedy token, a class id): how half-precision
calibration judges them.

An ArgMax over logits flips where two logits are closer than half's rounding, and the model is as
right as before: in fp16 a greedy generation may take another token at a near-tie and go on from
there, so its tokens differ from float32's from that step on. ||out-ref||/||ref|| over token ids
measures nothing then (0.21 on GPT-2 for one flip at step 16 of 128). So where a decision flipped
on a calibration draw, the model's integer outputs are judged by the float values the decisions
were made on (ArgMax/ArgMin inputs, in the graph or in a Loop body), by the same half-precision
measure as a float output, over the steps up to and including the first flip: until then both
runs decided alike and computed on the same inputs; after it they are different generations.

Where no decision flipped, an integer output is judged by itself, as before: it is then integer
arithmetic that differs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

DECISION_OPS = {"ArgMax": np.argmax, "ArgMin": np.argmin}


@dataclass(frozen=True)
class Decision:
    """A node that turns a float value into indices: the value's name and the axis decided over."""
    value: str
    op: str
    axis: int


@dataclass
class Flip:
    """The first step of a calibration draw where the half run decided otherwise than float32."""
    decision: Decision
    step: int           # the value's step: its n-th evaluation (a Loop body's iteration)
    ref_choice: int     # the index float32 chose (the first element that differs)
    half_choice: int
    ref_margin: float   # float32's value at its choice minus at half's choice: how near a tie it was


def decisions(proto: onnx.ModelProto) -> list:
    """The model's decision nodes, in its graph and in every subgraph (Loop and If bodies)."""
    found = []

    def walk(graph):
        for n in graph.node:
            if n.op_type in DECISION_OPS and n.domain in ("", "ai.onnx"):
                axis = next((a.i for a in n.attribute if a.name == "axis"), 0)
                found.append(Decision(n.input[0], n.op_type, axis))
            for a in n.attribute:
                for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                    walk(g)

    walk(proto.graph)
    return found


def recorder(found: list):
    """-> (record, on_value): record[value] lists the value's arrays in the order they are made
    (once per Loop iteration); on_value is ir/evaluate.py's hook that fills it."""
    names = {d.value for d in found}
    record: dict = {n: [] for n in names}

    def on_value(name, arr):
        if name in names:
            record[name].append(np.asarray(arr, np.float32).copy())
    return record, on_value


def first_flip(found: list, ref: dict, half: dict) -> Flip | None:
    """The earliest step where a decision of the half run differs from float32's, over every
    decision (their steps counted alike: decisions in one Loop body share its iterations)."""
    best = None
    for d in found:
        for step, (r, h) in enumerate(zip(ref.get(d.value, []), half.get(d.value, []))):
            pick = DECISION_OPS[d.op]
            rc, hc = pick(r, axis=d.axis), pick(h, axis=d.axis)
            if np.array_equal(rc, hc):
                continue
            if best is None or step < best.step:
                at = np.argwhere(np.asarray(rc) != np.asarray(hc))[0]
                r_line = np.moveaxis(r, d.axis, -1)[tuple(at)]
                a, b = int(np.asarray(rc)[tuple(at)]), int(np.asarray(hc)[tuple(at)])
                sign = 1.0 if d.op == "ArgMax" else -1.0
                best = Flip(d, step, a, b, float(sign * (r_line[a] - r_line[b])))
            break
    return best


def decided_on(found: list, ref: dict, half: dict, flip: Flip) -> tuple:
    """-> (half, float32) arrays of every decision's value over the steps up to and including the
    flip, flattened and joined: what the integer outputs are judged by."""
    hs, rs = [], []
    for d in found:
        n = min(len(ref.get(d.value, [])), len(half.get(d.value, [])), flip.step + 1)
        hs += [a.reshape(-1) for a in half[d.value][:n]]
        rs += [a.reshape(-1) for a in ref[d.value][:n]]
    return np.concatenate(hs), np.concatenate(rs)


def describe(flip: Flip) -> str:
    return (f"{flip.decision.op} of '{flip.decision.value}' chose {flip.half_choice} at step {flip.step}, "
            f"float32 {flip.ref_choice}, whose values there differ by {flip.ref_margin:.3g} in float32")
