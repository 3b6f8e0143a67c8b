"""The cost model: a graph node's time on a device, from its work (cost/work.py) and a profile.

    time = sum over features f of  coefficient[kind][f] * feature_f(work, device)

The features are physical and scale with the device:

    node        1: what any graph node costs (launch, first instruction, last store seen)
    phase       dependent memory round trips: a reduction's result must exist before its readers run
    block_sync  block-wide reductions (shared memory, barriers); warp_sync: warp-shuffle ones
    serial      the longest loop one thread (warp, tile) runs, times the waves of the grid; a loop
                that loads 16 bytes a lane and keeps later loads in flight (warp mode) is
                vector_serial, a block's strided loop over a row is row_serial, priced apart:
                the first's iterations overlap, the second's each wait on memory
    dram_mb     DRAM traffic over the fraction of SMs the grid occupies (a small grid cannot pull
                the full bandwidth); cache_mb: bytes read again; gflop: arithmetic, likewise
    thread_kops the arithmetic one thread does, in thousands of operations: a warp that computes
                a whole row's expensive expression (an inlined GELU) waits on its own ALU chain
    unaligned_gflop  a GEMM's arithmetic when an operand's rows are not 16-byte aligned (cuBLASLt
                then runs kernels without vector loads)

The coefficients are fitted per kind (kernel, attention, small_gemm, gemm, sdpa) by `grapec calibrate` on kernels that
are not the zoo's; the zoo's measured steps then check the model (benchmarks/cost_model.py). A
profile's node gap (what one more node adds to a chain's replay) prices plans with different node
counts against each other (price_small_gemm).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..codegen.launch import candidate_mappings, mapped_launch
from .device import DeviceProfile
from .work import Work, attention_work, gemm_work, kernel_work, sdpa_work, small_gemm_work

FEATURES = {
    "kernel": ("node", "phase", "block_sync", "warp_sync", "serial", "row_serial", "vector_serial", "dram_mb",
               "cache_mb", "gflop", "thread_kops"),
    "attention": ("node", "serial", "dram_mb", "cache_mb", "gflop"),
    "small_gemm": ("node", "phase", "serial", "dram_mb", "cache_mb", "gflop"),
    "gemm": ("node", "serial", "dram_mb", "gflop", "unaligned_gflop"),
    "sdpa": ("node", "dram_mb", "gflop"),
    # NonZero and NonMaxSuppression (codegen/selection.py): priced with the generated kernels'
    # coefficients, which they are made of (loops, block reductions); not calibrated on their own
    "selection": ("node", "phase", "block_sync", "warp_sync", "serial", "dram_mb", "cache_mb", "gflop"),
}
PRICED_AS = {"selection": "kernel"}


@dataclass(frozen=True)
class Estimate:
    us: float
    terms: dict          # feature -> microseconds it contributes
    work: Work

    @property
    def bound(self) -> str:
        """The term that dominates: what to attack to make the node faster."""
        names = {"node": "launch", "phase": "latency", "block_sync": "latency", "warp_sync": "latency",
                 "serial": "serial loop", "row_serial": "serial loop", "vector_serial": "serial loop", "dram_mb": "memory", "cache_mb": "cache", "gflop": "compute",
                 "unaligned_gflop": "unaligned operands", "thread_kops": "compute"}
        return names[max(self.terms, key=self.terms.get)] if self.terms else "launch"


def features(work: Work, sms: int) -> dict:
    # cuBLASLt splits K or picks smaller tiles when its tiles would not fill the GPU, so a GEMM's
    # bandwidth and arithmetic are not scaled down by its tile count
    active = 1.0 if work.kind in ("gemm", "sdpa") else work.active(sms)
    waves = work.waves(sms)
    serial = work.serial * waves
    # a row kernel's blocks wait out their reductions' round trips together: each wave pays them
    rounds_in_rows = bool(work.block_syncs or work.warp_syncs)
    rounds = waves if rounds_in_rows else 1
    return {"node": 1.0, "phase": float(work.phases * rounds), "block_sync": float(work.block_syncs * rounds),
            "warp_sync": float(work.warp_syncs * rounds),
            "serial": serial if not rounds_in_rows else 0.0,
            "row_serial": serial if rounds_in_rows and not work.vectorized else 0.0,
            "vector_serial": serial if work.vectorized else 0.0,
            "dram_mb": work.dram_mb / active, "cache_mb": work.cache_mb / active, "gflop": work.gflop / active,
            "unaligned_gflop": 0.0 if work.aligned else work.gflop,
            "thread_kops": work.gflop * 1e6 / max(1, work.blocks * work.block) * waves}


def estimate(work: Work, profile: DeviceProfile) -> Estimate:
    coef = profile.coefficients.get(PRICED_AS.get(work.kind, work.kind), {})
    x = features(work, profile.sms)
    terms = {f: coef.get(f, 0.0) * x[f] for f in FEATURES[work.kind]}
    return Estimate(sum(terms.values()), terms, work)


def price_mappings(kernel, profile: DeviceProfile) -> list:
    """[(mapping, Estimate)] for every candidate thread mapping of a generated kernel, cheapest first."""
    priced = [(m, estimate(kernel_work(kernel, mapped_launch(kernel, *m)), profile)) for m in candidate_mappings(kernel)]
    return sorted(priced, key=lambda p: p[1].us)


def price_small_gemm(kernel, profile: DeviceProfile) -> list:
    """[(plan, us)] for a few-row GEMM (ir/small_gemm.py), cheapest first: "prologue" (one kernel,
    A computed in it), "kernel" (A's producer a kernel of its own, then this one) and "cuBLASLt"
    (the producer's kernel, if any, then cuBLASLt's GEMM with its epilogue). Each node also costs
    the profile's node gap: in a chain, a node costs more than it takes alone."""
    producer = price_mappings(kernel.prologue, profile)[0][1].us if kernel.prologue is not None else 0.0
    epilogue_inputs = [shape for shape, _ in kernel.epilogue.inputs[1:]]
    library = gemm_work(kernel.rows, kernel.cols, kernel.depth, 1, kernel.dtype,
                        c=(kernel.rows, kernel.cols) in epilogue_inputs, bias=(kernel.cols,) in epilogue_inputs)
    plain = kernel.without_prologue()
    nodes = 1 + (kernel.prologue is not None)
    gap = profile.node_gap_us
    options = [("kernel", producer + estimate(small_gemm_work(plain), profile).us + nodes * gap),
               ("cuBLASLt", producer + estimate(library, profile).us + nodes * gap)]
    if kernel.prologue is not None:
        options.append(("prologue", estimate(small_gemm_work(kernel), profile).us + gap))
    return sorted(options, key=lambda o: o[1])


# Host time of one node updated in an instantiated graph, H200: 3.4-3.6 us alone
# (benchmarks/results/2026-11-26-h200-shared-execs), 5.3-5.9 us (kernel node) and 7.2 us (child graph)
# inside a range's switches, through cuda.bindings or ctypes alike (2026-11-27-gpu-memory-switch).
NODE_UPDATE_US = 6.0
# Device memory cuDNN's SDPA takes per size (its plans built and timed at load, each engine's code):
# GPT-2 full fp16, seq 321..512, 102 MiB over 192 sizes (2026-11-27-gpu-memory-switch/build_memory.log).
CUDNN_SDPA_MIB_PER_SIZE = 0.55


def price_attention(kernel, sdpa_attrs: dict, bias_kernel, profile: DeviceProfile, switch_us: float = 0.0) -> list:
    """[(engine, us)] for one fused attention (ir/attention.py), cheapest first: "kernel" (the
    generated flash kernel) and, where the profile prices it, "cuDNN" (cuDNN's SDPA, after a kernel
    that writes the score's additive mask when the mask is an expression: bias_kernel). Each node
    also costs the profile's node gap. switch_us: what cuDNN's node costs a switch between the sizes
    of a bundle of several (its launch differs by size, so the runner sets it at each switch, where
    the generated kernel's node reads its sizes from device memory: runtime/cuda/size_record.py)."""
    gap = profile.node_gap_us
    options = [("kernel", estimate(attention_work(kernel), profile).us + gap)]
    if profile.coefficients.get("sdpa"):
        us = estimate(sdpa_work(sdpa_attrs, kernel.dtype), profile).us + gap + switch_us
        if bias_kernel is not None:
            us += price_mappings(bias_kernel, profile)[0][1].us + gap
        options.append(("cuDNN", us))
    return sorted(options, key=lambda o: o[1])
