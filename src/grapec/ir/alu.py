"""Scalar ops of the kernel IR as numpy functions (C semantics: integer div/mod truncate toward
zero), the IR's lowest module: constant folding (kernel.py), the interpreter (interpret.py) and the
library ops' numpy forms (library.py) all evaluate an op through `apply_op`, so they agree with each
other and with the CUDA rendering. tinygrad keeps its python_alu beside its ops the same way.
"""
from __future__ import annotations

import math

import numpy as np


def _c_div(a, b):
    if a.dtype.kind in "iu":
        b = np.where(b == 0, 1, b)  # C leaves x/0 undefined; ONNX does too. Don't trap.
        q = a // b
        fix = (a % b != 0) & ((a < 0) != (b < 0))
        return q + fix.astype(q.dtype)
    return np.divide(a, b)


def _c_mod(a, b):
    if a.dtype.kind in "iu":
        b = np.where(b == 0, 1, b)
    return np.fmod(a, b)


def erf(x):
    """numpy has no erf: libm's math.erf per element, in float64 chunks (exact, fast enough)."""
    x = np.asarray(x)
    out = np.empty(x.shape, np.float64)
    flat, src = out.reshape(-1), np.asarray(x, np.float64).reshape(-1)
    f = np.frompyfunc(math.erf, 1, 1)
    for s in range(0, src.size, 1 << 16):
        flat[s:s + (1 << 16)] = f(src[s:s + (1 << 16)])
    return out.astype(x.dtype)


def _round_half_even(x):
    return np.round(x)


def _shift(op):
    def f(a, b):
        b = b.astype(a.dtype)
        return np.left_shift(a, b) if op == "shl" else np.right_shift(a, b)
    return f


ALU = {
    "neg": np.negative, "abs": np.abs, "exp": np.exp, "log": np.log, "sqrt": np.sqrt,
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos,
    "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh, "tanh": np.tanh, "asinh": np.arcsinh,
    "acosh": np.arccosh, "atanh": np.arctanh, "erf": erf, "floor": np.floor, "ceil": np.ceil,
    "round": _round_half_even, "sign": np.sign, "not": np.logical_not, "bitnot": np.invert,
    "isnan": np.isnan, "isinf": np.isinf, "isposinf": np.isposinf, "isneginf": np.isneginf,
    "reciprocal": lambda x: np.divide(np.ones((), x.dtype), x),
    "sigmoid": lambda x: np.divide(np.ones((), x.dtype), np.ones((), x.dtype) + np.exp(-x)),
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": _c_div, "mod": _c_mod,
    "pow": np.power, "max": np.maximum, "min": np.minimum,
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
    "gt": np.greater, "ge": np.greater_equal, "and": np.logical_and, "or": np.logical_or,
    "xor": np.logical_xor, "bitand": np.bitwise_and, "bitor": np.bitwise_or,
    "bitxor": np.bitwise_xor, "shl": _shift("shl"), "shr": _shift("shr"), "atan2": np.arctan2,
    "where": np.where,
}


def apply_op(op: str, vals: list):
    if op == "pow" and vals[0].dtype.kind in "iu":
        # integer pow with a negative exponent is an error in numpy; C code computes it in double.
        return np.power(vals[0].astype(np.float64), vals[1].astype(np.float64)).astype(vals[0].dtype)
    return ALU[op](*vals)
