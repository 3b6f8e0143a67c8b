"""Mixed precision for --precision fp16 / bf16: which nodes stay float32, found by running the model.

1. Op types that are known to break in half stay float32 (frontend/precision.py, FP32_OPS).
2. A calibration run, as a pass over the IR: the model is lowered and fused exactly as a bundle of
   it would be (pipeline.lowered_model), in float32 and in half, with every float intermediate
   exposed, and both graphs are evaluated node by node by the kernel-IR interpreter
   (ir/evaluate.py) on the same inputs (random ones valid for the model, or the user's). No plan,
   bundle or session is made. Per node, the relative error of its output against float32 is set
   against the error of its inputs.
   - A value that float16 cannot hold (beyond +-65504 in the float32 run): its producer and its
     readers stay float32.
   - A node whose output turns non-finite where float32 is finite stays float32.
   - While an output of the model is off by more than the tolerance, a node whose error jumps
     (JUMP_FACTOR times its inputs' error, and above JUMP_MIN) stays float32. A kept node that
     still diverges was handed inputs already wrong: its producers follow it into float32.
3. The rounds stop when every output passes `grapec check`'s half-precision measure (accuracy.py:
   ||out-ref||/||ref|| <= t) within HALF_MARGIN * t, on every calibration draw
   (CALIBRATION_DRAWS random ones, or the user's samples). If they never do, compilation is refused,
   naming the outputs and the nodes that diverge, rather than shipping a wrong model.

The interpreter computes half as the CPU backend does, and that as the CUDA one does (float32
registers, rounding at every store, float32 GEMM accumulation), so what diverges here diverges there.
"""
from __future__ import annotations

import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper

from .. import dtypes
from .accuracy import HALF_MARGIN, TOLERANCES, compare, half_limit
from .decisions import decided_on, decisions, describe, first_flip, recorder
from ..errors import GrapecError, InputError
from ..frontend.precision import FP16_MAX, FP32_OPS, to_half

CALIBRATION_DRAWS = 4   # random input draws: one draw's luck is not a model's accuracy
CALIBRATION_SEED = 1000
JUMP_FACTOR = 8.0
JUMP_MIN = {"fp16": 1e-2, "bf16": 4e-2}
ERROR_FLOOR = {"fp16": 1e-3, "bf16": 8e-3}   # an input's own rounding error: a jump is measured against at least this
MAX_ROUNDS = 8
# Calibration holds every float intermediate of every draw in float32 (the half run's are measured
# as they are made and dropped): on GPT-2 seq 128 at batch 1 and 4, resident memory grew by 3.7
# times the float32 bytes of its intermediates (7 times while the half run's were held too). It
# may take this share of the memory available.
CALIBRATION_BYTES_PER_FP32_BYTE = 4
CALIBRATION_MEMORY_SHARE = 0.6


class PrecisionError(GrapecError):
    """Half precision breaks the model's accuracy even with the divergent nodes kept in float32."""


@dataclass
class KeptNode:
    name: str
    op: str
    why: str

    def to_json(self):
        return {"node": self.name, "op": self.op, "why": self.why}


@dataclass
class MixedPrecision:
    """What the calibration decided: the nodes kept in float32, and how close the outputs came."""
    precision: str
    kept: list = field(default_factory=list)            # KeptNode, in graph order
    output_errors: dict = field(default_factory=dict)   # output -> ||half - fp32|| / ||fp32||
    samples: str = ""
    rounds: int = 0
    tolerance: float = 0.0
    half_outputs: bool = False                          # float32 outputs given in half (compile_model)
    flips: list = field(default_factory=list)           # decisions half took otherwise, per draw (decisions.py)

    def to_json(self):
        return {"precision": self.precision, "half_outputs": self.half_outputs, "kept_fp32": [k.to_json() for k in self.kept],
                "output_rel_err": {k: _json_float(v) for k, v in self.output_errors.items()},
                "calibration": {"samples": self.samples, "rounds": self.rounds, "tolerance": self.tolerance,
                                **({"decisions_flipped": self.flips} if self.flips else {})}}

    def summary(self) -> str:
        errs = ", ".join(f"{k} {v:.1e}" for k, v in self.output_errors.items())
        if self.flips:
            errs += (f"; on {len(self.flips)} draw(s) half took another decision than float32, and the integer "
                     f"outputs were judged by the values decided on: {self.flips[0]}")
        if not self.kept:
            return f"{self.precision}: every node in {self.precision} (calibrated on {self.samples}; output error {errs})"
        ops = ", ".join(f"{n} {op}" for op, n in Counter(k.op for k in self.kept).most_common())
        return (f"{self.precision}: {len(self.kept)} node(s) kept in float32 ({ops}; calibrated on {self.samples}; "
                f"output error {errs}); `grapec inspect` lists them")


def choose_precision(proto: onnx.ModelProto, graph, precision: str, input_shapes: dict, fixed: dict,
                     samples: list | None = None, say=lambda msg: None, tolerance: float | None = None, *,
                     lowered_model):
    """-> (the model rewritten to half with some nodes kept float32, MixedPrecision).
    graph: the imported float32 model; input_shapes: the bucket to calibrate on; fixed: --value inputs;
    samples: list of {input name: array} (--calibration-inputs), else one random sample;
    tolerance: the largest ||out - ref|| / ||ref|| accepted per output (--precision-tolerance);
    lowered_model(proto, input_shapes, fixed): the pipeline's lowered graph of a model, which the
    calibration runs (handed in, so that the pipeline calls this module and not the other way round)."""
    from ..passes.specialize import specialize
    spec = specialize(graph, input_shapes, None, fixed)
    inlined = _taken_branches_inline(proto, spec)
    if inlined is not proto:   # their nodes become candidates: only top-level nodes can stay float32
        from ..frontend.onnx_import import import_model
        proto = inlined
        spec = specialize(import_model(proto), input_shapes, None, fixed)
    types = {n: dtypes.to_onnx(v.dtype) for n, v in spec.values.items() if v.dtype}
    nodes = list(proto.graph.node)
    names = [n.name or f"{n.op_type}_{i}" for i, n in enumerate(nodes)]
    outputs = [o.name for o in proto.graph.output]
    probes = [o for n in nodes for o in n.output
              if o and types.get(o) == TensorProto.FLOAT and spec.values[o].const is None and o not in outputs]
    candidates = {i for i, n in enumerate(nodes) if n.op_type != "Constant"
                  and (_computes_float(n, types) or n.op_type in FP32_OPS and _reads_float(n, types))
                  and not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in n.attribute)}
    kept = {i: f"op type: {FP32_OPS[nodes[i].op_type]}" for i in sorted(candidates) if nodes[i].op_type in FP32_OPS}
    for i in _quantized_glue(nodes, types):
        if i in candidates:
            kept.setdefault(i, "float math between a Dequantize and a Quantize: rounding it to half moves "
                               "values across quantization steps")

    exposing = _exposing(proto, probes, types)
    feeds_list, where = _samples(exposing, spec, input_shapes, fixed, samples)
    found = decisions(proto)
    refs, ref_decided = _run(lowered_model(exposing, input_shapes, fixed), feeds_list, found)
    tol = half_limit(precision, tolerance, HALF_MARGIN)
    limits = (*TOLERANCES[precision], tol, False)   # check's measure: rel-L2 judges, allclose is counted
    floor, jump_min = ERROR_FLOOR[precision], JUMP_MIN[precision]
    report = MixedPrecision(precision, samples=where, tolerance=tol)
    producers = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    consumers = {}
    for i, n in enumerate(nodes):
        for x in n.input:
            consumers.setdefault(x, []).append(i)
    if precision == "fp16":
        for i, why in _overflows(nodes, spec, probes + outputs, feeds_list, refs, consumers).items():
            if i in candidates:
                kept.setdefault(i, why)
    worst: list = []   # per round, the largest error of a failing output
    for rnd in range(1, MAX_ROUNDS + 1):
        half = to_half(proto, precision, set(kept), types)
        own = [o + "__fp32" for i in kept for o in nodes[i].output if o in probes]   # kept nodes' float32 results
        got, err, half_decided = _run_half(lowered_model(_exposing(half, probes + own, types, precision), input_shapes,
                                                         fixed), feeds_list, refs, probes + own, outputs, found)
        flips = [first_flip(found, r, h) for r, h in zip(ref_decided, half_decided)]
        verdicts = {o: _worst([_judge(o, g, r, flip, found, rd, hd, types, limits) for g, r, flip, rd, hd
                               in zip(got, refs, flips, ref_decided, half_decided)]) for o in outputs}
        err.update({o: v.rel for o, v in verdicts.items() if types.get(o) != TensorProto.FLOAT})
        report.output_errors, report.rounds = {o: err[o] for o in outputs}, rnd
        report.flips = [describe(f) for f in flips if f is not None]
        bad_outputs = [o for o in outputs if not verdicts[o].ok]
        flagged, growth = {}, []
        for i, n in enumerate(nodes):
            e_out = max((err.get(o + "__fp32" if i in kept and o in probes else o, 0.0) for o in n.output if o),
                        default=0.0)
            e_in = max([err.get(x + "__fp32" if i in kept and producers.get(x) in kept and x in probes else x, 0.0)
                        for x in n.input if x] + [floor])
            if np.isinf(e_out) and not np.isinf(e_in):
                flagged[i] = "non-finite in half where float32 is finite"
            elif e_out > jump_min and e_out > JUMP_FACTOR * e_in and bad_outputs:
                flagged[i] = f"error {e_out:.1e} in half from inputs off by {e_in:.1e}"
            if e_out > e_in and np.isfinite(e_out):
                growth.append((e_out / e_in, i, f"error {e_in:.1e} at its inputs, {e_out:.1e} at its output"))
            if i in kept:   # a float32 result that half cannot hold: its readers stay float32 too
                for o in n.output:
                    if o in probes and np.isinf(err[o]) and not np.isinf(err[o + "__fp32"]):
                        flagged.update({c: f"reads '{o}', which overflows {precision}"
                                        for c in consumers.get(o, []) if c in candidates and c not in kept})
        new = {i: why for i, why in flagged.items() if i not in kept and i in candidates}
        if not new and bad_outputs:   # kept nodes still diverge: their inputs were already wrong
            new = {p: f"feeds '{names[i]}', which diverges in float32 on half inputs"
                   for i in flagged if i in kept for x in nodes[i].input
                   if (p := producers.get(x)) is not None and p in candidates and p not in kept}
        if not new and bad_outputs:   # no node jumps: the error accumulates
            new = _where_error_grows(growth, kept, candidates, nodes, producers)
        worst.append(max((verdicts[o].rel for o in bad_outputs), default=0.0))
        stalled = _stalled(worst)
        say(f"{precision} calibration round {rnd}: {len(kept)} node(s) in float32, output error "
            + ", ".join(f"{o} {err[o]:.1e}" for o in outputs)
            + (f"; {len(new)} more to float32" if new and rnd < MAX_ROUNDS and not stalled else "")
            + ("; stopped: the last rounds' nodes in float32 did not lower the error" if stalled else ""))
        if not new or rnd == MAX_ROUNDS or stalled:   # `half` is then the model these errors were measured on
            break
        kept.update(new)
    report.kept = [KeptNode(names[i], nodes[i].op_type, kept[i]) for i in sorted(kept)]
    if bad_outputs:
        accumulates = not flagged   # no node stands out: name where the error grows most
        if accumulates:
            flagged = {i: why for _, i, why in sorted(growth, reverse=True)[:5]}
        raise PrecisionError(_refusal(report, [verdicts[o] for o in bad_outputs], flagged, names, nodes, candidates,
                                      tol, accumulates))
    return half, report


def intermediate_bytes(graph, input_shapes: dict, fixed: dict) -> int:
    """float32 bytes of the model's float intermediates at input_shapes (what calibration exposes)."""
    from ..passes.specialize import specialize
    spec = specialize(graph, input_shapes, None, fixed)
    return sum(4 * int(np.prod(v.shape)) for v in spec.values.values()
               if v.const is None and v.shape is not None and dtypes.is_float(v.dtype))


def batch_dim(graph, fixed: dict) -> str | None:
    """The named dim that leads every (unfixed) input: a batch, whose samples calibrate alike."""
    firsts = {graph.values[n].shape[0] if graph.values[n].shape else None for n in graph.inputs if n not in fixed}
    (d,) = firsts if len(firsts) == 1 else (None,)
    return d if isinstance(d, str) and d != "?" else None


def calibration_memory(graph, input_shapes: dict, fixed: dict, available: int | None, user_chose: bool) -> tuple:
    """-> (input shapes to calibrate at, a line for the log or None), so that calibration fits in memory.

    Where calibration at input_shapes would not fit in CALIBRATION_MEMORY_SHARE of `available` and
    the user chose no calibration shape, the batch (the named dim leading every input) is lowered
    to the largest that fits: a batch's samples are computed alike, so fewer of them judge the same
    arithmetic. Where nothing fits, compilation is refused, naming what would."""
    if available is None:
        return input_shapes, None
    budget = CALIBRATION_MEMORY_SHARE * available
    need = CALIBRATION_BYTES_PER_FP32_BYTE * intermediate_bytes(graph, input_shapes, fixed)
    if need <= budget:
        return input_shapes, None
    gib = 2 ** 30
    batch = batch_dim(graph, fixed)
    size = next((s[0] for n, s in input_shapes.items() if n not in fixed and s), 1)
    if not user_chose and batch is not None and size > 1:
        one = {n: (1, *s[1:]) if n not in fixed and s else s for n, s in input_shapes.items()}
        per_sample = CALIBRATION_BYTES_PER_FP32_BYTE * intermediate_bytes(graph, one, fixed)
        fits = min(size - 1, int(budget // max(per_sample, 1)))
        if fits >= 1:
            return ({n: (fits, *s[1:]) if n not in fixed and s else s for n, s in input_shapes.items()},
                    f"calibrating at {batch}={fits}, not {size}: at {size} calibration would hold about "
                    f"{need / gib:.1f} GiB, and {available / gib:.1f} GiB is available (--calibration-dim "
                    f"{batch}=N chooses)")
    raise GrapecError(
        f"half-precision calibration at {_fmt(input_shapes)} would hold about {need / gib:.1f} GiB of "
        f"intermediates, and {available / gib:.1f} GiB is available: give --calibration-dim NAME=N with a "
        f"smaller size (e.g. {batch or 'batch'}=1), or --calibration-inputs with smaller samples")


def _fmt(shapes: dict) -> str:
    return ", ".join(f"{n}={'x'.join(map(str, s))}" for n, s in shapes.items())


def _taken_branches_inline(proto: onnx.ModelProto, spec) -> onnx.ModelProto:
    """Top-level Ifs whose condition is known at compile time (silero VAD's `sr == 16000` with
    --value sr=16000) replaced by the branch they take, as specialize takes it in the IR."""
    from ..frontend.proto import inline_if
    while True:
        for i, n in enumerate(proto.graph.node):
            cond = spec.lookup(n.input[0]) if n.op_type == "If" else None
            if cond is not None and cond.const is not None and cond.const.size == 1:
                inlined = inline_if(proto, i, bool(cond.const.reshape(-1)[0]))
                if inlined is not None:
                    proto = inlined
                    break
        else:
            return proto


def _stalled(worst: list) -> bool:
    """Two rounds in a row kept more nodes in float32 without lowering the failing outputs' error
    by 5% below the best before them: more of the same will not make the model pass."""
    return len(worst) >= 3 and min(worst[-2:]) > 0.95 * min(worst[:-2]) and worst[-1] > 0


def _where_error_grows(growth: list, kept: dict, candidates: set, nodes, producers) -> dict:
    """The node where the error grows most goes to float32, or where it is there already (it was
    handed inputs already wrong), its producers: one step a round, while an output fails."""
    for _, i, why in sorted(growth, reverse=True):
        if i in candidates and i not in kept:
            return {i: f"the error grows most here ({why})"}
        if i in kept:
            up = {p: f"feeds '{nodes[i].name or nodes[i].op_type}', where the error grows most"
                  for x in nodes[i].input if (p := producers.get(x)) is not None and p in candidates and p not in kept}
            if up:
                return up
    return {}


def _worst(checks: list):
    """The calibration draw that judges an output: the first one that fails, else the largest error."""
    failing = [c for c in checks if not c.ok]
    return failing[0] if failing else max(checks, key=lambda c: c.rel)


def _refusal(report, failed, flagged, names, nodes, candidates, tol, accumulates) -> str:
    outs = "; ".join(f"'{c.name}' off by {c.rel:.2g} (||out-ref||/||ref||, accepted within {tol:g}"
                     f"{'; ' + c.note if c.note else ''})" for c in failed)
    worst = [f"'{names[i]}' ({nodes[i].op_type}): {why}" + ("" if i in candidates else
             " (control flow and nodes without float outputs are not kept in float32)") for i, why in list(flagged.items())[:10]]
    kept = f"{len(report.kept)} node(s) already kept in float32. " if report.kept else ""
    head = ("no single node diverges: rounding error accumulates over the model; it grows most at"
            if accumulates else "diverging nodes")
    where = (f"\n  {head}:\n    " + "\n    ".join(worst)) if worst else ""
    return (f"--precision {report.precision} breaks this model's accuracy, so no bundle was written: {outs}. "
            f"{kept}Compile with --precision fp32 (or tf32 for fast float32 GEMMs), give --calibration-inputs "
            f"if random inputs are not representative, or accept a larger error with --precision-tolerance.{where}")


def _overflows(nodes, spec, values, feeds_list, refs, consumers) -> dict:
    """Nodes that write or read a value float16 cannot hold (beyond +-65504 in the float32 run) ->
    why. An overflow counts where computation makes it, from inputs in range or from another such
    value, and not where it comes from a constant beyond the range: an exporter's -3.4e38 attention
    mask is clamped to -65504 in half and does its job there."""
    peak = {}
    for v in list(spec.inputs) + values:
        arrays = [s[v] for s in feeds_list if v in s] + [r[v] for r in refs if v in r]
        if arrays and np.asarray(arrays[0]).dtype.kind == "f":
            peak[v] = max(_finite_peak(a) for a in arrays)
    computed = {x for x in spec.inputs if peak.get(x, 0.0) > FP16_MAX}   # user data beyond the range
    masks, out = set(), {}   # masks: beyond the range because a constant is (-3.4e38 and what it flows into)
    for x in computed:
        for c in consumers.get(x, []):
            out.setdefault(c, f"reads input '{x}' ({peak[x]:.3g}), beyond float16's {FP16_MAX:g}")
    for i, n in enumerate(nodes):
        for v in n.output:
            if peak.get(v, 0.0) <= FP16_MAX:
                continue
            if not any(x in computed for x in n.input) and any(x in masks or _big_const(spec, x) for x in n.input):
                masks.add(v)
            else:
                computed.add(v)
                why = f"'{v}' reaches {peak[v]:.3g}, beyond float16's {FP16_MAX:g}"
                for j in [i] + consumers.get(v, []):
                    out.setdefault(j, why)
    return out


def _finite_peak(a) -> float:
    """The largest finite |element| (0 for none). One pass where every element is finite, as nearly every array is."""
    a = np.asarray(a)
    if a.size == 0:
        return 0.0
    peak = float(np.max(np.abs(a)))
    return peak if np.isfinite(peak) else float(np.max(np.abs(a), initial=0.0, where=np.isfinite(a)))


QUANTIZE_OPS = ("QuantizeLinear", "DynamicQuantizeLinear")


def _quantized_glue(nodes, types) -> set:
    """Nodes on a float path from a DequantizeLinear output to a (Dynamic)QuantizeLinear input: the
    float32 'glue' of a quantized model (activations, residual adds, LayerNorms between int8 GEMMs)."""
    after = set()   # float values downstream of a dequantize
    for n in nodes:
        if n.op_type == "DequantizeLinear" or any(x in after for x in n.input):
            after.update(o for o in n.output if types.get(o) == TensorProto.FLOAT)
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    before, stack = set(), [x for n in nodes if n.op_type in QUANTIZE_OPS for x in n.input[:1]]
    while stack:   # float values upstream of a quantize
        v = stack.pop()
        if v in before or types.get(v) != TensorProto.FLOAT:
            continue
        before.add(v)
        if v in producer:
            stack.extend(nodes[producer[v]].input)
    return {i for i, n in enumerate(nodes) if n.op_type not in QUANTIZE_OPS + ("DequantizeLinear",)
            and any(o in after and o in before for o in n.output)}


def _big_const(spec, name) -> bool:
    v = spec.values.get(name)
    if v is None or v.const is None or np.asarray(v.const).dtype.kind != "f":
        return False
    c = np.asarray(v.const)
    return float(np.max(np.abs(c), initial=0.0, where=np.isfinite(c))) > FP16_MAX


def _computes_float(n: onnx.NodeProto, types: dict) -> bool:
    return any(types.get(o) == TensorProto.FLOAT for o in n.output if o)


def _reads_float(n: onnx.NodeProto, types: dict) -> bool:
    return any(types.get(x) == TensorProto.FLOAT for x in n.input if x)


def _exposing(proto: onnx.ModelProto, names: list, types: dict, precision: str | None = None) -> onnx.ModelProto:
    """A copy of the model with `names` as extra graph outputs (half-typed in a half model)."""
    from ..frontend.proto import copy_model
    from ..frontend.precision import HALF_TYPES
    m = copy_model(proto)
    elem = HALF_TYPES[precision] if precision else TensorProto.FLOAT
    for n in names:
        t = TensorProto.FLOAT if n.endswith("__fp32") else elem if types.get(n) == TensorProto.FLOAT else types[n]
        m.graph.output.append(helper.make_tensor_value_info(n, t, None))
    return m


def _samples(proto, spec, input_shapes: dict, fixed: dict, given):
    """-> (one feeds dict per calibration draw, what they are): random inputs valid for the model
    (bundle/inputs.py, as `grapec check` makes them), or the user's, checked against the bucket."""
    from ..bundle.inputs import random_inputs, value_ranges
    names = {n: tuple(input_shapes[n]) for n in spec.inputs if n not in fixed}
    if not given:
        ranges = value_ranges(proto)
        kinds = {n: spec.values[n].dtype for n in names}
        # seeds of their own: `grapec check` (seed 0 unless told) then judges on inputs calibration never saw
        return ([random_inputs(names, kinds, ranges, seed=CALIBRATION_SEED + k) for k in range(CALIBRATION_DRAWS)],
                f"{CALIBRATION_DRAWS} random samples")
    for k, sample in enumerate(given):
        for name, shape in names.items():
            if name not in sample:
                raise InputError(f"--calibration-inputs sample {k}: no array for input '{name}'")
            if tuple(np.shape(sample[name])) != shape:
                raise InputError(f"--calibration-inputs sample {k}: input '{name}' has shape "
                                 f"{list(np.shape(sample[name]))}, the calibrated bucket expects {list(shape)}")
    return [{n: s[n] for n in names} for s in given], f"{len(given)} given sample(s)"


# Calibration's draws run on threads, at most this many: numpy releases the GIL in the array work that makes up a
# draw. On 2 cores GPT-2's fp16 compile at seq 512, nearly all of it calibration, went from 79 to 66.5 s (the
# float32 draws, bound by memory and the BLAS's own threads, gained nothing; the half ones 36 -> 28 s). Threads share
# the weights, made contiguous or widened from half once; forked processes would each send every probe's array back.
MAX_DRAW_THREADS = 4


def _each_draw(fn, feeds_list: list) -> list:
    """[fn(feeds, k) for each draw k], in order, the draws on up to MAX_DRAW_THREADS threads (one per core)."""
    jobs = min(len(feeds_list), MAX_DRAW_THREADS, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
               else os.cpu_count() or 1)
    if jobs <= 1:
        return [fn(feeds, k) for k, feeds in enumerate(feeds_list)]
    with ThreadPoolExecutor(jobs, thread_name_prefix="calibration") as pool:
        return list(pool.map(fn, feeds_list, range(len(feeds_list))))


def _run(graph, feeds_list, found: list) -> tuple:
    """-> (the graph's outputs by name per draw, the decisions' values per draw (decisions.py)),
    by ir/evaluate.py: the CPU backend's arithmetic, no plan."""
    from ..ir.evaluate import run_graph
    consts: dict = {}   # the weights as the kernels read them, made once for every draw

    def draw(feeds, k):
        record, on_value = recorder(found)
        return dict(zip(graph.outputs, run_graph(graph, feeds, on_value=on_value, consts=consts))), record
    runs = _each_draw(draw, feeds_list)
    return [outs for outs, _ in runs], [record for _, record in runs]


def _run_half(graph, feeds_list, refs, probes: list, outputs: list, found: list) -> tuple:
    """-> (the model's outputs by name per draw, {probe or output: its largest error over the
    draws}, the decisions' values per draw). Each probe is measured as the half graph makes it and
    then dropped, so only the float32 references are held for every draw."""
    from ..ir.evaluate import run_graph
    consts: dict = {}

    def draw(feeds, k):
        ref, err = refs[k], dict.fromkeys(probes + outputs, 0.0)   # this draw's own errors: merged below
        record, on_decision = recorder(found)

        def measure(name, arr):
            on_decision(name, arr)
            if name in err and name not in outputs:
                err[name] = max(err[name], _rel_err(arr, ref[name.removesuffix("__fp32")]))
        outs = dict(zip(outputs, run_graph(graph, feeds, on_value=measure, keep=outputs, consts=consts)))
        for o in outputs:
            err[o] = max(err[o], _rel_err(outs[o], ref[o]))
        return outs, err, record
    runs = _each_draw(draw, feeds_list)
    err = {name: max(e[name] for _, e, _ in runs) for name in probes + outputs}
    return [outs for outs, _, _ in runs], err, [record for _, _, record in runs]


def _judge(name, got: dict, ref: dict, flip, found, ref_decided, half_decided, types, limits):
    """One draw's verdict on an output: by check's measure; an integer output of a draw where a
    decision flipped, by the values the decisions were made on (decisions.py)."""
    if flip is None or types.get(name) == TensorProto.FLOAT or np.array_equal(got[name], ref[name]):
        return compare(name, got[name], ref[name], *limits)
    verdict = compare(name, *decided_on(found, ref_decided, half_decided, flip), *limits)
    how = (f"judged by the values its decisions are made on, up to the first flip ({describe(flip)}); "
           f"{int(np.count_nonzero(got[name] != ref[name]))} of {got[name].size} elements differ from float32")
    verdict.shape, verdict.note = got[name].shape, how + ("; " + verdict.note if verdict.note else "")
    return verdict


def _rel_err(got, ref) -> float:
    """||got - ref|| / ||ref|| over the elements float16 can hold; inf where got is non-finite and
    ref is not. An element beyond float16's range (a -3.4e38 mask value) counts as right when got
    saturates the same way (-65504 or -inf)."""
    g32, r32 = np.asarray(got, np.float32).reshape(-1), np.asarray(ref, np.float32).reshape(-1)
    # False where ref holds a NaN or an infinity too; max and min, not abs: no array the size of ref made per probe
    if r32.size == 0 or max(float(r32.max()), -float(r32.min())) <= FP16_MAX:
        with np.errstate(over="ignore", invalid="ignore"):
            d = g32 - r32   # the common case, in float32 dot products: calibration takes this for every probe
            num2 = float(np.dot(d, d))   # not finite where got is not (or a float32 result's square overflows: below)
        if np.isfinite(num2):
            num, den = float(np.sqrt(num2)), float(np.sqrt(np.dot(r32, r32)))
            return num / den if den else (0.0 if num == 0 else float("inf"))
    g, r = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    saturated = (np.abs(r) > FP16_MAX) & (np.abs(g) >= FP16_MAX) & (np.sign(g) == np.sign(r))
    g, r = np.where(saturated, 0.0, g), np.where(saturated, 0.0, r)
    fin_r = np.isfinite(r)
    if (fin_r & ~np.isfinite(g)).any():
        return float("inf")
    d = np.where(fin_r, g - r, 0.0)
    den = float(np.linalg.norm(np.where(fin_r, r, 0.0)))
    num = float(np.linalg.norm(d))
    return num / den if den else (0.0 if num == 0 else float("inf"))


def _json_float(v):
    return v if np.isfinite(v) else str(v)
