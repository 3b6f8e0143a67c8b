import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))


def pytest_collection_modifyitems(config, items):
    from grapec.devices import cuda_backend_available, gpu_count
    if gpu_count() and cuda_backend_available():
        return
    why = "no NVIDIA GPU here" if not gpu_count() else "cuda-bindings or nvmath-python not installed"
    skip = pytest.mark.skip(reason=f"gpu test: {why}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
