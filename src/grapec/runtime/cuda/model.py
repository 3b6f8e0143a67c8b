"""A bundle loaded on one GPU: what every run of it shares, whichever stream and arena it runs on.

At load: pick the bundle's code for this GPU (a cubin of the same major architecture, else PTX),
load the module (and the conditional-node setter kernels where the plan has graphed regions), and
upload the weights once. Nothing here changes after load, so the runners of one session (one per
stream, runner.py) read it from several threads at once.
"""
from __future__ import annotations

import os

import numpy as np

from ..devices import check_fits
from ...errors import BackendError
from .driver import Device, call

# Conditional IF nodes with an else body need CUDA 12.8 (WHILE and plain IF came with 12.4).
CONDITIONAL_DRIVER = 12080
# Programmatic edges between the kernel nodes of a graph came with CUDA 12.3.
DEPENDENT_LAUNCH_DRIVER = 12030
# A stitched kernel's grid: blocks per SM, at most (as many as stay resident together, at least one).
# More blocks share a stage's work finer, but each barrier then counts more arrivals.
# GRAPEC_STITCH_BLOCKS_PER_SM sets another (benchmarks/grid_stitch.py measures 1 and 2).
STITCH_BLOCKS_PER_SM = 1
STATIC_SHARED_LIMIT = 48 << 10


def runs_here(arch: str, cc: tuple) -> bool:
    """A cubin for sm_XY runs on a GPU of the same major version and at least its minor version."""
    return int(arch[3:-1]) == cc[0] and int(arch[-1]) <= cc[1]


def select_code(bundle, device) -> tuple:
    """-> (image bytes, 'cubin sm_90' | 'ptx compute_90'); a clear error when nothing fits."""
    cuda = bundle.manifest.get("cuda")
    if not cuda:
        raise BackendError("this bundle has no GPU code (compiled without NVRTC or with --no-gpu); "
                           "recompile it with `grapec compile --target " + device.arch + "`, or use --backend cpu")
    major, minor = device.cc
    fits = [t for t in cuda["targets"] if runs_here(t, device.cc)]
    if fits:
        best = max(fits, key=lambda t: int(t[3:]))
        return bundle.extra_sections[f"cubin.{best}"], f"cubin {best}"
    ptx = cuda.get("ptx")
    if ptx and int(ptx.split("_")[1]) <= major * 10 + minor:
        return bundle.extra_sections[f"ptx.{ptx}"], f"ptx {ptx}"
    have = ", ".join(cuda["targets"]) + (f" and PTX {ptx}" if ptx else ", no PTX")
    raise BackendError(f"this bundle's GPU code is for {have}; this GPU ({device.name}) is {device.arch}: "
                       f"recompile with `grapec compile --target {device.arch}`")


def uses_dependent_launch(bundle, code: str, cc: tuple) -> bool:
    """Join kernel nodes by programmatic edges (graph.py)? Only where every kernel of the loaded code
    waits for its predecessor: a bundle that says so (codegen/build.py), code for sm_90 or newer (below
    it the wait compiles to nothing), a Hopper-or-newer GPU and driver. GRAPEC_DEPENDENT_LAUNCH=0 turns
    it off (benchmarks/graph_options.py measures both)."""
    if os.environ.get("GRAPEC_DEPENDENT_LAUNCH", "1") == "0" or not bundle.manifest["cuda"].get("dependent_launch"):
        return False
    code_arch = int(code.rsplit("_", 1)[1])
    return code_arch >= 90 and cc[0] >= 9 and call("cuDriverGetVersion") >= DEPENDENT_LAUNCH_DRIVER


class _Functions:
    """Per bundle kernel, its GPU function (identical kernels share one); a range's sizes joined from
    their family's formulas (bundle/families.py) add kernels, and names, after load."""

    def __init__(self, module, names: list):
        self.module, self.names, self.by_name = module, names, {}
        for k in range(len(names)):
            self[k]

    def __getitem__(self, k: int):
        n = self.names[k]
        f = self.by_name.get(n)
        if f is None:
            f = self.by_name[n] = call("cuModuleGetFunction", self.module, n.encode())
        return f


class CudaModel:
    """The bundle's code and weights on GPU `device` (its ordinal); `arenas`: how many activation
    arenas its runners will allocate, checked with the weights against the GPU's free memory."""

    def __init__(self, bundle, device: int = 0, tf32: bool = False, arenas: int = 1):
        self.bundle = bundle
        self.tf32 = tf32
        self.dev = Device(device)
        image, self.code = select_code(bundle, self.dev)
        self.module = self._load(image, self.code)
        names = bundle.manifest["cuda"]["kernels"]
        self.functions = _Functions(self.module, names)
        self._extra: dict = {}
        self.launches = bundle.manifest["cuda"].get("launch")   # [mode, grid, block, split] per kernel
        if self.launches is None:
            raise BackendError("this bundle was made by an older grapec (no kernel launch shapes); recompile it")
        self.scalars = bundle.manifest["cuda"].get("scalars") or [[] for _ in names]   # size arguments
        self.control = self._control_module(bundle)
        self._stitches = {(int(b), int(f)): (str(name), int(smem))
                          for b, f, name, smem in bundle.manifest["cuda"].get("stitches") or []}
        self.dependent_launch = uses_dependent_launch(bundle, self.code, self.dev.cc)
        sizes = {"weights": len(bundle.weights), "activation arena": bundle.largest_arena()}
        if arenas > 1:
            sizes = {"weights": sizes["weights"], f"{arenas} activation arenas": arenas * sizes["activation arena"]}
        check_fits(sizes, self.dev.mem_info()[0], f"free GPU memory on {self.dev.name}")
        self.weights = self.dev.alloc(len(bundle.weights), "weights")
        host = np.frombuffer(bundle.weights, np.uint8)   # a read bundle's weights are a view of its mapped file
        self.dev.upload(self.weights, host.ctypes.data, host.nbytes)

    def _load(self, image, what):
        try:
            return call("cuModuleLoadData", image)
        except BackendError as e:
            if "PTX" in str(e) or "UNSUPPORTED" in str(e):
                raise BackendError(f"the driver cannot load this bundle's {what}: {e}. PTX needs a driver at least "
                                   f"as new as the NVRTC that made it ({self.bundle.manifest['cuda'].get('nvrtc')}); "
                                   f"recompile with --target {self.dev.arch} for a cubin") from None
            raise

    def _control_module(self, bundle):
        """The setter kernels of graphed If/Loop regions: a linked cubin for this GPU, and a driver
        that has conditional nodes. Either missing is a clear error, not a silent host fallback."""
        if not bundle.manifest["cuda"].get("control"):   # codegen/build.py: some plan has a graphed region
            return None
        fits = [k for k in bundle.extra_sections if k.startswith("control.sm_")
                and runs_here(k[len("control."):], self.dev.cc)]
        if not fits:
            raise BackendError(f"this bundle runs If/Loop inside the CUDA graph but has no setter kernels for "
                               f"{self.dev.arch}: recompile with --target {self.dev.arch} (or --host-control)")
        version = call("cuDriverGetVersion")
        if version < CONDITIONAL_DRIVER:
            raise BackendError(f"this bundle runs If/Loop as CUDA conditional nodes, which need a driver for CUDA "
                               f"12.8 or newer (this one is {version // 1000}.{version % 1000 // 10}); update the "
                               "driver or recompile with --host-control")
        return self._load(bundle.extra_sections[max(fits, key=lambda k: int(k[len("control.sm_"):]))],
                          "If/Loop setter kernels")

    def function(self, name: str):
        """A kernel of the bundle's module by name (the runtime's own helpers, e.g. grapec_scan_store)."""
        if name not in self._extra:
            self._extra[name] = call("cuModuleGetFunction", self.module, name.encode())
        return self._extra[name]

    def stitch(self, bucket: int, first: int, block: int) -> tuple:
        """(function, dynamic shared bytes, grid) of the bucket's stitched kernel at step `first`: the grid
        is what stays resident on this GPU, which a cooperative launch needs."""
        key = ("stitch", bucket, first, block)
        if key not in self._extra:
            if (bucket, first) not in self._stitches:
                raise BackendError(f"bucket {bucket}'s plan stitches steps from {first} on, but the bundle has no "
                                   "stitched kernel for them (a damaged bundle): recompile it")
            name, smem = self._stitches[(bucket, first)]
            func = self.function(name)
            if smem > STATIC_SHARED_LIMIT:
                from cuda.bindings import driver
                call("cuFuncSetAttribute", func,
                     driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem)
            per_sm = call("cuOccupancyMaxActiveBlocksPerMultiprocessor", func, block, smem)
            if per_sm < 1:
                raise BackendError(f"the stitched kernel {name} ({block} threads, {smem} bytes of shared memory) cannot "
                                   f"run on {self.dev.name}: recompile with --grid-stitch off")
            want = int(os.environ.get("GRAPEC_STITCH_BLOCKS_PER_SM", STITCH_BLOCKS_PER_SM))
            self._extra[key] = (func, smem, self.dev.sms * max(1, min(per_sm, want)))
        return self._extra[key]

    def control_function(self, name: str):
        key = "control:" + name
        if key not in self._extra:
            self._extra[key] = call("cuModuleGetFunction", self.control, name.encode())
        return self._extra[key]

    def close(self):
        """Give the weights and modules back (the runners using them are closed first)."""
        if getattr(self, "dev", None) is None:
            return
        self.dev.make_current()
        self.dev.free(getattr(self, "weights", 0))
        self.weights = 0
        for attr in ("module", "control"):
            if getattr(self, attr, None) is not None:
                call("cuModuleUnload", getattr(self, attr))
                setattr(self, attr, None)
        self.dev = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown: the driver may be gone already
            pass
