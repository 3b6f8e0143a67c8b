"""Errors a user can act on. The CLI turns every GrapecError into one message and exit code 2."""
from __future__ import annotations


def gpu_package(package: str) -> str:
    """How to install a piece of the CUDA backend or GPU code generation that is missing."""
    return f"pip install 'grapec[gpu]' (or just {package})"


class GrapecError(Exception):
    """Bad input or usage: the message names the thing at fault. Exit code 2."""

    exit_code = 2


class ModelError(GrapecError):
    """The ONNX file is missing, unreadable or invalid."""


class UnsupportedError(GrapecError):
    """Ops or features grapec cannot compile; `problems` lists every one found, not just the first."""

    def __init__(self, problems: list[str], header: str = "unsupported"):
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{header}:\n{lines}" if len(self.problems) > 1 else f"{header}: {self.problems[0]}")


class NeedsValueError(UnsupportedError):
    """A parameter that must be a compile-time constant (a target shape, axes, pads, a Range bound)
    comes from runtime data. `graph_inputs` names the graph inputs it depends on, where it depends
    on nothing else: fixing their values at compile time (--value) makes the parameter known."""

    def __init__(self, problem: str, value_name: str, graph_inputs: tuple = (), depends_on: tuple = (),
                 boundable: bool = False):
        self.value_name = value_name
        self.graph_inputs = tuple(graph_inputs)
        self.depends_on = tuple(depends_on)   # enclosing-scope values it comes from (raised in a body)
        self.boundable = boundable   # an upper bound (--bound) would do instead of a value
        super().__init__([problem])


class ShapeError(GrapecError):
    """A dynamic dim was not given, or given shapes contradict the model."""


class IndexRangeError(ShapeError):
    """An index known at compile time (a position id made by Range from a shape) reaches past the
    table it reads: onnxruntime refuses such a run, so the bundle is not made."""


class BundleError(GrapecError):
    """A .grape file is truncated, corrupted, foreign, or from a newer grapec."""


class InputError(GrapecError):
    """`run` was fed a wrong input name, shape or dtype."""


class BackendError(GrapecError):
    """The requested backend cannot run here (no GPU, kernels for another architecture, out of memory)."""
