"""One session, many threads; several sessions in one process; a session on GPU N.

A session runs `concurrency` runs at once, each on its own runner (arena, and on the GPU its own
stream, cuBLASLt workspaces and graphs) over one copy of the weights. Every output of 8 threads x 50
runs must equal the single-threaded output for the same input, bit for bit: a runner shared by two
runs at once, or a workspace shared by two runners, gives torn or foreign answers."""
import os
import threading

import numpy as np
import pytest

import grapec
from grapec.bundle.format import Bundle
from grapec.errors import InputError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPT2 = os.path.join(ROOT, "models", "tiny", "gpt2.onnx")
BERT = os.path.join(ROOT, "models", "tiny", "bert.onnx")
THREADS, RUNS = 8, 50


def hammer(jobs, threads=THREADS, runs=RUNS):
    """jobs: [(session, feeds, refs)], one per thread: run each RUNS times at once; -> (mismatches, errors)."""
    wrong, errors = [], []
    start = threading.Barrier(threads)

    def worker(t):
        sess, feeds, refs = jobs[t]
        try:
            start.wait()
            for i in range(runs):
                out = sess.run(feeds)
                for name, ref in refs.items():
                    if not np.array_equal(out[name], ref):
                        wrong.append((t, i, name))
        except Exception as e:  # noqa: BLE001 - reported below with the thread that hit it
            errors.append((t, repr(e)))
    workers = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for th in workers:
        th.start()
    for th in workers:
        th.join()
    return wrong, errors


def bundle_of(model, backend, dims):
    targets = [] if backend == "cpu" else "auto"
    return Bundle.from_bytes(grapec.compile(model, dims=dims, targets=targets).to_bytes())


def token_feeds(sess, n, seed, names=("input_ids",)):
    """n sets of random token ids within the vocabulary, one per thread."""
    inputs = {i["name"]: i for i in sess.bundle.manifest["inputs"]}
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        feeds = {}
        for name, info in inputs.items():
            shape = tuple(sess.buckets[0][name])
            if name in names:
                feeds[name] = rng.integers(0, info["value_range"]["hi"] + 1, shape, dtype=np.int64)
            else:   # attention masks and the like: all ones
                feeds[name] = np.ones(shape, np.int64)
        out.append(feeds)
    return out


def jobs_for(sess, seed):
    feeds = token_feeds(sess, THREADS, seed)
    refs = [sess.run(f) for f in feeds]
    first = sess.get_outputs()[0].name
    assert not np.array_equal(refs[0][first], refs[1][first])   # the threads' answers differ
    return [(sess, f, r) for f, r in zip(feeds, refs)]


def check_hammer(jobs):
    wrong, errors = hammer(jobs)
    assert not errors, errors
    assert not wrong, f"{len(wrong)} of {THREADS * RUNS} runs gave another thread's or a torn answer: {wrong[:5]}"


@pytest.mark.parametrize("concurrency", [1, 4])
def test_eight_threads_one_session_cpu(concurrency):
    b = bundle_of(GPT2, "cpu", {"batch": 1, "seq": 8})
    check_hammer(jobs_for(grapec.load(b, backend="cpu", concurrency=concurrency), 7))


@pytest.mark.parametrize("concurrency", [1, 3])
def test_runs_in_flight_never_exceed_concurrency_and_reach_it(concurrency):
    """Each runner is used by one run at a time, and with enough threads all of them are used at once."""
    b = bundle_of(GPT2, "cpu", {"batch": 1, "seq": 8})
    sess = grapec.load(b, backend="cpu", concurrency=concurrency)
    assert len({id(r.arena) for r in sess._runners}) == concurrency   # an arena each
    assert all(r.kernels is sess._runners[0].kernels for r in sess._runners)   # one copy of the code
    jobs = jobs_for(sess, 11)   # the references, before the runners are watched
    lock, busy, seen = threading.Lock(), set(), {"most": 0, "shared": 0}
    all_in = threading.Event()   # the first runs wait until `concurrency` of them are in at once

    for r in sess._runners:
        def run(bucket, feeds, _real=r.run, _r=r, **kw):
            with lock:
                seen["shared"] += _r in busy
                busy.add(_r)
                seen["most"] = max(seen["most"], len(busy))
                if seen["most"] == concurrency:
                    all_in.set()
            try:
                all_in.wait(timeout=10)
                return _real(bucket, feeds, **kw)
            finally:
                with lock:
                    busy.discard(_r)
        r.run = run
    wrong, errors = hammer(jobs, runs=5)
    assert not errors and not wrong, (errors, wrong[:3])
    assert seen["shared"] == 0
    assert seen["most"] == concurrency


def test_a_closed_session_says_so():
    from grapec.errors import BackendError
    sess = grapec.load(bundle_of(GPT2, "cpu", {"batch": 1, "seq": 8}), backend="cpu", concurrency=2)
    feeds = token_feeds(sess, 1, 2)[0]
    sess.run(feeds)
    sess.close()
    with pytest.raises(BackendError, match="closed"):
        sess.run(feeds)


@pytest.mark.parametrize("bad", [0, -1, "2", 1.5, True])
def test_concurrency_must_be_a_positive_whole_number(bad):
    b = bundle_of(GPT2, "cpu", {"batch": 1, "seq": 8})
    with pytest.raises(InputError, match="concurrency must be"):
        grapec.load(b, backend="cpu", concurrency=bad)


def test_several_arenas_are_checked_against_host_memory(monkeypatch):
    from grapec.errors import BackendError
    from grapec.runtime.cpu import runner as cpu_runner
    b = bundle_of(GPT2, "cpu", {"batch": 1, "seq": 8})
    arena = b.largest_arena()
    monkeypatch.setattr(cpu_runner, "host_memory_available", lambda: 3 * arena)
    grapec.load(b, backend="cpu", concurrency=3)
    with pytest.raises(BackendError, match="4 activation arenas"):
        grapec.load(b, backend="cpu", concurrency=4)


@pytest.mark.gpu
@pytest.mark.parametrize("concurrency", [1, 4])
def test_eight_threads_one_session_cuda(concurrency):
    b = bundle_of(GPT2, "cuda", {"batch": 1, "seq": 8})
    sess = grapec.load(b, backend="cuda", concurrency=concurrency)
    check_hammer(jobs_for(sess, 7))
    assert len({r.stream for r in sess._runners}) == concurrency
    sess.close()


@pytest.mark.gpu
def test_two_sessions_of_two_models_in_threads_at_once():
    """Sessions share the process's cuBLASLt handle and its tuned GEMMs, never a workspace."""
    gpt2 = grapec.load(bundle_of(GPT2, "cuda", {"batch": 1, "seq": 64}), backend="cuda", concurrency=2)
    bert = grapec.load(bundle_of(BERT, "cuda", {"batch": 1, "seq": 64}), backend="cuda", concurrency=2)
    jobs = jobs_for(gpt2, 3)[:THREADS // 2] + jobs_for(bert, 4)[:THREADS // 2]
    check_hammer(jobs)
    workspaces = [p for s in (gpt2, bert) for r in s._runners for p in r.workspaces.ptrs]
    assert workspaces and len(set(workspaces)) == len(workspaces)
    gpt2.close()
    bert.close()


@pytest.mark.gpu
def test_input_buffer_needs_one_arena():
    sess = grapec.load(bundle_of(GPT2, "cuda", {"batch": 1, "seq": 8}), backend="cuda", concurrency=2)
    with pytest.raises(InputError, match="io_binding"):
        sess.input_buffer("input_ids")
    sess.close()


@pytest.mark.gpu
def test_a_device_that_is_not_there_is_named():
    from grapec.runtime.devices import gpu_count
    from grapec.errors import BackendError
    n = gpu_count()
    with pytest.raises(BackendError, match=f"device {n}: this machine has {n} CUDA device"):
        grapec.load(bundle_of(GPT2, "cuda", {"batch": 1, "seq": 8}), backend="cuda", device=n)


@pytest.mark.gpu
@pytest.mark.device_memory
def test_every_gpu_runs_the_bundle_on_its_own_memory():
    """device=N puts the weights and arena on GPU N (its free memory drops, the others' does not) and
    gives GPU 0's answers; sessions on all GPUs run at once from threads."""
    from grapec.runtime.devices import gpu_count
    from grapec.runtime.cuda.driver import Device
    n = gpu_count()
    if n < 2:
        pytest.skip("one GPU here; device=N needs a machine with several (run on nvidia-h200-x2)")
    b = bundle_of(GPT2, "cuda", {"batch": 1, "seq": 64})
    devices = [Device(i) for i in range(n)]
    sessions = []
    for i in range(n):
        before = [d.mem_info()[0] for d in devices]
        sessions.append(grapec.load(b, backend="cuda", device=i))
        after = [d.mem_info()[0] for d in devices]
        dropped = [(x - y) for x, y in zip(before, after)]
        assert dropped[i] >= len(b.weights) + b.largest_arena(), (i, dropped)
        assert all(abs(d) < 2**20 for j, d in enumerate(dropped) if j != i), (i, dropped)
    feeds = token_feeds(sessions[0], 1, 5)[0]
    ref = sessions[0].run(feeds)
    for i, s in enumerate(sessions[1:], 1):
        got = s.run(feeds)
        for k in ref:
            np.testing.assert_allclose(got[k], ref[k], rtol=1e-5, atol=1e-5, err_msg=f"GPU {i}, output {k}")
    jobs = []
    for s in sessions:
        jobs += jobs_for(s, 9)[:THREADS // n]
    wrong, errors = hammer(jobs, threads=len(jobs))
    assert not errors, errors
    assert not wrong, wrong[:5]
    for s in sessions:
        s.close()
