"""Start the tritonserver that nvidia-pytriton ships, from a venv of its own (make builds .venv-triton),
on a model repository; what tests/test_triton.py serves with. The same steps by hand are in README.md.

The Python backend's stub must match the venv's Python version (pytriton ships one per version), and
finds the venv's packages through PATH: its embedded interpreter takes its prefix from the `python3`
it finds first there.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRITON_VENV = os.environ.get("GRAPEC_TRITON_VENV", os.path.join(ROOT, ".venv-triton"))
READY_TIMEOUT_S = 90


def venv_python() -> str:
    return os.path.join(TRITON_VENV, "bin", "python")


def pytriton_dir() -> tuple | None:
    """(site-packages where pytriton lies, the venv's Python version "3.X", its libpython's folder);
    None where the Triton venv is not built."""
    if not os.path.exists(venv_python()):
        return None
    # found, not imported: pytriton's own client would want grpc, which serving does not need
    out = subprocess.run([venv_python(), "-c", "import importlib.util, os, sysconfig; "
                          "print(os.path.dirname(importlib.util.find_spec('pytriton').submodule_search_locations[0])); "
                          "print('%d.%d' % __import__('sys').version_info[:2]); print(sysconfig.get_config_var('LIBDIR'))"],
                         capture_output=True, text=True)
    return tuple(out.stdout.split("\n")[:3]) if out.returncode == 0 else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TritonServer:
    """tritonserver on `repo`, HTTP on a free port of 127.0.0.1; a context manager that stops it."""

    def __init__(self, repo: str, workdir: str):
        site, version, libdir = pytriton_dir()
        dist = os.path.join(site, "pytriton", "tritonserver")
        backends = os.path.join(workdir, "backends")
        os.makedirs(os.path.join(backends, "python"), exist_ok=True)
        for f in ("libtriton_python.so", "triton_python_backend_utils.py"):
            shutil.copy(os.path.join(dist, "backends", "python", f), os.path.join(backends, "python", f))
        shutil.copy(os.path.join(dist, "python_backend_stubs", version, "triton_python_backend_stub"),
                    os.path.join(backends, "python", "triton_python_backend_stub"))
        self.port = free_port()
        env = dict(os.environ)
        env["PATH"] = os.path.join(TRITON_VENV, "bin") + ":" + env.get("PATH", "")
        env["LD_LIBRARY_PATH"] = ":".join(filter(None, [os.path.join(site, "nvidia_pytriton.libs"), libdir,
                                                         env.get("LD_LIBRARY_PATH")]))
        self.log_path = os.path.join(workdir, "tritonserver.log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [os.path.join(dist, "bin", "tritonserver"), "--model-repository", repo, "--backend-directory", backends,
             "--http-address", "127.0.0.1", "--http-port", str(self.port), "--allow-grpc", "false",
             "--allow-metrics", "false", "--strict-model-config", "true"],
            env=env, stdout=self.log, stderr=subprocess.STDOUT)

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def wait_ready(self):
        deadline = time.time() + READY_TIMEOUT_S
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tritonserver exited with {self.proc.returncode}:\n{self.logs()}")
            try:
                with urllib.request.urlopen(f"http://{self.url}/v2/health/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"tritonserver not ready after {READY_TIMEOUT_S} s:\n{self.logs()}")

    def logs(self) -> str:
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()[-4000:]

    def __enter__(self):
        self.wait_ready()
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
