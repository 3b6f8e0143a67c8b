"""Build the grapec model zoo as ONNX files.

    python models/build.py --size tiny --out models/tiny            # all models
    python models/build.py --size full --out models/full gpt2 bert  # some models
    python models/build.py --list

Weights are seeded random (no downloads).  Needs torch, transformers and onnxscript for the torch
models (``pip install -e .[zoo]``); control_flow needs only numpy + onnx.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import zoo  # noqa: E402


def _quiet_torch_logs() -> None:
    """The exporter logs every step and warns about the opset and torchvision; keep the progress readable."""
    import logging

    warnings.filterwarnings("ignore")
    try:
        import torch  # noqa: F401  (importing torch resets its loggers' levels, so import first)
    except ImportError:
        return
    for name in ("torch", "torch.onnx", "torch.export", "torch._dynamo", "torch.fx", "onnxscript"):
        logging.getLogger(name).setLevel(logging.ERROR)


def markdown_tables(folder: str, names: list[str]) -> str:
    """Markdown: one row per model (inputs, outputs, size), then op type x model (node counts)."""
    import onnx

    type_names = {v: k for k, v in onnx.TensorProto.DataType.items()}

    def sig(values):
        parts = []
        for v in values:
            t = v.type.tensor_type
            dims = ", ".join(d.dim_param or str(d.dim_value) for d in t.shape.dim) or "scalar"
            parts.append(f"`{v.name}` {type_names[t.elem_type].lower()} [{dims}]")
        return "<br>".join(parts)

    models, ops = {}, {}
    lines = ["| model | inputs | outputs | file | nodes |", "|---|---|---|---|---|"]
    for name in names:
        path = os.path.join(folder, f"{name}.onnx")
        m = onnx.load(path, load_external_data=False)
        models[name] = zoo.op_types(m)
        for op in models[name]:
            ops.setdefault(op, None)
        size = os.path.getsize(path) + (os.path.getsize(path + ".data") if os.path.exists(path + ".data") else 0)
        lines.append(f"| {name} | {sig(m.graph.input)} | {sig(m.graph.output)} | {size / 1e6:.2f} MB "
                     f"| {sum(models[name].values())} |")
    lines += ["", "| op | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for op in sorted(ops):
        lines.append(f"| {op} | " + " | ".join(str(models[n].get(op, "")) for n in names) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help=f"models to build (default: all of {', '.join(zoo.MODELS)})")
    ap.add_argument("--size", choices=zoo.SIZES, default="tiny")
    ap.add_argument("--out", help="output folder (default: models/<size>)")
    ap.add_argument("--seed", type=int, default=zoo.SEED)
    ap.add_argument("--ops", action="store_true", help="also print the op types of each model")
    ap.add_argument("--list", action="store_true", help="list the zoo models and exit")
    ap.add_argument("--table", metavar="DIR", help="print markdown tables (inputs, sizes, op types) of the "
                    "built models in DIR and exit (used for models/README.md)")
    args = ap.parse_args(argv)

    if args.list:
        for name, fn in zoo.MODELS.items():
            print(f"{name:14s} {(fn.__doc__ or '').strip().splitlines()[0]}")
        return 0
    if args.table:
        print(markdown_tables(args.table, args.names or list(zoo.MODELS)))
        return 0
    names = args.names or list(zoo.MODELS)
    unknown = [n for n in names if n not in zoo.MODELS]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(zoo.MODELS)}")
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), args.size)
    _quiet_torch_logs()

    import onnx

    total = time.time()
    failed = []
    for name in names:
        t = time.time()
        print(f"[{name}] building ({args.size}) ...", flush=True)
        try:
            zm = zoo.get(name, args.size, seed=args.seed)
            path = zm.export(os.path.join(out, f"{name}.onnx"))
        except Exception as exc:  # keep going, report at the end
            print(f"[{name}] FAILED: {type(exc).__name__}: {exc}", flush=True)
            failed.append(name)
            continue
        size = os.path.getsize(path)
        data = path + ".data"
        if os.path.exists(data):
            size += os.path.getsize(data)
        print(f"[{name}] {path}  {size / 1e6:.2f} MB  {time.time() - t:.1f} s", flush=True)
        if args.ops:
            ops = zoo.op_types(onnx.load(path, load_external_data=False))
            print(f"[{name}] ops: {', '.join(ops)}", flush=True)
    print(f"done: {len(names) - len(failed)}/{len(names)} models in {time.time() - total:.1f} s", flush=True)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
