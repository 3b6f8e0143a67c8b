"""The floor no implementation of a plan beats on a device: every weight read once at the
device's measured bandwidth, or every arithmetic operation at its measured peak, whichever is
longer. benchmarks/zoo.py prints grapec's time as a multiple of it.

The FLOPs are the plan's own (cost/work.py): GEMMs count 2·M·N·K, kernels their arithmetic, with a
transcendental counted 4. Steps the model does not price (If/Loop regions) add nothing, so for
those models the floor is lower than the truth, never higher.
"""
from __future__ import annotations

from dataclasses import dataclass

from .work import step_work


@dataclass
class Roofline:
    weight_bytes: int
    gflop: float
    bandwidth_gbs: float = 0.0      # measured, GB/s
    peak_tflops: float = 0.0        # measured, for the plan's precision

    @property
    def memory_ms(self) -> float:
        return self.weight_bytes / (self.bandwidth_gbs * 1e9) * 1e3 if self.bandwidth_gbs else 0.0

    @property
    def compute_ms(self) -> float:
        return self.gflop / (self.peak_tflops * 1e3) * 1e3 if self.peak_tflops else 0.0

    @property
    def floor_ms(self) -> float:
        return max(self.memory_ms, self.compute_ms)

    @property
    def bound(self) -> str:
        return "memory" if self.memory_ms >= self.compute_ms else "compute"

    def to_json(self) -> dict:
        return {"weight_bytes": self.weight_bytes, "gflop": round(self.gflop, 4), "bandwidth_gbs": self.bandwidth_gbs,
                "peak_tflops": self.peak_tflops, "memory_ms": round(self.memory_ms, 5),
                "compute_ms": round(self.compute_ms, 5), "floor_ms": round(self.floor_ms, 5), "bound": self.bound}


def plan_roofline(bundle, bucket: int = 0, bandwidth_gbs: float = 0.0, peak_tflops: float = 0.0) -> Roofline:
    """The floor of one bucket's plan: the bundle's weights and the plan's arithmetic."""
    plan = bundle.plans[bucket]
    gflop = 0.0
    for st in plan.steps:
        work = step_work(bundle.kernels, plan, st)
        if work is not None:
            gflop += work.gflop
    return Roofline(int(bundle.manifest["weights_bytes"]), gflop, bandwidth_gbs, peak_tflops)
