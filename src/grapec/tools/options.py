"""The options the grapec commands share (input shapes, precision, fusion, the stream scheduler),
with the help text that teaches each; tools/cli.py puts them on its commands."""
from __future__ import annotations

import math

import click


class Tolerance(click.ParamType):
    """A finite number >= 0 (> 0 where `positive`): NaN or a negative tolerance judges nothing."""
    name = "float"

    def __init__(self, positive: bool = False):
        self.positive = positive

    def convert(self, value, param, ctx):
        try:
            v = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(v) or v < 0 or (self.positive and v == 0):
            self.fail(f"{value!r}: expected a finite number {'> 0' if self.positive else '>= 0'}", param, ctx)
        return v


SHAPES_HELP = ("Input shapes for the bucket, trtexec style: NAME=DxDx..,NAME2=... "
               "(e.g. input_ids=1x128). Repeatable.")
DIM_HELP = "Values for named dynamic dims: NAME=N,... (e.g. batch=1,seq=128). Repeatable."
VALUE_HELP = ("Fix an input's value at compile time: NAME=V1,V2,.. or NAME=FILE.npy. For inputs that set shape "
              "parameters (a Reshape target, axes, pads, a Range bound): the plan is specialized for the value, "
              "and a run fed another value is refused. The compiler names such inputs when it needs them. Repeatable.")


BOUND_HELP = ("An upper bound for an integer tensor that sets sizes nothing else bounds: a Range limit, a "
              "shape or a Loop's trip count read from the data (TensorRT's upper bounds of data-dependent shapes). "
              "NAME is a graph input or a node's output. What it sizes is allocated at N and counted at run time, "
              "so one CUDA graph serves every value up to N; a run where NAME is more than N is refused with an "
              "error naming it. The compiler names the tensors that need one. Repeatable.")


def shape_options(f):
    f = click.option("--bound", "bounds", multiple=True, metavar="NAME=N", help=BOUND_HELP)(f)
    f = click.option("--value", "values", multiple=True, metavar="NAME=V,..", help=VALUE_HELP)(f)
    f = click.option("--dim", "dims", multiple=True, metavar="NAME=N", help=DIM_HELP)(f)
    f = click.option("--shapes", multiple=True, metavar="NAME=DxD", help=SHAPES_HELP)(f)
    return f


CONV_HELP = ("How convolutions run. auto and cudnn: each 1-D and 2-D floating-point Conv is one channels-last "
             "convolution (cuDNN on the GPU, NHWC, bias fused; the kernels around it read and write NHWC); it needs "
             "nvidia-cudnn-frontend and cuDNN 9 where the bundle runs. gemm: an im2col gather + one GEMM each "
             "(cuBLASLt only; slower, most of all at batch > 1). Integer and 3-D convolutions always take gemm; "
             "auto also gives gemm to grouped (not depthwise) convolutions of 32 taps or more and to those of one "
             "input channel, where cuDNN measured slower (Wav2Vec2), and says so at compile time.")
ATTENTION_HELP = ("How fused attention (fp16/bf16) runs on the GPU. auto: per shape, whichever the cost model "
                  "prices lower of grapec's generated flash-attention kernel (it wins at small batch x heads, where "
                  "launches bind) and cuDNN's SDPA (it wins where arithmetic does: batch 8+ at seq 128); grapec "
                  "inspect shows each step's choice and estimate. kernel: always the generated kernel (no cuDNN "
                  "needed). cudnn: cuDNN wherever the score is scale * q k^T + an additive mask and the operands "
                  "are 16-byte aligned; the compile notes say where it is not (and --strict fails there).")
GRID_STITCH_HELP = ("Where a plan is one chain of short kernels (a decode step, a short sequence), runs of them can "
                    "become one cooperative kernel on the GPU, a grid-wide barrier between its stages instead of a "
                    "graph node each. auto: where the cost model says it pays; on sm_90 and newer it does not (a "
                    "barrier costs 1.6 us on an H100, a node joined by a programmatic edge 0.95 us). on: every run "
                    "that can be (the compile log and grapec inspect --fusion show them). off: every kernel its own node.")
DYNAMIC_HELP = ("A range of a named dim, both ends included (e.g. seq=1:512; repeatable, several dims give every "
                "combination). Every size gets its own plan, as fast as a bundle made for that size alone; the plans "
                "share one arena (the largest size's), the kernels (sizes are passed as arguments) and the weights. "
                "Sizes fall into a few launch structures: past 64 sizes, a sample of each structure's is compiled "
                "and the others' plans are derived from it (numbers as formulas of the sizes and of the model's "
                "floors of them, such as a strided convolution's frames over audio samples; checked against "
                "compiled sizes drawn at random; --every-size compiles them all). At most 262144 sizes in all "
                "(e.g. samples=1600:160000). Memory at run time does not grow with the range. A run outside the "
                "range is refused with an error naming it.")
PRECISION_HELP = ("fp32: float32 throughout, GEMMs exact (no TF32); tf32: GEMMs on TF32 tensor cores; "
                  "fp16: weights and activations float16, accumulation (GEMMs, reductions, softmax and "
                  "normalisation statistics) float32; inputs and outputs keep their types. fp16 keeps in float32 "
                  "the op types that break in half and the nodes that a calibration run on the CPU finds "
                  "diverging, reports them, and refuses the model if its outputs still differ from float32 "
                  "by more than 1e-2 (||out-ref||/||ref||). bf16: the same in bfloat16 (float32's range, fewer "
                  "mantissa bits; tolerance 3e-2).")
FUSION_HELP = ("full: producers inlined into consumers, reductions stitched (LayerNorm, softmax as one kernel), "
               "epilogues folded into GEMMs, attention as one flash-attention kernel (fp16/bf16), and each kernel's "
               "thread mapping (block, warp or thread per row) chosen by the cost model for --device-profile; rules: "
               "the same fusion with the fixed mapping rules, and attention as GEMM + softmax + GEMM; none: one kernel per lowered op, every GEMM "
               "plain (a baseline to measure fusion against). If/Loop bodies are fused in every mode.")
PROFILE_HELP = ("The GPU the cost model plans for: a shipped profile (h100) or a file written by "
                "`grapec calibrate` on the target GPU. `grapec inspect --fusion` shows what it estimated.")
CALIBRATION_HELP = ("For fp16 and bf16: an .npz with one array per model input, shaped like the largest bucket, to "
                    "calibrate on instead of random inputs (repeatable: one sample per file).")


def precision_option(f):
    f = click.option("--precision-tolerance", "precision_tolerance", type=Tolerance(positive=True), default=None,
                     metavar="X",
                     help="For fp16 and bf16, the tolerance t: an output passes when ||out-ref||/||ref|| <= t "
                          "against float32 (`grapec check`'s measure); compile accepts within 0.8*t on every "
                          "calibration draw [default: 1e-2 fp16, 3e-2 bf16].")(f)
    f = click.option("--calibration-inputs", "calibration_inputs", multiple=True, metavar="FILE.npz",
                     type=click.Path(dir_okay=False), help=CALIBRATION_HELP)(f)
    f = click.option("--calibration-dim", "calibration_dims", multiple=True, metavar="NAME=N",
                     help="For fp16 and bf16: calibrate with these named dims instead of the largest bucket's "
                          "(e.g. batch=1 for a batch-32 bundle: each sample's arithmetic is the same, and the CPU "
                          "calibration 32 times cheaper). Without it, the largest bucket's, with the batch lowered "
                          "where calibration (which holds every intermediate) would not fit in memory; the log "
                          "says so.")(f)
    return click.option("--precision", type=click.Choice(["fp32", "tf32", "fp16", "bf16"]), default="fp32",
                        show_default=True, help=PRECISION_HELP)(f)
SERIAL_HELP = ("Keep the CUDA graph one chain, every step after the one before (the baseline the stream "
               "scheduler is measured against) [default: parallel branches where the cost model's simulation "
               "finds them faster].")
BRANCHES_HELP = ("The most parallel branches the stream scheduler may give the CUDA graph: independent steps "
                 "(an inception block's convolutions) run at once, at most this many, in an order that puts "
                 "compute-bound beside memory-bound kernels. `grapec inspect --schedule` shows the choice.")


def branch_options(f):
    f = click.option("--max-branches", "max_branches", type=click.IntRange(1, 16), default=4, show_default=True,
                     metavar="N", help=BRANCHES_HELP)(f)
    return click.option("--serial", is_flag=True, help=SERIAL_HELP)(f)


def branch_count(serial: bool, max_branches: int) -> int:
    return 1 if serial else max_branches
