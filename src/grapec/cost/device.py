"""Device profiles: what one GPU model charges for the quantities in cost/work.py.

A profile is data, measured on the GPU by `grapec calibrate` (tools/calibrate.py) and shipped
in cost/profiles/<name>.json, so a compiler on a machine without a GPU plans for the GPU the bundle
will run on (`grapec compile --device-profile h100`).

Each kind of node (kernel, attention, small_gemm, gemm) has its own coefficients, in microseconds per unit of
its feature (cost/model.py lists the features). They are fitted by non-negative least squares to the
calibration kernels' times, measured as graph nodes, so they include what a node costs in a replay.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from ..errors import InputError

PROFILE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "profiles")
DEFAULT_PROFILE = "h100"


@dataclass(frozen=True)
class DeviceProfile:
    name: str               # the file's stem: h100, h200
    device: str             # as the driver names it
    sms: int
    coefficients: dict      # kind -> {feature: microseconds per unit}
    measured: dict = field(default_factory=dict)   # when, driver, calibration fit error per kind
    node_gap_us: float = 0.0   # what a node adds to a chain's replay beyond its time measured alone:
    #                            the cost of one more node, which fusing two kernels into one saves
    memory_bytes: int = 0      # the GPU's memory (0: unknown): a plan larger than this is refused at compile time

    def to_json(self) -> dict:
        return {"name": self.name, "device": self.device, "sms": self.sms,
                "coefficients": self.coefficients, "node_gap_us": self.node_gap_us, "memory_bytes": self.memory_bytes,
                "measured": self.measured}

    @staticmethod
    def from_json(d: dict) -> "DeviceProfile":
        return DeviceProfile(str(d["name"]), str(d["device"]), int(d["sms"]),
                             {k: {f: float(v) for f, v in c.items()} for k, c in d["coefficients"].items()},
                             dict(d.get("measured") or {}), float(d.get("node_gap_us", 0.0)),
                             int(d.get("memory_bytes", 0)))

    def write(self, path: str):
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.to_json(), f, indent=1)
            f.write("\n")
        os.replace(tmp, path)


def shipped_profiles() -> list:
    if not os.path.isdir(PROFILE_DIR):
        return []
    return sorted(f[:-5] for f in os.listdir(PROFILE_DIR) if f.endswith(".json"))


def load_profile(name_or_path: "str | DeviceProfile | None" = None) -> DeviceProfile:
    """A shipped profile by name (h100, h200) or a profile file `grapec calibrate` wrote (a
    DeviceProfile is returned as it is)."""
    if isinstance(name_or_path, DeviceProfile):
        return name_or_path
    name = name_or_path or DEFAULT_PROFILE
    path = name if name.endswith(".json") or os.sep in name else os.path.join(PROFILE_DIR, f"{name}.json")
    if not os.path.exists(path):
        raise InputError(f"device profile {name!r}: no such file; shipped profiles: {', '.join(shipped_profiles())} "
                         f"(or a file written by `grapec calibrate`)")
    try:
        with open(path) as f:
            return DeviceProfile.from_json(json.load(f))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise InputError(f"device profile {path}: not a profile `grapec calibrate` wrote ({e})") from None


def profile_for_device(device_name: str) -> DeviceProfile | None:
    """The shipped profile whose device name matches the driver's (e.g. 'NVIDIA H100 80GB HBM3')."""
    for name in shipped_profiles():
        p = load_profile(name)
        if p.device == device_name:
            return p
    return None
