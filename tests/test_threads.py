"""One session, many threads: runs share one arena, so the session serialises them. Every output
of 8 threads x 50 runs must equal the single-threaded output for the same input, bit for bit."""
import os
import threading

import numpy as np
import pytest

import grapec
from grapec.bundle.format import Bundle

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPT2 = os.path.join(ROOT, "models", "tiny", "gpt2.onnx")
THREADS, RUNS = 8, 50


def hammer(sess, feeds_per_thread, refs):
    """Run each thread's own inputs RUNS times from THREADS threads; return the mismatches seen."""
    wrong, errors = [], []
    start = threading.Barrier(THREADS)

    def worker(t):
        try:
            start.wait()
            for i in range(RUNS):
                out = sess.run(feeds_per_thread[t])
                for name, ref in refs[t].items():
                    if not np.array_equal(out[name], ref):
                        wrong.append((t, i, name))
        except Exception as e:  # noqa: BLE001 - reported below with the thread that hit it
            errors.append((t, repr(e)))
    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return wrong, errors


def session_and_feeds(backend):
    targets = [] if backend == "cpu" else "auto"
    bundle = grapec.compile(GPT2, dims={"batch": 1, "seq": 8}, targets=targets)
    sess = grapec.load(Bundle.from_bytes(bundle.to_bytes()), backend=backend)
    vocab = sess.bundle.manifest["inputs"][0]["value_range"]["hi"] + 1    # token ids within the vocabulary
    rng = np.random.default_rng(7)
    feeds = [{"input_ids": rng.integers(0, vocab, (1, 8), dtype=np.int64)} for _ in range(THREADS)]
    refs = [sess.run(f) for f in feeds]
    assert not np.array_equal(refs[0]["logits"], refs[1]["logits"])   # the threads' answers differ
    return sess, feeds, refs


def test_eight_threads_one_session_cpu():
    sess, feeds, refs = session_and_feeds("cpu")
    wrong, errors = hammer(sess, feeds, refs)
    assert not errors, errors
    assert not wrong, f"{len(wrong)} of {THREADS * RUNS} runs gave another thread's or a torn answer: {wrong[:5]}"


@pytest.mark.gpu
def test_eight_threads_one_session_cuda():
    sess, feeds, refs = session_and_feeds("cuda")
    wrong, errors = hammer(sess, feeds, refs)
    assert not errors, errors
    assert not wrong, f"{len(wrong)} of {THREADS * RUNS} runs wrong: {wrong[:5]}"
