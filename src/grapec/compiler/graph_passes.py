"""compile_graph: one graph (a bucket's, or an If/Loop body's) through the graph passes, from the imported ONNX
graph to the scheduled lowered graph the plan is built from. pipeline.py's docstring lists the passes in order and
runs this for each bucket; ops/control.py runs it for the bodies.
"""
from __future__ import annotations

from ..ir.graph import Graph
from ..passes.attention import fuse_attention
from ..passes.attention_operands import attention_operands
from ..passes.sdpa import attention_engines
from ..passes.channels_last import channels_last
from ..passes.epilogue import fold_epilogues, fold_output_casts
from ..passes.upcast_operands import upcast_operands
from ..passes.fuse import fuse
from ..passes.gemv import gemvs_after_fusion, small_matmuls_as_kernels
from ..passes.lower import lower_graph
from ..passes.mappings import choose_mappings
from ..passes.predicate import form_regions
from ..passes.schedule import schedule
from ..passes.siblings import merge_sibling_matmuls
from ..passes.small_gemm import small_gemms
from ..passes.simplify import simplify
from ..passes.aligned_rows import aligned_rows
from ..passes.strided_operands import strided_operands
from ..passes.specialize import FOLD_LIMIT_BYTES, specialize
from ..passes.weight_layout import weights_as_nk


FUSION_LEVELS = ("full", "rules", "none")


def compile_graph(graph: Graph, input_shapes: dict, parent: Graph | None = None, fusion: bool | str = "full",
                  host_control: bool = False, input_values: dict | None = None, notes: list | None = None,
                  profile=None, fold_limit: int = FOLD_LIMIT_BYTES, sized_fold_limit: int | None = None,
                  shared_weights: bool = False,
                  conv: str = "auto", regions: bool = True, attention: str = "auto",
                  predicated: list | None = None, clusters: bool = False, chosen: dict | None = None,
                  sizes: int = 1) -> Graph:
    """One bucket through the passes, up to the scheduled lowered graph. `parent`: the enclosing
    graph when compiling an If/Loop body (its regions are formed with the top level's);
    fusion: "full", "rules" (no fused attention) or "none" (one kernel per lowered op; False and
    True are "none" and "full"); host_control: If/Loop control on the host;
    input_values: graph inputs fixed to these values (constants from here on); notes: where
    to report what fusion left alone; profile: the target's DeviceProfile, for the cost model
    (fusion "full" only: it picks every kernel's thread mapping); fold_limit: the largest constant
    folding stores; sized_fold_limit: the largest for a value computed from the inputs (a range of sizes:
    each size would store its own); shared_weights:
    one of several buckets, whose weights should have one layout in all of them (weight_layout.py);
    conv: how convolutions run (ops/conv.py conv_path); regions: False leaves the top level's If and
    Loop nodes as lowering made them (ir/evaluate.py runs that form), not yet in the form plans run;
    attention: how fused attention runs (passes/sdpa.py ATTENTION_ENGINES);
    sizes: how many buckets the compile has (a library call whose launch differs by size costs a node
    update at each switch between them, and memory per size: passes/sdpa.py);
    predicated: where to list each data-dependent size, its bound and where that came from (ops/counted.py);
    clusters: the GPU code targets sm_90+ only, whose thread-block clusters the split small GEMMs use;
    chosen: the cost-based choices, filled in as they are made: {"mappings": passes/mappings.py's,
    "fusion": passes/fuse.py's, "aligned_rows": the padded row groups}; a choice already in it is repeated where it fits (a size of a range
    taking its launch structure's: compiler/structures.py)."""
    g = specialize(graph, input_shapes, parent, input_values, fold_limit, sized_fold_limit, forms := {})  # lowered once: lower_graph takes these
    g = simplify(g)
    level = {True: "full", False: "none"}.get(fusion, fusion)
    if level != "none":
        g = merge_sibling_matmuls(g)
    notes = notes if notes is not None else []
    # an If/Loop body (a generation's decode step) is compiled as this graph is: the same fusion,
    # cost model, weight layouts and engines, and its notes reported with this graph's
    body = dict(fusion=level, profile=profile, fold_limit=fold_limit, sized_fold_limit=sized_fold_limit,
                shared_weights=shared_weights, conv=conv, attention=attention, sizes=sizes, clusters=clusters, notes=notes)
    g = lower_graph(g, options={"conv": conv, "notes": notes, "body": body,
                                "predicated": predicated if predicated is not None else [],
                                **({"sized_fold_limit": sized_fold_limit} if sized_fold_limit is not None else {})},
                    forms=forms)
    if level != "none":
        if shared_weights:
            g = weights_as_nk(g)
        g = small_matmuls_as_kernels(g, small_gemms=level == "full")
        g = fold_epilogues(g)
        g = fuse(g, chosen.setdefault("fusion", {}) if chosen is not None else None)
        g = channels_last(g)
        g = fold_epilogues(g)   # activations, now that fusion made them one kernel
        g = upcast_operands(g)
        g = strided_operands(g)
        if level == "full":
            g = fuse_attention(g, notes)
            g = attention_operands(g)
            g = attention_engines(g, profile, attention, notes, sizes)
            g = small_gemms(g, profile, split=clusters)
            g = gemvs_after_fusion(g)
        g = fold_output_casts(g)
        g = aligned_rows(g, chosen.setdefault("aligned_rows", {}) if chosen is not None else None)
        if level == "full" and profile is not None:
            g = choose_mappings(g, profile, chosen.setdefault("mappings", {}) if chosen is not None else None)
    g = schedule(g)
    return form_regions(g, host_control) if parent is None and regions else g
