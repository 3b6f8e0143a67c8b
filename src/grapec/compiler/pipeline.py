"""The compile pipeline: ONNX -> IR -> (per bucket) passes -> plan -> Bundle. The passes from specialize to
form_regions are one graph's, compile_graph in graph_passes.py.

    import_model                  frontend/onnx_import.py
    for each bucket:
        specialize                concrete shapes; constants evaluated (Shape chains fold); an If
                                  with a known condition replaced by the branch it takes
        simplify                  constant folding, BatchNorm into Conv, dead code
        merge_sibling_matmuls     matmuls of one input against weights (Q, K, V) as one GEMM + Split
        lower                     ONNX ops -> Kernel / Library / View / region nodes (bodies compiled alike)
        small_matmuls_as_kernels  few-row matmuls against weights become gemv kernels (they fuse); in
                                  fp16/bf16 only one row against a large weight (small_gemms takes the rest)
        fold_epilogues            bias / residual add kernels into the GEMM (cuBLASLt epilogues)
        fuse                      producer kernels inlined into consumers (reductions stitched)
        channels_last             values between channels-last convolutions stored NHWC
        fold_epilogues            again: activations, now one kernel each
        upcast_operands           a float32 GEMM of halves widened to float32 reads the halves
        strided_operands          GEMMs read/write through strides instead of head split/merge copies
        fuse_attention            GEMM -> softmax -> GEMM as one flash-attention kernel (fp16/bf16)
        attention_operands        ... reading q, k, v and writing its output through the head split and
                                  merge copies around it (batch > 1), which then go
        attention_engines         each fused attention as the generated kernel or cuDNN's SDPA, per the cost model;
                                  a mask that is exactly the causal band compared by index, its kernels gone
        small_gemms               few-row GEMMs against weights as one kernel each, with the LayerNorm
                                  before them as prologue and bias/activation/residual as epilogue
        gemvs_after_fusion        one-row matmuls that waited for a prologue and took none: gemv kernels
        fold_output_casts         a GEMM whose output is only widened to float32 writes float32 itself
        aligned_rows              GEMM rows padded to 16 bytes, through the kernels that write and read them
        schedule                  topological order
        form_regions              If/Loop bodies write their results in place; graphed or host-driven
        plan_memory + PlanBuilder one arena, offsets, the typed plan (plan.py)
        schedule_streams          launch order, edges and parallel branches of the CUDA graph; every
                                  reuse of arena bytes checked to be ordered by the edges (hazards.py)
        plan_stitches             runs of short kernels as one cooperative kernel, a grid barrier between
                                  stages (passes/grid_stitch.py; the GPU's graph builder reads Plan.stitches)
    share_layouts                 plans of one launch structure at its largest size's arena offsets
    Bundle                        manifest, weights, kernels, plans
"""
from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from typing import Callable

import numpy as np

from .. import __version__
from ..bundle.format import Bundle
from ..errors import GrapecError, ModelError, ShapeError, UnsupportedError, gpu_package
from .fanout import map_buckets, map_forked
from ..frontend.contrib import contrib_as_onnx
from ..ir import derived
from ..frontend.onnx_import import import_model, load_model, opset_of, without_weight_data
from ..frontend.shapes import range_buckets, resolve_input_shapes, resolve_input_values
from ..bundle.inputs import value_ranges
from ..ir.graph import Graph
from ..plan import walk_steps
from ..passes.sdpa import ATTENTION_ENGINES
from ..ops.conv import CONV_PATHS
from ..passes.grid_stitch import MODES as STITCH_MODES, plan_stitches
from ..cost.device import DeviceProfile
from ..cost.report import plan_report, top_level_us
from ..passes.build_plan import KernelStore, PlanBuilder, WeightStore, relocate_weights
from .shared_layout import share_layouts, take_layout
from .families import RangeFamilies
from .range_check import check_range_fits
from .floor_dims import floor_dims
from .structures import SAMPLE_OVER, compile_range, derive_sizes
from ..passes.predicate import regions
from ..passes.streams import MAX_BRANCHES, schedule_streams
from ..passes.hazards import unordered_conflicts
from ..passes.specialize import SIZED_FOLD_LIMIT_BYTES, specialize
from ..passes.bounds import apply_user_bounds
from ..passes.rows_read import cap_nms_at_rows_read
from .graph_passes import FUSION_LEVELS, compile_graph


def check_plan_fits(plan, weights: WeightStore, profile: DeviceProfile, ishapes: dict):
    """A size whose arena and weights exceed the target GPU's memory is refused here, not at load."""
    need = plan.arena_bytes + weights.size
    if profile.memory_bytes and need > profile.memory_bytes:
        raise ShapeError(f"input shapes {_fmt_shapes(ishapes)} need {need / 2**30:,.1f} GiB (activations "
                         f"{plan.arena_bytes / 2**30:,.1f} GiB, weights {weights.size / 2**30:,.2f} GiB); the target "
                         f"{profile.device} has {profile.memory_bytes / 2**30:,.1f} GiB (smaller --dim/--shapes values, "
                         "or --device-profile for a larger GPU)")


BRIEF_REPORTS_OVER = 16   # buckets beyond which the manifest keeps no fusion report or timeline per bucket


@dataclass
class BucketContext:
    """What every bucket of one compile shares (the workers of fanout.py inherit it)."""
    graph: Graph
    fixed: dict
    host_control: bool
    fusion: str
    profile: DeviceProfile
    max_branches: int
    brief: bool = False   # many buckets: per-bucket reports kept short
    sized_fold_limit: int | None = None   # a --dynamic range: constants computed from the inputs fold up to this
    shared_weights: bool = False   # several buckets, or a generation loop (prompt and decode step): one layout per weight
    conv: str = "auto"             # ops/conv.py conv_path
    attention: str = "auto"        # passes/sdpa.py ATTENTION_ENGINES
    grid_stitch: str = "auto"      # passes/grid_stitch.py MODES
    dependent_launch: bool = True  # the GPU code targets sm_90+, where programmatic edges join kernel nodes
    sizes: int = 1                 # how many buckets
    held_outputs: tuple = ()       # outputs a caller reads while a run goes on (a generation's tokens, streamed)


@dataclass
class Choices:
    """What the cost model chose for a bucket, which a smaller size of its launch structure repeats
    (compiler/structures.py): its fusion and thread mappings, its plan (arena layout) and its schedule."""
    chosen: dict          # compile_graph's `chosen`
    plan: object
    schedule: tuple       # passes/streams.py StreamSchedule.applied


@dataclass
class BucketResult:
    plan: object
    meta: dict            # the manifest's entry for the bucket
    outputs: list         # the manifest's outputs (dtype, dims)
    notes: list = field(default_factory=list)
    log: list = field(default_factory=list)
    choices: Choices | None = None


def streamed_outputs(proto) -> tuple:
    """The outputs a caller may read while the run goes on: a generation's tokens, which
    runtime/generation.py streams from the Loop's carried slot (frontend/generation.py names them)."""
    return tuple(p.value for p in proto.metadata_props if p.key == "grapec.generated_tokens_output")


def lowered_model(proto, input_shapes: dict, fixed: dict, bounds: dict | None = None) -> Graph:
    """The graph that compile_model(proto) would plan for one bucket (default options), with If and
    Loop as lowering made them: what half-precision calibration evaluates (ir/evaluate.py).
    bounds: the compile's --bound values (their sizes at the bound, counted)."""
    from ..cost.device import load_profile
    Graph.restart_names()
    graph = import_model(proto)
    if bounds:
        apply_user_bounds(graph, bounds)
    shapes = {n: s for n, s in input_shapes.items() if n not in fixed}
    with derived.sharing():   # a generation's prompt pass and decode step lay each weight out once
        return compile_graph(graph, {**shapes, **{n: a.shape for n, a in fixed.items()}}, input_values=fixed,
                             notes=[], profile=load_profile(None), regions=False)


def compile_bucket(ctx: BucketContext, ishapes: dict, weights: WeightStore, kernels: KernelStore,
                   like: Choices | None = None) -> BucketResult:
    """One bucket: the passes, its plan (weights and kernels added to the stores) and its report.
    like: the choices of a larger size of its launch structure, repeated where they fit this size."""
    t1 = time.perf_counter()
    notes: list = []
    predicated: list = []
    Graph.restart_names()
    chosen = {k: dict(v) for k, v in like.chosen.items()} if like is not None else {}
    low = compile_graph(ctx.graph, ishapes, host_control=ctx.host_control, input_values=ctx.fixed, notes=notes,
                        fusion=ctx.fusion, profile=ctx.profile, sized_fold_limit=ctx.sized_fold_limit,
                        shared_weights=ctx.shared_weights,
                        conv=ctx.conv, attention=ctx.attention, predicated=predicated,
                        clusters=ctx.dependent_launch, chosen=chosen, sizes=ctx.sizes)
    for node in regions(low):
        if not node.attrs["graphed"]:
            note = f"{node.op} node '{node.name}': control flow runs on the host between graph launches ({node.attrs['host_reason']})"
            if note not in notes:
                notes.append(note)
    plan = PlanBuilder(weights, kernels).build(low, held=ctx.held_outputs)
    check_plan_fits(plan, weights, ctx.profile, ishapes)
    if like is not None:
        take_layout(plan, like.plan)
    streams = schedule_streams(plan, kernels.kernels, ctx.profile, ctx.max_branches,
                               like.schedule if like is not None else ())
    stitched = plan_stitches(plan, kernels.kernels, ctx.profile, ctx.grid_stitch, ctx.dependent_launch)
    unordered = unordered_conflicts(plan.steps, plan.buffers)
    if unordered:   # the scheduler's edges must order every reuse of bytes: a bug here, never the model's
        raise GrapecError("internal error, please report it: the plan's edges leave steps that share arena "
                          f"bytes unordered: {'; '.join(unordered[:3])}")
    counts = Counter(st.op for st in walk_steps(plan.steps))
    report = plan_report(kernels.kernels, plan, ctx.profile, alternatives=not ctx.brief)
    schedule = streams.to_json()
    meta = {"shapes": {k: list(v) for k, v in ishapes.items() if k not in ctx.fixed},
            "arena_bytes": plan.arena_bytes, "steps": dict(counts),
            "estimated_us": round(top_level_us(report), 1)}
    if predicated:
        meta["predicated"] = predicated
    if ctx.brief:
        schedule = {k: v for k, v in schedule.items() if k not in ("timeline", "candidates")}
    else:
        meta["fusion_report"] = report
    meta["schedule"] = schedule
    if stitched:
        meta["stitches"] = [r.to_json() for r in stitched]
    mem = plan.memory
    log = [f"{_fmt_shapes(ishapes)}: {sum(counts.values())} steps ({dict(counts)}), "
           f"arena {mem['arena_bytes'] / 2**20:.2f} MiB = {mem['ratio_to_lower_bound']}x live lower bound, "
           f"{time.perf_counter() - t1:.1f}s",
           f"schedule: {streams.reason}"]
    if stitched:
        saved = sum(r.saved_us for r in stitched)
        log.append(f"grid stitching: {sum(r.end - r.first for r in stitched)} steps in {len(stitched)} cooperative "
                   f"kernel(s), estimated {abs(saved):.1f} us {'faster' if saved > 0 else 'slower'} than a node each")
    return BucketResult(plan, meta, [_io_meta_out(low, n) for n in low.outputs], notes, log,
                        Choices(chosen, plan, streams.applied))


PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
HALF_PRECISIONS = ("fp16", "bf16")


def compile_model(model, shapes: dict | None = None, dims: dict | None = None, buckets: list | None = None,
                  bucket_dims: list | None = None, strict: bool = False, targets="auto", progress: Callable | None = None,
                  precision: str = "fp32", host_control: bool = False, values: dict | None = None,
                  calibration_inputs: list | None = None, precision_tolerance: float | None = None,
                  calibration_dims: dict | None = None,
                  fusion: str = "full", device_profile: str | DeviceProfile | None = None,
                  max_branches: int = MAX_BRANCHES, dynamic: dict | None = None, jobs: int | None = None,
                  conv: str = "auto", grid_stitch: str = "auto", half_outputs: bool = False,
                  attention: str = "auto", generate: int | None = None, top_k: int | None = None,
                  bounds: dict | None = None, every_size: bool = False) -> Bundle:
    """Compile an ONNX model (path or ModelProto) into a Bundle.

    shapes:  input name -> shape for the (single) bucket; dims: dim_param -> value.
    buckets: a list of such `shapes` dicts, one plan each (overrides shapes).
    bucket_dims: a list of `dims` dicts, one plan each, each merged over `dims` (e.g. [{"seq": 8},
             {"seq": 128}]). Kernels of different buckets that differ only in sizes share one GPU
             function that takes the sizes as arguments (codegen/module.py).
    strict:  fail when anything runs outside the graph (control flow on the host) instead of reporting.
    host_control: run If/Loop control on the host between graph launches (a baseline; reported, and
             refused by strict) instead of as CUDA conditional nodes inside the graph.
    targets: GPU architectures to compile cubins for (e.g. ["sm_90"]); "auto" = sm_90 when NVRTC is
             installed, none otherwise (the bundle then runs on the CPU backend only, and says so).
    values:  input name -> value, for inputs that set shape parameters (a Reshape target, axes, a
             Range bound: TensorRT's "shape inputs"). They are fixed at compile time: the plans are
             specialized for them, and a run that feeds another value is refused.
    precision: "fp32" (default, exact float32 GEMMs), "tf32" (float32 GEMMs on TF32 tensor cores) or
             "fp16" (weights and activations in float16, float32 accumulation; the model's inputs
             and outputs keep their types). fp16 keeps in float32 the op types that break in half
             and the nodes a calibration run on the CPU backend finds diverging (mixed_precision.py), and
             refuses (PrecisionError) when the outputs still diverge. "bf16": the same with bfloat16
             (float32's range, 8 bits of mantissa).
    calibration_inputs: for fp16, a list of {input name: array} samples to calibrate on (else random
             inputs valid for the model), shaped like the largest bucket.
    calibration_dims: for fp16/bf16, named dims to calibrate at instead of the largest bucket's (e.g.
             {"batch": 1} for a bundle of batch 32: each sample's arithmetic is the same, the CPU
             calibration 32 times cheaper); dims given whole by `shapes` are not changed.
    precision_tolerance: for fp16/bf16, the largest ||out - ref|| / ||ref|| accepted per output
             against float32 (default 1e-2 fp16, 3e-2 bf16).
    fusion:  "full" (default), "rules" (attention stays GEMM + softmax + GEMM) or "none" (one kernel
             per lowered op: the baseline fusion is measured against); If/Loop bodies always fuse.
    device_profile: the GPU to plan for: a shipped profile's name (h100), a file written by
             `grapec calibrate` or a DeviceProfile [default: h100]. The cost model prices every kernel's thread mapping
             with it (fusion "full"), and the manifest holds the estimated time of every step.
    max_branches: the most parallel branches the stream scheduler may give the CUDA graph (passes/streams.py);
             1 keeps one chain (`--serial`, the baseline).
    dynamic: dim name -> (lo, hi): every size from lo to hi gets its plan, as one bucket each (merged over
             `dims`; several dims give every combination). Each size is compiled exactly, so it runs as fast as a
             bundle made for it alone; the plans share kernels (sizes passed as arguments), weights and one
             arena, and are stored as templates plus deltas (bundle/templates.py).
             A range of more than SAMPLE_OVER sizes is compiled per launch structure (structures.py): a
             sample of its sizes is compiled, every other size's plan derived from its structure's.
    every_size: compile every size of a range, however many.
    jobs:    processes compiling buckets at once (fanout.py) [default: one per core, up to 16].
    conv:    "auto" (default: 1-D and 2-D floating-point convolutions as one channels-last `conv` library
             node each, cuDNN on the GPU), "cudnn" (the same) or "gemm" (an im2col gather + GEMM each:
             no cuDNN needed on the GPU machine).
    attention: "auto" (default: each fused attention as the generated flash kernel or cuDNN's SDPA,
             whichever the cost model prices lower for its shape), "kernel" or "cudnn" (passes/sdpa.py).
    half_outputs: with fp16/bf16, the float32 outputs are given in the half type (no widening kernel at
             the end, half the bytes to copy back); the inputs stay float32.
    generate: compile a decoder's whole greedy generation instead of one call: its prompt pass, then a
             Loop of up to `generate` decode steps into a KV cache allocated once, as one launch
             (frontend/generation.py gives the inputs and outputs). The decoder takes input_ids,
             attention_mask and past_key_values.N.key/.value and gives logits and present.N.*
             (onnxruntime-genai's builder, optimum); `dims` gives any named dim of its KV cache.
    top_k:   with generate: sample each token from the top_k logits (temperature, top_p and seed then
             inputs) instead of the greedy choice.
    bounds:  value name -> N: an integer tensor that sets sizes nothing else bounds (a Range limit or a
             shape read from the data, a Loop's trip count) is at most N (TensorRT's upper bounds of
             data-dependent shapes): the sizes it sets are allocated at N and counted at run time, and a
             run where it exceeds N is refused (passes/bounds.py apply_user_bounds).
    grid_stitch: "auto" (default: runs of short kernels of a one-chain plan become one cooperative kernel,
             a grid-wide barrier between its stages, where the cost model says it saves node gaps; on
             sm_90 it never does, passes/grid_stitch.py says why), "on" (every run that can be) or "off".
    """
    say = progress or (lambda msg: None)
    where = os.fspath(model) if not hasattr(model, "graph") else (model.graph.name or "model")
    t0 = time.perf_counter()
    if precision not in PRECISIONS:
        raise GrapecError(f"--precision {precision}: expected one of {', '.join(PRECISIONS)}")
    if fusion not in FUSION_LEVELS:
        raise GrapecError(f"--fusion {fusion}: expected one of {', '.join(FUSION_LEVELS)}")
    if conv not in CONV_PATHS:
        raise GrapecError(f"--conv {conv}: expected one of {', '.join(CONV_PATHS)}")
    if attention not in ATTENTION_ENGINES:
        raise GrapecError(f"--attention {attention}: expected one of {', '.join(ATTENTION_ENGINES)}")
    if half_outputs and precision not in HALF_PRECISIONS:
        raise GrapecError(f"--half-outputs needs --precision fp16 or bf16 (got {precision})")
    if grid_stitch not in STITCH_MODES:
        raise GrapecError(f"--grid-stitch {grid_stitch}: expected one of {', '.join(STITCH_MODES)}")
    from ..cost.device import load_profile
    profile = load_profile(device_profile)
    proto = load_model(model)
    if top_k is not None and generate is None:
        raise GrapecError("--top-k samples the tokens of a generation: it needs --generate N")
    if generate is not None:
        proto, used = _generation_model(proto, generate, dims or {}, where, top_k)
        dims = {k: v for k, v in (dims or {}).items() if k not in used}   # they sized the cache
        choice = "greedy" if top_k is None else f"top-{top_k} sampled"
        say(f"the decoder runs inside a generation loop: its prompt, then up to {generate} {choice} decode steps "
            f"into a KV cache of prompt + {generate} positions, as one launch")
    # onnxruntime's com.microsoft ops, rewritten in a proto of the compile's own (read from a file, or
    # the generation wrapper): never in a model the caller passed
    proto, contrib_problems = contrib_as_onnx(proto, in_place=proto is not model)
    graph = import_model(proto, where, contrib_problems)
    user_bounds = apply_user_bounds(graph, bounds) if bounds else []
    say(f"imported {len(graph.nodes)} nodes (opset {opset_of(proto)}) in {time.perf_counter() - t0:.1f}s")
    fixed = resolve_input_values(graph, values)
    fixed_shapes = {n: a.shape for n, a in fixed.items()}
    for n, shp in fixed_shapes.items():
        for given in [shapes or {}] + list(buckets or []):
            if n in given and tuple(given[n]) != shp:
                raise GrapecError(f"input '{n}': --shapes gives {list(given[n])}, its --value has shape {list(shp)}")
    if dynamic:
        if bucket_dims:
            raise GrapecError("--dynamic and --bucket cannot be combined: a range already gives every size its plan")
        bucket_dims = range_buckets(dynamic)
    if bucket_dims:
        specs = [({**(shapes or {}), **fixed_shapes}, {**(dims or {}), **bd}) for bd in bucket_dims]
    else:
        specs = [({**b, **fixed_shapes}, dims or {}) for b in (buckets or [shapes or {}])]
    bucket_shapes = [resolve_input_shapes(graph, s, d) for s, d in specs]
    first_of: dict = {}   # a bucket's shapes -> its first index (a dict: a range has tens of thousands)
    for i, b in enumerate(bucket_shapes):
        if (j := first_of.setdefault(repr(sorted(b.items())), i)) != i:
            raise GrapecError(f"bucket {i} ({_fmt_shapes(b)}) repeats bucket {j}")

    if dynamic:
        check_range_fits(graph, fixed, bucket_shapes, bucket_dims, dynamic)

    mixed = None
    if precision in HALF_PRECISIONS:
        from ..runtime.devices import host_memory_available
        from .mixed_precision import calibration_memory, choose_precision
        sizes = [sum(int(np.prod(s)) for s in b.values()) for b in bucket_shapes]
        at = sizes.index(max(sizes))
        calibrated = bucket_shapes[at]
        if calibration_dims:   # named dims of the largest bucket set smaller (a batch's samples are independent)
            shapes_at, dims_at = specs[at]
            unknown = sorted(set(calibration_dims) - set(dims_at))
            if unknown:
                raise ShapeError(f"--calibration-dim names {', '.join(repr(u) for u in unknown)}, which the compiled "
                                 f"shapes do not set by name (named dims: {', '.join(sorted(dims_at)) or 'none'})")
            calibrated = resolve_input_shapes(graph, shapes_at, {**dims_at, **calibration_dims})
        if not calibration_inputs:
            calibrated, note = calibration_memory(graph, calibrated, fixed, host_memory_available(),
                                                  user_chose=bool(calibration_dims))
            if note:
                say(note)
        proto, mixed = choose_precision(proto, graph, precision, calibrated, fixed, calibration_inputs, say,
                                        precision_tolerance, lowered_model=partial(lowered_model, bounds=bounds))
        if half_outputs:
            from ..frontend.precision import half_outputs as with_half_outputs
            proto = with_half_outputs(proto, precision)
            mixed.half_outputs = True
        graph = import_model(proto, where)
        if bounds:
            apply_user_bounds(graph, bounds)
        say(mixed.summary())

    cap_nms_at_rows_read(graph)
    proto = without_weight_data(proto)   # from here on its names, dims and metadata are read; the graph holds the weights
    weights, kernels = WeightStore(), KernelStore()
    ctx = BucketContext(graph, fixed, host_control, fusion, profile, max_branches,
                        brief=len(bucket_shapes) > BRIEF_REPORTS_OVER,
                        sized_fold_limit=SIZED_FOLD_LIMIT_BYTES if dynamic else None,
                        shared_weights=len(bucket_shapes) > 1 or generate is not None, conv=conv, attention=attention, grid_stitch=grid_stitch,
                        sizes=len(bucket_shapes),
                        dependent_launch=targets == "auto" or all(int(t[3:]) >= 90 for t in targets or ["sm_90"]),
                        held_outputs=streamed_outputs(proto))
    sampled = bool(dynamic) and len(bucket_shapes) > SAMPLE_OVER and not every_size
    try:
        with derived.sharing():   # the buckets (and a generation's prompt and decode step) derive a weight's copies once
            families = RangeFamilies(bucket_shapes)   # a sampled range's sizes stored as formulas (families.py)
            if sampled:
                results = _compile_range(ctx, dynamic, bucket_dims, bucket_shapes, weights, kernels, jobs, say, families)
            else:
                results = map_buckets(partial(compile_bucket, ctx), bucket_shapes, weights, kernels, jobs, say)
    except UnsupportedError as e:
        if generate is None:
            raise
        from ..frontend.generation import growing_cache
        raise UnsupportedError([growing_cache(p) or p for p in e.problems]) from None
    for r in results:   # a sampled range's plans sit at their structures' layouts, some widened (structures.py)
        r.meta["arena_bytes"] = r.plan.arena_bytes
    plans, bucket_meta, notes = [r.plan for r in results], families.bucket_meta([r.meta for r in results]), []
    moved = weights.share_prefixes()
    relocate_weights(plans, moved)
    if families.relocate(moved):
        plans = families.stored_plans()
    if len(plans) > 1 and not sampled:   # a sampled range's plans come at their structures' layouts
        shared = share_layouts(plans)
        for meta, plan in zip(bucket_meta, plans):
            meta["arena_bytes"] = plan.arena_bytes
        if shared:
            say(f"{shared} of {len(plans)} plans take the arena layout of their launch structure's largest size")
    for i, r in enumerate(results):
        notes += [n for n in r.notes if n not in notes]
        if len(results) <= BRIEF_REPORTS_OVER:
            for line in r.log:
                say(f"bucket {i} {line}")
    if len(bucket_meta) > BRIEF_REPORTS_OVER:
        arenas = [m["arena_bytes"] for m in bucket_meta]
        say(f"{len(bucket_meta)} buckets: arena {min(arenas) / 2**20:.2f}..{max(arenas) / 2**20:.2f} MiB (one arena of "
            f"the largest serves them all), {sum(sum(m['steps'].values()) for m in bucket_meta)} steps in all")
    if strict and notes:
        raise UnsupportedError(notes, header="--strict: parts of the model would not run inside the CUDA graph")

    targets, gpu_sections, gpu_entry = _gpu_code(kernels.kernels, plans, targets, notes, say, families.evidence_kernels(), jobs)
    if gpu_entry and families.fit_launches(gpu_entry, say):   # some stored plan by plan after all: their kernels' code too
        plans = families.stored_plans()
        targets, gpu_sections, gpu_entry = _gpu_code(kernels.kernels, plans, targets, notes, say, families.evidence_kernels(),
                                                     jobs)
    if gpu_entry:
        families.find_also(kernels.kernels, gpu_entry, jobs)
        report = families.gpu_report(gpu_entry)
        if report:
            say(report)

    ranges = value_ranges(proto, user_bounds)
    op_counts = Counter(n.op_type for n in proto.graph.node)
    manifest = {
        "grapec_version": __version__,
        "model": os.path.basename(where),
        "opset": opset_of(proto),
        "precision": precision,
        "fusion": fusion,
        "device_profile": profile.name,
        "inputs": [dict(_io_meta(graph, n, bucket_shapes), value_range=ranges[n].to_json() if n in ranges else None)
                   for n in graph.inputs if n not in fixed],
        "fixed_inputs": [{"name": n, "dtype": graph.values[n].dtype, "shape": list(a.shape), "value": a.tolist()}
                         for n, a in fixed.items()],
        "outputs": next(r.outputs for r in reversed(results) if r.outputs is not None),
        "buckets": bucket_meta,
        "dynamic": {n: list(r) for n, r in (dynamic or {}).items()} or None,
        "targets": list(targets),
        "cuda": gpu_entry,
        "notes": notes,
        "mixed_precision": mixed.to_json() if mixed else None,
        "onnx_ops": dict(sorted(op_counts.items())),
        "metadata": {p.key: p.value for p in proto.metadata_props if p.key.startswith("grapec.")},
        "weights_bytes": weights.size,
        "kernels": len(kernels.kernels),
    }
    if user_bounds:
        manifest["bounds"] = user_bounds
    if families.account:
        manifest["range_compile"] = families.account
    say(f"{len(kernels.kernels)} distinct kernels, {weights.size / 2**20:.2f} MiB of weights, "
        f"{time.perf_counter() - t0:.1f}s in all")
    for n in notes:
        say(f"note: {n}")
    # the weights stay the store's entries (no joined copy): Bundle.write streams them into the file
    return families.bundle(Bundle(manifest, weights.parts(), kernels.kernels, plans, gpu_sections))


def _compile_range(ctx, dynamic: dict, bucket_dims: list, bucket_shapes: list, weights, kernels, jobs, say,
                   families) -> list:
    """A range's buckets compiled per launch structure (structures.py): the results of those stored as
    plans, in bucket order; `families` takes the rest."""
    names = list(dynamic)
    sizes = [tuple(bd[n] for n in names) for bd in bucket_dims]
    shapes_at = dict(zip(sizes, bucket_shapes))

    def derived_result(plan, size):
        meta = {"shapes": {k: list(v) for k, v in shapes_at[size].items() if k not in ctx.fixed},
                "arena_bytes": plan.arena_bytes, "steps": dict(Counter(st.op for st in walk_steps(plan.steps))),
                "derived": True}
        return BucketResult(plan, meta, None)
    floors = _floors(ctx, names, sizes, shapes_at, say)
    results, report = compile_range(partial(compile_bucket, ctx), sizes, shapes_at.__getitem__, weights, kernels,
                                    jobs, say, derived_result, as_formulas=True,
                                    floors=[f.variable(len(names)) for f in floors])
    say(f"--dynamic {', '.join(f'{n}={lo}:{hi}' for n, (lo, hi) in dynamic.items())}: {report.summary()}")
    families.account = {"summary": report.summary(),
                        "floors": [f"floor(({names[f.dim]} + {f.o}) / {f.p})" for f in floors]}
    bucket_of = {s: i for i, s in enumerate(sizes)}

    def derive(fam, weight_bytes):   # a family's members as plans after all
        plans = derive_sizes(fam, kernels, weight_bytes or weights.size)
        return {bucket_of[s]: derived_result(p, s) for s, p in plans.items()}

    def meta(fam, i):
        steps = results[fam.spots[0]].meta["steps"]
        return {"shapes": {k: list(v) for k, v in shapes_at[fam.sizes[i]].items() if k not in ctx.fixed},
                "arena_bytes": fam.arena_bytes[i], "steps": steps, "derived": True}
    families.take(report.families, {bucket_of[s]: r for s, r in results.items()}, bucket_of, derive, meta, weights.size)
    return list(results.values())


def _floors(ctx, names: list, sizes: list, shapes_at: dict, say) -> list:
    """The model's lengths that are floors of the range's dims (floor_dims.py), from its shapes alone."""
    def dims_at(size):
        g = specialize(ctx.graph, shapes_at[size], input_values=ctx.fixed, sized_fold_limit=ctx.sized_fold_limit)
        return {(v.name, a): d for v in g.values.values() if v.const is None and v.shape for a, d in enumerate(v.shape)}
    ranges = [(min(s[d] for s in sizes), max(s[d] for s in sizes)) for d in range(len(names))]
    floors = floor_dims(dims_at, ranges)
    if floors:
        say("range: lengths that are floors of the dims, variables of its formulas: "
            + ", ".join(f"floor(({names[f.dim]} + {f.o}) / {f.p})" for f in floors))
    return floors


def _generation_model(proto, generate: int, dims: dict, where: str, top_k: int | None):
    from ..frontend.generation import decoder_config, generation_model
    from ..frontend.proto import Unsupported
    config = decoder_config(where) if os.path.isfile(where) else {}
    try:
        return generation_model(proto, generate, dims, os.path.basename(where), config, top_k)
    except Unsupported as e:
        raise ModelError(str(e)) from None


def _gpu_code(kernels, plans, targets, notes, say, shared: set = frozenset(), jobs: int | None = None):
    from ..codegen.gpu_support import gpu_gaps
    from ..codegen.nvrtc import NvrtcUnavailable, nvrtc_version
    gaps = gpu_gaps(plans)
    if gaps and targets:
        raise UnsupportedError(gaps, header="the GPU backend cannot run this model (--no-gpu builds a bundle for the "
                                            "CPU backend only)")
    if gaps:
        notes.append("CPU backend only: " + "; ".join(gaps))
    if targets == "auto":
        try:
            nvrtc_version()
            targets = ["sm_90"]
        except NvrtcUnavailable:
            notes.append(f"no NVRTC here ({gpu_package('cuda-bindings nvidia-cuda-nvrtc')}): no GPU code, CPU backend only")
            return [], {}, None
    targets = list(targets or [])
    if not targets:
        return [], {}, None
    from ..codegen.build import build_gpu_code
    t0 = time.perf_counter()
    sections, entry = build_gpu_code(kernels, plans, targets, shared=shared, mapper=partial(map_forked, jobs=jobs))
    say(f"CUDA code: {len(set(entry['kernels']))} kernels for {', '.join(targets)} (+ PTX {entry['ptx']}), "
        f"NVRTC {entry['nvrtc']}, {time.perf_counter() - t0:.1f}s")
    return targets, sections, entry


def _fmt_shapes(s):
    return ",".join(f"{k}={'x'.join(map(str, v)) or 'scalar'}" for k, v in s.items())


def _io_meta(graph, name, bucket_shapes):
    v = graph.values[name]
    return {"name": name, "dtype": v.dtype, "dims": list(v.shape) if v.shape is not None else None,
            "shapes": [list(b[name]) for b in bucket_shapes]}


def _io_meta_out(low, name):
    v = low.lookup(name)
    return {"name": name, "dtype": v.dtype, "dims": list(v.shape)}


__all__ = ["compile_model", "compile_graph", "GrapecError"]
