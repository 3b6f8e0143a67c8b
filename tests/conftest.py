import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))


def pytest_collection_modifyitems(config, items):
    from grapec.runtime.devices import cuda_backend_available, gpu_count
    if gpu_count() and cuda_backend_available():
        return
    why = "no NVIDIA GPU here" if not gpu_count() else "cuda-bindings or nvmath-python not installed"
    skip = pytest.mark.skip(reason=f"gpu test: {why}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    rep = yield
    if rep.when == "call":
        item.rep_call = rep
    return rep


def pytest_configure(config):
    config.addinivalue_line("markers", "no_round_trip(reason): the bundles this test compiles are not written, "
                                       "loaded and run again after it (say why)")
    config.addinivalue_line("markers", "device_memory: reads the device's free memory, so it runs alone among "
                                       "this machine's GPU tests (pytest -n runs the others in other processes)")


GPU_LOCK = os.path.join(os.environ.get("TMPDIR", "/tmp"), "grapec-gpu-tests.lock")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """cuMemGetInfo counts every process on the device: a test that reads it takes this lock alone, every
    other GPU test shares it. The whole protocol is inside it, since module fixtures allocate in setup."""
    if "gpu" not in item.keywords or item.get_closest_marker("skip"):
        return (yield)
    import fcntl
    with open(GPU_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if "device_memory" in item.keywords else fcntl.LOCK_SH)
        try:
            return (yield)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(autouse=True)
def every_bundle_loads(request, monkeypatch, tmp_path):
    """Every bundle a test compiles in this process is written to a file, loaded again and run on
    the CPU backend after the test: a bundle the compiler writes and the loader refuses (a manifest
    the schema check rejects) fails the test that made it."""
    import grapec.compiler
    marker = request.node.get_closest_marker("no_round_trip")
    if marker is not None:
        assert marker.args, "no_round_trip needs a reason"
        yield
        return
    made = []
    compile_model = grapec.compiler.compile_model

    def recording(*args, **kwargs):
        bundle = compile_model(*args, **kwargs)
        made.append(bundle.to_bytes())   # as compiled: some tests go on to corrupt the bundle on purpose
        return bundle
    monkeypatch.setattr(grapec.compiler, "compile_model", recording)
    yield
    monkeypatch.undo()
    call = getattr(request.node, "rep_call", None)
    if call is not None and call.passed:   # a failed or skipped test has said what it had to say
        _round_trip(made, tmp_path)


def _round_trip(bundles, tmp_path):
    import numpy as np
    import grapec
    from grapec.bundle.inputs import bundle_inputs
    from grapec.bundle.format import Bundle
    for k, data in enumerate(bundles):
        path = tmp_path / f"round_trip_{k}.grape"
        path.write_bytes(data)
        bundle = Bundle.read(str(path))
        sess = grapec.load(bundle, backend="cpu")
        last = len(bundle.manifest["buckets"]) - 1
        for bucket in sorted({0, last}):
            outs = sess.run(bundle_inputs(bundle.manifest, bucket, seed=bucket))
            assert set(outs) == {o.name for o in sess.get_outputs()}, \
                f"bundle {k} of this test: loaded again, bucket {bucket} gave outputs {sorted(outs)}"
            for name, arr in outs.items():
                assert isinstance(arr, np.ndarray), (name, type(arr))
        sess.close()
