"""Elementwise ops: math, comparisons, logic, activations, Cast, Where, variadic Sum/Mean/Max/Min.

Each lowering builds the scalar expression of one output element; broadcasting is handled by
`map_`. Float-only formulas are written with `_c(value, like)` constants of the input's dtype.
"""
from __future__ import annotations

import math

from .. import dtypes
from ..ir import kernel as K
from ..ir.tensor import cast, map_
from . import op

E = K.Expr


def _c(v, like: E) -> E:
    return K.const(v, like.dtype)


# Ops whose output element at an index reads only the inputs' elements at that (broadcast) index:
# a data-dependent size passes through them unchanged (ops/counted.py).
ELEMENTWISE = {"Pow", "Mod", "BitShift", "IsInf", "Cast", "CastLike", "Where", "Mean", "Relu", "LeakyRelu",
               "PRelu", "Elu", "Selu", "Celu", "ThresholdedRelu", "HardSigmoid", "HardSwish", "Softplus",
               "Softsign", "Mish", "Swish", "Gelu", "Shrink", "Clip", "Identity", "Dropout"}


def _unary(name: str, fn):
    ELEMENTWISE.add(name)

    @op(name)
    def lower(ctx):
        return [map_(fn, ctx.input(0))]
    return lower


def _binary(name: str, fn):
    ELEMENTWISE.add(name)

    @op(name)
    def lower(ctx):
        return [map_(fn, ctx.input(0), ctx.input(1))]
    return lower


for _name, _kop in {
    "Neg": "neg", "Abs": "abs", "Exp": "exp", "Log": "log", "Sqrt": "sqrt", "Sin": "sin", "Cos": "cos",
    "Tan": "tan", "Asin": "asin", "Acos": "acos", "Atan": "atan", "Sinh": "sinh", "Cosh": "cosh",
    "Tanh": "tanh", "Asinh": "asinh", "Acosh": "acosh", "Atanh": "atanh", "Erf": "erf", "Floor": "floor",
    "Ceil": "ceil", "Round": "round", "Sign": "sign", "Not": "not", "BitwiseNot": "bitnot",
    "IsNaN": "isnan", "Reciprocal": "reciprocal", "Sigmoid": "sigmoid",
}.items():
    _unary(_name, lambda x, _k=_kop: K.unary(_k, x))

for _name, _kop in {
    "Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Equal": "eq", "Less": "lt",
    "LessOrEqual": "le", "Greater": "gt", "GreaterOrEqual": "ge", "And": "and", "Or": "or", "Xor": "xor",
    "BitwiseAnd": "bitand", "BitwiseOr": "bitor", "BitwiseXor": "bitxor",
}.items():
    _binary(_name, lambda a, b, _k=_kop: K.binary(_k, a, b))


@op("Pow")
def pow_(ctx):
    x, y = ctx.input(0), ctx.input(1)
    return [map_(lambda a, b: K.binary("pow", a, K.cast(b, a.dtype)), x, y)]


@op("Mod")
def mod(ctx):
    def f(a, b):
        r = K.binary("mod", a, b)  # C fmod: sign of the dividend
        if ctx.attr("fmod", 0):
            return r
        # Python-style: sign of the divisor
        fix = K.binary("and", K.binary("ne", r, _c(0, r)), K.binary("ne", K.binary("lt", r, _c(0, r)), K.binary("lt", b, _c(0, b))))
        return K.where(fix, K.binary("add", r, b), r)
    return [map_(f, ctx.input(0), ctx.input(1))]


@op("BitShift")
def bitshift(ctx):
    k = "shl" if ctx.attr("direction") == "LEFT" else "shr"
    return [map_(lambda a, b: K.binary(k, a, b), ctx.input(0), ctx.input(1))]


@op("IsInf")
def isinf(ctx):
    pos, neg = ctx.attr("detect_positive", 1), ctx.attr("detect_negative", 1)
    k = "isinf" if pos and neg else "isposinf" if pos else "isneginf" if neg else None
    if k is None:
        return [map_(lambda a: K.const(False, "bool"), ctx.input(0), dtype="bool")]
    return [map_(lambda a: K.unary(k, a), ctx.input(0))]


# Cast's `saturate` (default 1) applies to these: out-of-range values and infinities clamp to the
# largest finite value, as onnx.numpy_helper.saturate_cast does. Otherwise they become NaN (or inf
# for float8e5m2).
SATURATING = ("float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz")


def saturate(x: K.Expr, dt: str) -> K.Expr:
    """Clamp a float32 value into dt's finite range; NaN stays NaN."""
    m = dtypes.float_max(dt)
    return K.binary("min", K.binary("max", x, K.const(-m, "float32")), K.const(m, "float32"))


def _cast_to(ctx, x: T, dt: str) -> T:
    if dt in SATURATING and ctx.attr("saturate", 1) and x.dtype != dt:
        return map_(lambda a: K.cast(saturate(K.cast(a, "float32"), dt), dt), x, dtype=dt)
    return cast(x, dt)


@op("Cast")
def cast_(ctx):
    to = ctx.attr("to")
    try:
        dt = dtypes.from_onnx(to)
    except KeyError:
        ctx.fail(f"cast to {dtypes.onnx_name(to)} is not supported")
    return [_cast_to(ctx, ctx.input(0), dt)]


@op("CastLike")
def cast_like(ctx):
    return [_cast_to(ctx, ctx.input(0), ctx.dtype(1))]


@op("Where")
def where(ctx):
    return [map_(K.where, ctx.input(0), ctx.input(1), ctx.input(2))]


def _variadic(name, kop):
    ELEMENTWISE.add(name)

    @op(name)
    def lower(ctx):
        ins = [t for t in ctx.inputs() if t is not None]
        def f(*xs):
            acc = xs[0]
            for x in xs[1:]:
                acc = K.binary(kop, acc, x)
            return acc
        return [map_(f, *ins)]


_variadic("Sum", "add")
_variadic("Max", "max")
_variadic("Min", "min")


@op("Mean")
def mean(ctx):
    ins = [t for t in ctx.inputs() if t is not None]
    def f(*xs):
        acc = xs[0]
        for x in xs[1:]:
            acc = K.binary("add", acc, x)
        return K.binary("div", acc, _c(len(xs), acc))
    return [map_(f, *ins)]


# --- activations -----------------------------------------------------------------------------------

@op("Relu")
def relu(ctx):
    return [map_(lambda x: K.binary("max", x, _c(0, x)), ctx.input(0))]


@op("LeakyRelu")
def leaky_relu(ctx):
    a = ctx.attr("alpha", 0.01)
    return [map_(lambda x: K.where(K.binary("lt", x, _c(0, x)), K.binary("mul", x, _c(a, x)), x), ctx.input(0))]


@op("PRelu")
def prelu(ctx):
    return [map_(lambda x, s: K.where(K.binary("lt", x, _c(0, x)), K.binary("mul", x, s), x), ctx.input(0), ctx.input(1))]


@op("Elu")
def elu(ctx):
    a = ctx.attr("alpha", 1.0)
    return [map_(lambda x: K.where(K.binary("lt", x, _c(0, x)),
                                   K.binary("mul", _c(a, x), K.binary("sub", K.unary("exp", x), _c(1, x))), x), ctx.input(0))]


@op("Selu")
def selu(ctx):
    a, g = ctx.attr("alpha", 1.67326319217681884765625), ctx.attr("gamma", 1.05070102214813232421875)
    def f(x):
        neg = K.binary("sub", K.binary("mul", _c(a, x), K.unary("exp", x)), _c(a, x))
        return K.binary("mul", _c(g, x), K.where(K.binary("le", x, _c(0, x)), neg, x))
    return [map_(f, ctx.input(0))]


@op("Celu")
def celu(ctx):
    a = ctx.attr("alpha", 1.0)
    def f(x):
        neg = K.binary("mul", _c(a, x), K.binary("sub", K.unary("exp", K.binary("div", x, _c(a, x))), _c(1, x)))
        return K.binary("add", K.binary("max", x, _c(0, x)), K.binary("min", _c(0, x), neg))
    return [map_(f, ctx.input(0))]


@op("ThresholdedRelu")
def thresholded_relu(ctx):
    a = ctx.attr("alpha", 1.0)
    return [map_(lambda x: K.where(K.binary("gt", x, _c(a, x)), x, _c(0, x)), ctx.input(0))]


@op("HardSigmoid")
def hard_sigmoid(ctx):
    a, b = ctx.attr("alpha", 0.2), ctx.attr("beta", 0.5)
    return [map_(lambda x: K.binary("max", _c(0, x), K.binary("min", _c(1, x),
                                                               K.binary("add", K.binary("mul", _c(a, x), x), _c(b, x)))), ctx.input(0))]


@op("HardSwish")
def hard_swish(ctx):
    def f(x):
        hs = K.binary("max", _c(0, x), K.binary("min", _c(1, x), K.binary("add", K.binary("mul", _c(1 / 6, x), x), _c(0.5, x))))
        return K.binary("mul", x, hs)
    return [map_(f, ctx.input(0))]


@op("Softplus")
def softplus(ctx):
    return [map_(lambda x: K.unary("log", K.binary("add", K.unary("exp", x), _c(1, x))), ctx.input(0))]


@op("Softsign")
def softsign(ctx):
    return [map_(lambda x: K.binary("div", x, K.binary("add", _c(1, x), K.unary("abs", x))), ctx.input(0))]


@op("Mish")
def mish(ctx):
    return [map_(lambda x: K.binary("mul", x, K.unary("tanh", K.unary("log", K.binary("add", K.unary("exp", x), _c(1, x))))), ctx.input(0))]


@op("Swish")
def swish(ctx):
    a = ctx.attr("alpha", 1.0)
    return [map_(lambda x: K.binary("mul", x, K.unary("sigmoid", K.binary("mul", _c(a, x), x))), ctx.input(0))]


@op("Gelu")
def gelu(ctx):
    approx = ctx.attr("approximate", "none")
    def f(x):
        if approx == "tanh":
            inner = K.binary("mul", _c(math.sqrt(2 / math.pi), x),
                             K.binary("add", x, K.binary("mul", _c(0.044715, x), K.binary("mul", x, K.binary("mul", x, x)))))
            return K.binary("mul", K.binary("mul", _c(0.5, x), x), K.binary("add", _c(1, x), K.unary("tanh", inner)))
        return K.binary("mul", K.binary("mul", _c(0.5, x), x),
                        K.binary("add", _c(1, x), K.unary("erf", K.binary("mul", x, _c(1 / math.sqrt(2), x)))))
    return [map_(f, ctx.input(0))]


@op("Shrink")
def shrink(ctx):
    lambd, bias = ctx.attr("lambd", 0.5), ctx.attr("bias", 0.0)
    def f(x):
        return K.where(K.binary("lt", x, _c(-lambd, x)), K.binary("add", x, _c(bias, x)),
                       K.where(K.binary("gt", x, _c(lambd, x)), K.binary("sub", x, _c(bias, x)), _c(0, x)))
    return [map_(f, ctx.input(0))]


@op("Clip")
def clip(ctx):
    x = ctx.input(0)
    lo = ctx.input(1) if ctx.has(1) else None
    hi = ctx.input(2) if ctx.has(2) else None
    if "min" in ctx.node.attrs or "max" in ctx.node.attrs:  # opset < 11
        from ..ir.tensor import scalar
        lo = scalar(ctx.attr("min"), x.dtype) if "min" in ctx.node.attrs else None
        hi = scalar(ctx.attr("max"), x.dtype) if "max" in ctx.node.attrs else None
    out = x
    if lo is not None:
        out = map_(lambda a, b: K.binary("max", a, b), out, lo)
    if hi is not None:
        out = map_(lambda a, b: K.binary("min", a, b), out, hi)
    return [out]


@op("Identity")
def identity(ctx):
    return [ctx.input(0)]


@op("Dropout")
def dropout(ctx):
    """Inference: the identity; the mask is all ones. training_mode=True is refused."""
    x = ctx.input(0)
    if ctx.has(2):
        tm = ctx.const(2, "training_mode")
        if bool(tm.reshape(-1)[0]):
            ctx.fail("training_mode=True (random masks) is not supported")
    from ..ir.tensor import full
    return [x, full(x.shape, True, "bool")]
