"""The grapec command line.

Exit codes: 0 ok, 1 mismatch (check) or internal error, 2 bad usage or bad input.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback

import click
import numpy as np

from .. import __version__
from ..bundle.format import check_writable
from ..errors import BundleError, GrapecError
from .options import (ATTENTION_HELP, CONV_HELP, DYNAMIC_HELP, FUSION_HELP, GRID_STITCH_HELP, PROFILE_HELP, Tolerance,
                      branch_count, branch_options, precision_option, shape_options)


def _err(msg: str):
    click.echo(f"error: {msg}", err=True)


EXIT_BROKEN_PIPE = 141   # 128 + SIGPIPE: what `cat` ends with when the reader of its output goes away


def _quiet_stdout():
    """The reader of stdout went away (`grapec inspect m.grape | head -1`): end without a message, and
    point stdout at /dev/null so the interpreter's last flush does not complain either."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


class GrapecGroup(click.Group):
    """Turns every GrapecError into one clear message and exit code 2, and hides tracebacks."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except GrapecError as e:
            _err(str(e))
            sys.exit(e.exit_code)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException, SystemExit):
            raise
        except BrokenPipeError:
            _quiet_stdout()
            sys.exit(EXIT_BROKEN_PIPE)
        except KeyboardInterrupt:
            _err("interrupted")
            sys.exit(130)
        except Exception as e:  # noqa: BLE001 - a bug in grapec: say so, no traceback unless asked
            if os.environ.get("GRAPEC_DEBUG"):
                traceback.print_exc()
            _err(f"internal error: {type(e).__name__}: {e}\n"
                 "This is a bug in grapec; rerun with GRAPEC_DEBUG=1 for the traceback and please report it.")
            sys.exit(1)


@click.group(cls=GrapecGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="grapec")
def main():
    """grapec: compile ONNX models ahead of time into CUDA-graph bundles, and run them.

    \b
    Typical use:
      grapec compile model.onnx -o model.grape --shapes input_ids=1x128
      grapec run model.grape --backend cpu
      grapec check model.onnx --dim batch=1,seq=8     # compare with onnxruntime
      grapec inspect model.grape

    Compilation needs no GPU. Exit codes: 0 ok, 1 mismatch or internal error, 2 bad usage/input,
    141 when the reader of the output goes away first (as `| head`), quietly.
    """


def _compile(model, shapes, dims, strict=False, quiet=False, targets="auto", precision="fp32", buckets=(),
             host_control=False, values=(), calibration_inputs=(), precision_tolerance=None, fusion="full",
             device_profile=None, max_branches=None, dynamic=(), jobs=None, calibration_dims=(), conv="auto",
             grid_stitch="auto", half_outputs=False, attention="auto", generate=None, top_k=None, bounds=(),
             every_size=False):
    from ..compiler import compile_model
    from ..frontend.shapes import parse_bounds, parse_dims, parse_ranges
    from ..bundle.inputs import load_calibration_inputs
    from ..passes.streams import MAX_BRANCHES
    say = None if quiet else (lambda m: click.echo(f"[grapec] {m}", err=True))
    shape_args, dim_args, value_args = _parse(shapes, dims, values)
    return compile_model(model, shapes=shape_args, dims=dim_args, strict=strict, values=value_args,
                         targets=targets, progress=say, precision=precision, host_control=host_control,
                         calibration_inputs=load_calibration_inputs(calibration_inputs),
                         calibration_dims=parse_dims(calibration_dims, "--calibration-dim") or None,
                         precision_tolerance=precision_tolerance, fusion=fusion, device_profile=device_profile,
                         bucket_dims=[parse_dims(b, "--bucket") for b in buckets] or None,
                         max_branches=max_branches or MAX_BRANCHES, dynamic=parse_ranges(dynamic) or None, jobs=jobs,
                         conv=conv, grid_stitch=grid_stitch, half_outputs=half_outputs, attention=attention,
                         generate=generate, top_k=top_k, bounds=parse_bounds(bounds) or None, every_size=every_size)


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Bundle to write [default: MODEL with .grape].")
@shape_options
@click.option("--strict", is_flag=True, help="Fail if any part of the model would run outside the CUDA graph.")
@click.option("--host-control", is_flag=True,
              help="Run If/Loop control on the host between graph launches (a baseline to compare with) instead of "
                   "as CUDA conditional IF/WHILE nodes inside the graph [default: inside the graph].")
@click.option("--target", "targets", multiple=True, metavar="SM_XX",
              help="GPU architecture to build cubins for, e.g. sm_90 (repeatable) [default: sm_90 when NVRTC is installed].")
@click.option("--no-gpu", is_flag=True, help="Build no GPU code (a bundle for the CPU backend only).")
@click.option("--bucket", "buckets", multiple=True, metavar="NAME=N,..",
              help="One shape bucket per use, as named dim values merged over --dim (e.g. --bucket seq=8 "
                   "--bucket seq=128). Each bucket gets its own plan; kernels that differ only in sizes "
                   "share one GPU function.")
@click.option("--dynamic", "dynamic", multiple=True, metavar="NAME=LO:HI,..", help=DYNAMIC_HELP)
@click.option("--every-size", is_flag=True,
              help="Compile every size of a --dynamic range (slow for thousands of sizes) instead of a sample of "
                   "each launch structure's, the other sizes' plans derived from it.")
@click.option("--jobs", "-j", type=click.IntRange(1, 256), default=None, metavar="N",
              help="Processes compiling buckets at once [default: one per core, up to 16].")
@precision_option
@click.option("--fusion", type=click.Choice(["full", "rules", "none"]), default="full", show_default=True, help=FUSION_HELP)
@click.option("--conv", type=click.Choice(["auto", "cudnn", "gemm"]), default="auto", show_default=True, help=CONV_HELP)
@click.option("--attention", type=click.Choice(["auto", "kernel", "cudnn"]), default="auto", show_default=True,
              help=ATTENTION_HELP)
@click.option("--grid-stitch", type=click.Choice(["auto", "on", "off"]), default="auto", show_default=True,
              help=GRID_STITCH_HELP)
@click.option("--half-outputs", is_flag=True, help="With --precision fp16/bf16: give the model's float32 outputs in "
              "that half type (as onnxruntime's float16 converter without keep_io_types, or a TensorRT engine with half "
              "output formats): no widening kernel at the end and half the bytes to copy back. Inputs stay float32.")
@click.option("--generate", type=click.IntRange(min=1), default=None, metavar="N",
              help="MODEL is a decoder (input_ids, attention_mask, past_key_values.*): compile its whole greedy "
                   "generation, the prompt then up to N new tokens, as one launch. Inputs prompt_ids [batch, prompt], "
                   "prompt_lengths, max_new_tokens, eos_token_id; set batch and prompt with --dim (run it with "
                   "`grapec generate`).")
@click.option("--top-k", type=click.IntRange(min=1), default=None, metavar="K",
              help="With --generate: sample each token from the K most likely (onnxruntime-genai's and HF's top_k) "
                   "instead of the greedy choice. The bundle then also takes temperature, top_p (nucleus) and seed "
                   "at run time (`grapec generate --temperature --top-p --seed`); one seed gives the same tokens on "
                   "every backend.")
@click.option("--device-profile", default="h100", show_default=True, metavar="NAME|FILE", help=PROFILE_HELP)
@branch_options
@click.option("--force", is_flag=True, help="Overwrite OUTPUT if it exists and is not a grapec bundle.")
@click.option("-q", "--quiet", is_flag=True, help="No progress messages.")
def compile(model, output, shapes, dims, values, bounds, buckets, strict, host_control, targets, no_gpu, dynamic,
            every_size, jobs, precision, calibration_inputs, calibration_dims, precision_tolerance, fusion, conv,
            attention, grid_stitch, half_outputs, generate, top_k, device_profile, serial, max_branches, force, quiet):
    """Compile an ONNX MODEL into a .grape bundle (no GPU needed).

    Every dynamic dim needs a value: from --shapes (whole input shapes), --dim (named dims),
    --bucket (one plan per bucket; a run picks the bucket that matches its inputs' shapes) or
    --dynamic (every value of a range, e.g. --dynamic seq=1:512 --dim batch=1).
    Unsupported ops are all listed at once. The bundle is written atomically.
    """
    out = output or os.path.splitext(model)[0] + ".grape"
    if os.path.abspath(out) == os.path.abspath(model):
        raise GrapecError(f"output {out} would overwrite the input model; choose another -o")
    check_writable(out)   # before the compile, not after it
    if os.path.exists(out) and not force:
        with open(out, "rb") as f:
            if f.read(6) != b"GRAPEC":
                raise GrapecError(f"{out} exists and is not a grapec bundle; refusing to overwrite it (use --force)")
    t0 = time.perf_counter()
    for t in targets:
        if not t.startswith("sm_") or not t[3:].isdigit():
            raise GrapecError(f"--target {t}: expected an architecture like sm_90")
    bundle = _compile(model, shapes, dims, strict, quiet, [] if no_gpu else (list(targets) or "auto"), precision,
                      buckets, host_control, values, calibration_inputs, precision_tolerance, fusion, device_profile,
                      branch_count(serial, max_branches), dynamic, jobs, calibration_dims, conv, grid_stitch, half_outputs,
                      attention, generate, top_k, bounds, every_size)
    bundle.write(out)
    if not quiet:
        click.echo(f"[grapec] wrote {out} ({os.path.getsize(out) / 2**20:.2f} MiB) in {time.perf_counter() - t0:.1f}s", err=True)


def _load_session(path, backend, shapes, dims, values=(), quiet=True, device=0, bounds=()):
    import grapec
    from ..bundle.format import MAGIC
    if os.path.exists(path) and not os.path.isdir(path):
        with open(path, "rb") as f:
            is_bundle = f.read(8) == MAGIC
        if not is_bundle and path.endswith(".onnx"):
            sess = grapec.load(_compile(path, shapes, dims, quiet=quiet, targets=[] if backend == "cpu" else "auto",
                                        values=values, bounds=bounds), backend=backend, device=device)
            return sess, 0
    if values or bounds:
        raise GrapecError(f"{'--value' if values else '--bound'} applies when running an .onnx file; a bundle has "
                          "its values and bounds fixed at compile time")
    sess = grapec.load(path, backend=backend, device=device)
    return sess, _bucket_for(sess, shapes, dims)


def _bucket_for(sess, shapes, dims) -> int:
    """The bucket of a bundle that --shapes / --dim ask for (the first bucket when they say nothing)."""
    if not shapes and not dims:
        return 0
    shape_args, dim_args, _ = _parse(shapes, dims)
    first = sess.buckets[0]
    want = {}
    for info in sess.bundle.manifest["inputs"]:
        name = info["name"]
        if name in shape_args:
            want[name] = tuple(shape_args[name])
        elif name in first:
            named = info["dims"] or [None] * len(first[name])
            want[name] = tuple(dim_args.get(d, v) if isinstance(d, str) else v for d, v in zip(named, first[name]))
    return sess.select_bucket(want)


def _feeds(sess, inputs, seed, bucket=0):
    from ..bundle.inputs import load_npy_inputs, random_inputs
    from ..bundle.value_range import manifest_ranges
    infos = sess.bundle.manifest["inputs"]
    given = load_npy_inputs(list(inputs), {i["name"]: i["dtype"] for i in infos})
    shapes = {i["name"]: tuple(sess.buckets[bucket][i["name"]]) for i in infos}
    rand = random_inputs({k: v for k, v in shapes.items() if k not in given}, {i["name"]: i["dtype"] for i in infos},
                         manifest_ranges(sess.bundle.manifest), seed, run_shapes=shapes)
    return {**rand, **given}


@main.command()
@click.argument("bundle", type=click.Path(dir_okay=False))
@click.option("--backend", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="auto: the GPU when there is one, else the CPU backend (it says which).")
@click.option("--input", "inputs", multiple=True, metavar="NAME=FILE.npy|NAME=NUMBER",
              help="Feed an input from a .npy file, or a scalar input its value (others are random, within the "
                   "ranges the model declares).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Seed for random inputs.")
@click.option("--save", type=click.Path(file_okay=False), help="Write each output as NAME.npy into this folder.")
@click.option("--device", default=0, show_default=True, type=click.IntRange(min=0),
              help="GPU ordinal for the CUDA backend (as nvidia-smi numbers them, within CUDA_VISIBLE_DEVICES).")
@shape_options
def run(bundle, backend, inputs, seed, save, device, shapes, dims, values, bounds):
    """Run a BUNDLE (or an .onnx file, compiled on the fly) once and summarize its outputs.

    Inputs not given with --input are random: floats ~ N(0,1), token ids within the vocabulary.
    """
    from ..runtime.devices import resolve_backend
    backend, why = resolve_backend(backend, device)
    click.echo(f"running on the {why}")
    sess, bucket = _load_session(bundle, backend, shapes, dims, values, device=device, bounds=bounds)
    feeds = _feeds(sess, inputs, seed, bucket)
    t0 = time.perf_counter()
    outs = sess.run(feeds)
    dt = time.perf_counter() - t0
    from ..bundle.inputs import summarize
    click.echo(f"ran {os.path.basename(bundle)} on the {backend} backend in {dt * 1e3:.1f} ms")
    for name, a in feeds.items():
        click.echo("  input  " + summarize(name, a))
    for name, a in outs.items():
        click.echo("  output " + summarize(name, a))
    if save:
        os.makedirs(save, exist_ok=True)
        for name, a in outs.items():
            np.save(os.path.join(save, name.replace("/", "_") + ".npy"), a)


@main.command()
@click.argument("bundle", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the manifest and plan summaries as JSON.")
@click.option("--fusion", "fusion", is_flag=True, help="Show the planner's account instead: every fusion group "
              "(step; a/b: step b of the body of the If/Loop at step a) with its stitch scheme, thread mapping and "
              "estimated time, and the mappings that lost.")
@click.option("--schedule", "schedule", is_flag=True, help="Show the stream scheduler's account instead: the "
              "parallel branches and launch order it chose, why, the schedules it weighed, and a picture of the "
              "simulated timeline (grapec bench --timeline measures it on a GPU).")
def inspect(bundle, as_json, fusion, schedule):
    """Show what a BUNDLE holds: inputs, outputs, buckets, kernels, arena, ops."""
    from ..bundle.format import Bundle
    b = Bundle.read(bundle)
    from .show import show_bundle
    try:
        show_bundle(bundle, b, as_json, fusion, schedule)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        # the reports are the compiler's notes, not checked at load (bundle/schema.py checks what runs)
        raise BundleError(f"{bundle}: corrupted manifest: its reports cannot be shown "
                          f"({type(e).__name__}: {e})") from None


def _int8_ops(model_path) -> list:
    import onnx
    ops = {n.op_type for n in onnx.load(model_path, load_external_data=False).graph.node}
    return sorted(ops & {"QLinearConv", "QLinearMatMul", "MatMulInteger", "ConvInteger"})


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@shape_options
@click.option("--backend", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@precision_option
@click.option("--atol", type=Tolerance(), default=None, help="Absolute tolerance per element [default: 1e-4 fp32, "
              "1e-3 tf32, 1e-2 fp16, 3e-2 bf16].")
@click.option("--rtol", type=Tolerance(), default=None, help="Relative tolerance per element: an element passes when "
              "|out-ref| <= atol + rtol*|ref| [default: 1e-3 fp32, 1e-2 tf32 and fp16, 3e-2 bf16].")
@click.option("--input", "inputs", multiple=True, metavar="NAME=FILE.npy|NAME=NUMBER",
              help="Feed an input from a .npy file (its shape sets the input's shape), or a scalar input its "
                   "value; others are random, within the ranges the model declares (token ids within the vocabulary).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Seed for random inputs.")
@click.option("--reference", type=click.Choice(["onnxruntime", "onnxruntime-cuda", "onnx"]), default="onnxruntime",
              show_default=True,
              help="What computes the expected outputs (in fp32): onnxruntime's CPU provider, its CUDA provider "
                   "(onnxruntime-gpu, TF32 off), or onnx.reference (numpy; exact integer arithmetic, for int8 models "
                   "where onnxruntime's x86 u8s8 kernels saturate).")
@click.option("-q", "--quiet", is_flag=True, help="No progress messages.")
def check(model, shapes, dims, values, bounds, backend, precision, calibration_inputs, calibration_dims, precision_tolerance,
          atol, rtol, inputs,
          seed, reference, quiet):
    """Compile MODEL, run it, and compare with onnxruntime (CPU, fp32) on the same inputs.

    Per output it prints the max-abs error, the max-rel error and ||out-ref||/||ref||. An output
    passes when every element is within atol + rtol*|ref| (allclose, as polygraphy judges), so
    outputs near zero are judged fairly. In fp16/bf16 an output passes when ||out-ref||/||ref|| <= t
    (t: 1e-2 fp16, 3e-2 bf16, or --precision-tolerance), the measure compile's calibration accepted
    the model by (with a margin); elements outside allclose are counted, and judged only where
    --atol/--rtol are given. Exit 0 when all pass, 1 on a mismatch.
    """
    from .check import REFERENCES, check_limits, check_model
    from ..frontend.shapes import parse_bounds, parse_dims
    from ..bundle.inputs import load_calibration_inputs, load_npy_inputs
    say = None if quiet else (lambda m: click.echo(f"[grapec] {m}", err=True))
    given_atol, given_rtol = atol, rtol
    atol, rtol, max_rel_l2 = check_limits(precision, precision_tolerance, atol, rtol)
    shape_args, dim_args, value_args = _parse(shapes, dims, values)
    results, t_run = check_model(model, shape_args, dim_args, backend, given_rtol, seed, say, precision=precision,
                                 atol=given_atol,
                                 inputs=load_npy_inputs(list(inputs)), values=value_args,
                                 calibration_inputs=load_calibration_inputs(calibration_inputs),
                                 calibration_dims=parse_dims(calibration_dims, "--calibration-dim") or None,
                                 precision_tolerance=precision_tolerance, reference=reference,
                                 bounds=parse_bounds(bounds))
    click.echo(f"{'output':32s} {'shape':>18s} {'max-abs':>10s} {'max-rel':>10s} {'rel-L2':>10s}")
    for r in results:
        click.echo(f"{r.name:32s} {str(list(r.shape)):>18s} {r.max_abs:10.3g} {r.max_rel:10.3g} {r.rel:10.3g} "
                   f"{'ok' if r.ok else 'MISMATCH'} {r.note}".rstrip())
    bad = sum(not r.ok for r in results)
    measure = f"atol {atol:g}, rtol {rtol:g}" if max_rel_l2 is None else f"rel-L2 {max_rel_l2:g}"
    if max_rel_l2 is not None and (given_atol is not None or given_rtol is not None):
        measure += f", atol {atol:g}, rtol {rtol:g}"
    verdict = "PASS" if not bad else f"FAIL ({bad} output(s) outside {measure})"
    if bad and reference == "onnxruntime" and _int8_ops(model):
        click.echo(f"note: the model has {', '.join(_int8_ops(model))}; onnxruntime's x86 u8s8 kernels saturate "
                   "intermediate sums, so it can be the one that is off: compare with --reference onnx", err=True)
    click.echo(f"{verdict}: {os.path.basename(model)} in {precision} on the {backend} backend ({t_run * 1e3:.0f} ms) "
               f"vs {REFERENCES[reference]} (fp32), {measure}")
    sys.exit(1 if bad else 0)


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@shape_options
@click.option("--iterations", default=200, show_default=True, help="Timed replays.")
@click.option("--warmup", default=20, show_default=True, help="Untimed replays first.")
@click.option("--vs", "peers", multiple=True, type=click.Choice(["torch", "ort", "host-control", "serial"]),
              help="Also measure peers in the same process (repeatable). torch: PyTorch eager, CUDA graph and "
                   "torch.compile on the same weights (zoo models). ort: onnxruntime's CUDA provider, plain and "
                   "with its CUDA graph mode (needs onnxruntime-gpu and MODEL as .onnx). host-control: the same "
                   "model compiled with --host-control (If/Loop decided on the host between graph launches; "
                   "MODEL as .onnx). serial: the same model compiled with --serial (one chain, no parallel "
                   "branches; MODEL as .onnx).")
@click.option("--zoo", "zoo_name", metavar="NAME:SIZE", help="The zoo builder for --vs torch, e.g. gpt2:full "
              "[default: from the file name and its folder, models/<size>/<name>.onnx].")
@precision_option
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Seed for random inputs.")
@click.option("--input", "inputs", multiple=True, metavar="NAME=FILE.npy|NAME=NUMBER",
              help="Feed an input from a .npy file, or a scalar input its value, e.g. --input max_new_tokens=128 "
                   "(others are random, within the ranges the model declares).")
@click.option("--fusion", type=click.Choice(["full", "rules", "none"]), default="full", show_default=True,
              help="For an .onnx MODEL: how much to fuse (see grapec compile --help).")
@click.option("--conv", type=click.Choice(["auto", "cudnn", "gemm"]), default="auto", show_default=True,
              help="For an .onnx MODEL: how convolutions run (see grapec compile --help).")
@click.option("--attention", type=click.Choice(["auto", "kernel", "cudnn"]), default="auto", show_default=True,
              help="For an .onnx MODEL: how fused attention runs (see grapec compile --help).")
@click.option("--grid-stitch", type=click.Choice(["auto", "on", "off"]), default="auto", show_default=True,
              help="For an .onnx MODEL: runs of short kernels as one cooperative kernel (see grapec compile --help).")
@click.option("--half-outputs", is_flag=True, help="For an .onnx MODEL with --precision fp16/bf16: float32 outputs "
              "given in half (see grapec compile --help).")
@click.option("--device-profile", default="h100", show_default=True, metavar="NAME|FILE", help=PROFILE_HELP)
@click.option("--per-step", default=0, metavar="N", help="Also time every step alone (as its graph node, "
              "launch gap included) and show the N costliest, with their ONNX nodes; the steps' sum is shown "
              "against one replay. A size of a range that runs its band's exec: every node of that exec, timed "
              "alone in it, with its kernel's name.")
@branch_options
@click.option("--timeline", is_flag=True, help="Also measure when each step runs in a replay (event record nodes "
              "around every step) and draw it, one row per parallel branch: compare with the simulated timeline "
              "of grapec inspect --schedule.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
def bench(model, shapes, dims, values, bounds, iterations, warmup, peers, zoo_name, precision, calibration_inputs, calibration_dims,
          precision_tolerance, seed, inputs, fusion, conv, attention, grid_stitch, half_outputs, device_profile, per_step,
          serial,
          max_branches, timeline, as_json):
    """GPU time of a MODEL (.onnx, compiled here, or .grape): median / p90 / p99 of one CUDA-graph
    replay, host-to-device and device-to-host apart, and device memory; with --vs torch the peers
    in the same process on the same GPU, with ratios."""
    from .bench import bench_grapec, bench_ort, bench_torch, ort_cuda_available, zoo_module
    from ..runtime.devices import gpu_count
    if "ort" in peers:
        ok, providers = ort_cuda_available()
        if not ok:
            raise GrapecError("--vs ort: onnxruntime's CUDA provider is not installed here (providers: "
                              f"{', '.join(providers) or 'onnxruntime not installed'}); pip install onnxruntime-gpu")
    for peer in ("ort", "host-control", "serial"):
        if peer in peers and not model.endswith(".onnx"):
            raise GrapecError(f"--vs {peer} needs the ONNX model: give MODEL as the .onnx file, not a bundle")
    if not gpu_count():
        raise GrapecError("grapec bench needs an NVIDIA GPU (none found)")
    import grapec
    from ..bundle.format import Bundle
    shape_args, dim_args, value_args = _parse(shapes, dims, values)
    from ..frontend.shapes import parse_bounds, parse_dims
    from ..bundle.inputs import load_calibration_inputs
    calib = load_calibration_inputs(calibration_inputs)
    options = dict(shapes=shape_args, dims=dim_args, precision=precision, values=value_args, calibration_inputs=calib,
                   calibration_dims=parse_dims(calibration_dims, "--calibration-dim") or None,
                   precision_tolerance=precision_tolerance, fusion=fusion, conv=conv, attention=attention, grid_stitch=grid_stitch,
                   half_outputs=half_outputs, device_profile=device_profile, bounds=parse_bounds(bounds) or None)
    bundle = grapec.compile(model, max_branches=branch_count(serial, max_branches), **options) \
        if model.endswith(".onnx") else Bundle.read(model)
    precision = bundle.manifest.get("precision", "fp32")
    cpu = grapec.load(bundle, backend="cpu")
    feeds = _feeds(cpu, inputs, seed, 0 if model.endswith(".onnx") else _bucket_for(cpu, shapes, dims))
    cpu.check_feeds(feeds)   # bad --input: a clear error before any GPU work
    res = {"grapec": bench_grapec(bundle, feeds, iterations, warmup, per_step=per_step > 0, timeline=timeline)}
    if "torch" in peers:
        name, _, size = (zoo_name or "").partition(":")
        if not zoo_name:
            name = os.path.splitext(os.path.basename(model))[0]
            size = os.path.basename(os.path.dirname(os.path.abspath(model)))
        try:
            module = zoo_module(name, size or "full")
        except Exception as e:  # noqa: BLE001
            raise GrapecError(f"--vs torch needs the zoo builder of the model (--zoo NAME:SIZE): {e}") from None
        say = None if as_json else (lambda m: click.echo(f"[grapec] {m}", err=True))
        res.update(bench_torch(module, feeds, iterations, warmup, say=say, precision=precision))
    if "ort" in peers:
        res.update(bench_ort(model, {**cpu.fixed_inputs, **feeds}, iterations, warmup, precision))
    if "host-control" in peers:
        host = grapec.compile(model, host_control=True, **options)
        h = bench_grapec(host, feeds, iterations, warmup)
        res[f"grapec --host-control ({h['launches']} launches)"] = h["replay"]
    if "serial" in peers:
        res["grapec --serial (one chain)"] = bench_grapec(grapec.compile(model, max_branches=1, **options), feeds,
                                                          iterations, warmup)["replay"]
    if as_json:
        click.echo(json.dumps(res, indent=1))
        return
    g = res["grapec"]
    click.echo(f"{os.path.basename(model)} in {precision} on {g['device']} ({g['code']}), {g['replay']['n']} replays "
               f"after {warmup} warm-up")
    if g["exec"]:
        click.echo(f"  runs {g['exec']}")
    click.echo(f"  H2D {g['h2d']['median_ms'] * 1e3:.1f} us, D2H {g['d2h']['median_ms'] * 1e3:.1f} us (median); "
               f"device memory {g['device_memory_mib']:.1f} MiB (arena {g['arena_mib']:.1f}, weights {g['weights_mib']:.1f})")
    launches = f"{g['launches']} graph launch" + ("es" if g["launches"] != 1 else "")
    rows = [(f"grapec ({launches})", g["replay"])] + [(k, v) for k, v in res.items()
                                                         if not k.startswith("_") and k != "grapec"]
    if "generated" in g:
        from .bench import generation_table
        click.echo("\n".join(generation_table(g, rows)))
    else:
        click.echo(f"{'':36s} {'median ms':>10s} {'p90':>8s} {'p99':>8s} {'vs grapec':>10s}")
        base = g["replay"]["median_ms"]
        for label, st in rows:
            click.echo(f"{label:36s} {st['median_ms']:10.4f} {st['p90_ms']:8.4f} {st['p99_ms']:8.4f} {st['median_ms'] / base:9.2f}x")
    for k, v in res.items():
        if k.startswith("_") and k.endswith(" error"):
            click.echo(f"peer failed: {k[1:-len(' error')]}: {v}")
    if per_step and "nodes" in g:
        _print_nodes(g["nodes"], g["replay"]["median_ms"], per_step)
    elif per_step:
        _print_steps(g["steps"], g["replay"]["median_ms"], per_step)
    if timeline:
        from ..cost.timeline import Span, render
        click.echo(render([Span(**s) for s in g["timeline"]], title="measured timeline (event record nodes "
                          "around each step lengthen it; the replay time above is without them):"))


@main.command()
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="Profile file to write [default: grapec-profile-<gpu>.json in the current folder].")
@click.option("--name", help="The profile's name [default: the GPU model, e.g. h100].")
@click.option("--device", default=0, show_default=True, help="GPU ordinal to measure.")
@click.option("--save-samples", type=click.Path(dir_okay=False), help="Also write every measured kernel's work "
              "and time (JSON), to study the fit offline.")
@click.option("--from-samples", type=click.Path(exists=True, dir_okay=False), help="Refit a profile from samples an "
              "earlier run saved (--save-samples), without a GPU: after a change to the cost model's features.")
@click.option("-q", "--quiet", is_flag=True, help="No progress messages.")
def calibrate(output, name, device, save_samples, from_samples, quiet):
    """Measure this GPU for the cost model and write a device profile (needs a GPU, about a minute).

    \b
    A calibration model of ~120 kernels (element-wise, LayerNorm, softmax, reductions, gathers,
    GEMMs, attention) is compiled, each of its steps is timed alone as a CUDA-graph node, and the
    cost model's coefficients are fitted to the times. Use the profile when compiling for this GPU,
    on any machine:

    \b
      grapec calibrate -o h100.json            # on the GPU machine
      grapec compile model.onnx --device-profile h100.json
    """
    from .calibrate import calibrate as run_calibration, refit
    from ..runtime.devices import gpu_count
    if from_samples:
        profile = refit(from_samples, name)
    elif not gpu_count():
        raise GrapecError("calibrate measures a GPU, and no NVIDIA GPU was found here; "
                          f"compile with a shipped profile instead (--device-profile {', '.join(_profiles())})")
    else:
        say = (lambda *_: None) if quiet else (lambda msg: click.echo(f"[grapec] {msg}", err=True))
        profile = run_calibration(device, name, say, save_samples)
    out = output or f"grapec-profile-{profile.name}.json"
    profile.write(out)
    fit = ", ".join(f"{k} {v['median_error']:.0%} over {v['samples']}" for k, v in profile.measured["fit"].items())
    click.echo(f"wrote {out}: {profile.device}, {profile.sms} SMs; fit median error per kind: {fit}; "
               f"node gap {profile.node_gap_us:.2f} us")


def _profiles() -> list:
    from ..cost.device import shipped_profiles
    return shipped_profiles()


def _print_steps(steps: list, replay_ms: float, top: int):
    total = sum(s["us"] for s in steps)
    by_kind: dict = {}
    for s in steps:
        n, us = by_kind.get(s["kind"], (0, 0.0))
        by_kind[s["kind"]] = (n + 1, us + s["us"])
    click.echo(f"\nsteps alone: {len(steps)} steps, {total / 1e3:.4f} ms in all (one replay: {replay_ms:.4f} ms)")
    click.echo("  " + ", ".join(f"{k} {n} x {us / n:.1f} us = {us / 1e3:.3f} ms" for k, (n, us) in
                                sorted(by_kind.items(), key=lambda kv: -kv[1][1])))
    click.echo(f"{'step':>6s} {'us':>8s} {'share':>6s}  {'kind':12s} onnx nodes")
    for s in sorted(steps, key=lambda s: -s["us"])[:top]:
        click.echo(f"{s['index']:6d} {s['us']:8.2f} {s['us'] / total:6.1%}  {s['kind']:12s} {', '.join(s['origin'])}")


def _print_nodes(nodes: list, replay_ms: float, top: int):
    """A range family's size: each node of its band exec alone (runtime/cuda/profile.py profile_nodes)."""
    total = sum(n["us"] for n in nodes)
    click.echo(f"\nnodes alone (a range's size runs its band's exec: each node timed in it): {len(nodes)} nodes, "
               f"{total / 1e3:.4f} ms in all (one replay: {replay_ms:.4f} ms)")
    click.echo(f"{'node':>6s} {'us':>8s} {'share':>6s}  {'kind':7s} kernel")
    for n in sorted(nodes, key=lambda n: -n["us"])[:top]:
        click.echo(f"{n['index']:6d} {n['us']:8.2f} {n['us'] / total:6.1%}  {n['kind']:7s} {n['name'][:80]}")


def _parse(shapes, dims, values=()):
    from ..frontend.shapes import parse_dims, parse_shapes, parse_values
    return parse_shapes(list(shapes)), parse_dims(list(dims)), parse_values(values)


@main.command()
@click.argument("model", type=click.Path())
@click.option("--prompt-ids", "prompts", multiple=True, required=True, metavar="'ID ID ..'",
              help="A prompt's token ids (repeat for a batch; rows may differ in length).")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=None, metavar="N",
              help="Tokens to generate per row [default: the bundle's --generate N; 32 for an .onnx].")
@click.option("--eos-token-id", type=int, default=None,
              help="A row stops after this id; -1: never [default: the model's, from the genai_config.json "
                   "onnxruntime-genai's builder writes beside it, or HF's generation_config.json / config.json "
                   "(optimum's export), else never].")
@click.option("--backend", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="auto: the GPU when there is one, else the CPU backend (it says which).")
@click.option("--device", default=0, show_default=True, type=click.IntRange(min=0), help="GPU ordinal.")
@click.option("--dim", "dims", multiple=True, metavar="NAME=N,..",
              help="For an .onnx MODEL: a named dim of its KV cache (e.g. kv_cache_dim=64) or the bucket (batch, prompt).")
@click.option("--top-k", type=click.IntRange(min=1), default=None, metavar="K",
              help="For an .onnx MODEL: sample from the K most likely tokens instead of the greedy choice (a bundle "
                   "samples where it was compiled with --top-k).")
@click.option("--temperature", type=float, default=None, help="Sampling: the logits are divided by it [default: 1].")
@click.option("--top-p", type=float, default=None, help="Sampling: keep the most likely tokens up to this probability "
              "mass, in (0, 1] [default: 1, all top-k].")
@click.option("--seed", type=int, default=None, help="Sampling: the same seed gives the same tokens [default: 0].")
@click.option("--repeat", default=1, show_default=True, type=click.IntRange(1, 1000),
              help="Generate this many times and report the fastest (the first run builds the GPU graph).")
@click.option("--stream", is_flag=True,
              help="Print each row's tokens as the launch makes them ('row R: ids' per arrival; with --json a JSON "
                   "line {\"row\": R, \"tokens\": [..]} each, then the summary), read beside the running graph "
                   "(on the GPU an arrival may hold a few steps' tokens).")
@click.option("--json", "as_json", is_flag=True, help="Print the tokens and timings as JSON.")
@click.option("-q", "--quiet", is_flag=True, help="No progress messages.")
def generate(model, prompts, max_new_tokens, eos_token_id, backend, device, dims, top_k, temperature, top_p, seed,
             repeat, stream, as_json, quiet):
    """Greedy or sampled generation from token-id prompts with MODEL: a bundle compiled with --generate,
    or a decoder .onnx (onnxruntime-genai's builder, optimum, torch.onnx), or the folder either writes
    (its model.onnx), compiled here for these prompts.

    
    The whole loop (prompt, then a decode step per token into a KV cache allocated once, until
    --max-new-tokens or every row's --eos-token-id) runs as one launch: on the GPU, one CUDA graph
    whose conditional WHILE node steps through the tokens.
      grapec compile decoder.onnx --generate 128 --dim batch=1 --dim prompt=64 -o llama.grape
      grapec generate llama.grape --prompt-ids '1 15 8 99' --eos-token-id 2
      grapec generate llama.grape --prompt-ids '1 15 8 99' --stream   # tokens as they come
      grapec compile decoder.onnx --generate 128 --top-k 50 --dim batch=1 --dim prompt=64 -o sampled.grape
      grapec generate sampled.grape --prompt-ids '1 15 8 99' --temperature 0.8 --top-p 0.9 --seed 7
    """
    from .generate import generate_command
    generate_command(model, prompts, max_new_tokens, eos_token_id, backend, device, dims, top_k,
                     {"temperature": temperature, "top_p": top_p, "seed": seed}, repeat, stream, as_json, quiet)


@main.command("export-triton")
@click.argument("bundle", type=click.Path(dir_okay=False))
@click.argument("repo", type=click.Path(file_okay=False))
@click.option("--name", help="The model's name in the repository [default: the bundle's file name].")
@click.option("--backend", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="auto: cuda where the bundle has GPU code (one instance per GPU), else cpu.")
@click.option("--instances", default=1, show_default=True, type=click.IntRange(min=1),
              help="Instances per GPU (or of the CPU model): each is a process with its own copy of the bundle.")
@click.option("--overwrite", is_flag=True, help="Replace a model of that name in REPO (once the new one is complete).")
def export_triton(bundle, repo, name, backend, instances, overwrite):
    """Write BUNDLE as a Triton Inference Server model into the model repository REPO.

    \b
    REPO/NAME/config.pbtxt     inputs, outputs, dims (-1 where buckets or a --dynamic range vary)
    REPO/NAME/1/model.py       Python-backend model: loads the bundle once per instance
    REPO/NAME/1/model.grape    the bundle

    \b
    Serve it with a Triton whose Python has grapec installed, e.g.:
      tritonserver --model-repository REPO
      curl localhost:8000/v2/models/NAME/config
    """
    from ..serve.triton import export_triton as export
    path = export(bundle, repo, name, backend, instances, overwrite)
    click.echo(f"wrote {path} (config.pbtxt, 1/model.py, 1/model.grape)")


if __name__ == "__main__":
    main()
