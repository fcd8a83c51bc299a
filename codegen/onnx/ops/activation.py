"""Activations and variadic/elementwise extras: LeakyRelu ... Swish, PRelu, Clip, Gelu,
Max/Min/Sum/Mean over N inputs, Mod, BitShift, IsInf.

Every op here is one elementwise comprehension (``b.elementwise``); the formulas are written
in the numerically safe form where the naive one overflows (Softplus, Mish).
"""

from __future__ import annotations

import math

import numpy as np

from mlpack.spec.ir import dtypes as dt
from mlpack.spec.ir import expr as ex
from mlpack.codegen.onnx.registry import op


def _c(v, dtype):
    return ex.const(v, dtype)


def _lt0(v):
    return ex.binary("lt", v, _c(0, v.dtype))


def _softplus(v):
    """log(1 + exp(v)) as max(v, 0) + log(1 + exp(-|v|)): no overflow for large v."""
    one = _c(1, v.dtype)
    return ex.maximum(v, _c(0, v.dtype)) + ex.unary("log", one + ex.unary("exp", -ex.unary("abs", v)))


def _unary(b, n, fn):
    x = n.inputs[0]
    return [b.elementwise(x.dtype, [x], fn)]


@op("LeakyRelu")
def leaky_relu(b, n):
    alpha = n.attr("alpha")
    return _unary(b, n, lambda v: ex.select(_lt0(v), _c(alpha, v.dtype) * v, v))


@op("Elu")
def elu(b, n):
    alpha = n.attr("alpha")
    return _unary(b, n, lambda v: ex.select(
        _lt0(v), _c(alpha, v.dtype) * (ex.unary("exp", v) - _c(1, v.dtype)), v))


@op("Selu")
def selu(b, n):
    alpha, gamma = n.attr("alpha"), n.attr("gamma")
    return _unary(b, n, lambda v: _c(gamma, v.dtype) * ex.select(
        ex.binary("le", v, _c(0, v.dtype)),
        _c(alpha, v.dtype) * ex.unary("exp", v) - _c(alpha, v.dtype), v))


@op("Celu")
def celu(b, n):
    alpha = n.attr("alpha")

    def f(v):
        a = _c(alpha, v.dtype)
        neg = a * (ex.unary("exp", ex.binary("div", v, a)) - _c(1, v.dtype))
        return ex.maximum(v, _c(0, v.dtype)) + ex.minimum(_c(0, v.dtype), neg)

    return _unary(b, n, f)


def _hard_sigmoid(v, alpha, beta):
    lin = _c(alpha, v.dtype) * v + _c(beta, v.dtype)
    return ex.maximum(_c(0, v.dtype), ex.minimum(_c(1, v.dtype), lin))


@op("HardSigmoid")
def hard_sigmoid(b, n):
    alpha, beta = n.attr("alpha"), n.attr("beta")
    return _unary(b, n, lambda v: _hard_sigmoid(v, alpha, beta))


@op("HardSwish")
def hard_swish(b, n):
    return _unary(b, n, lambda v: v * _hard_sigmoid(v, 1 / 6, 0.5))


@op("Softplus")
def softplus(b, n):
    return _unary(b, n, _softplus)


@op("Softsign")
def softsign(b, n):
    return _unary(b, n, lambda v: ex.binary("div", v, _c(1, v.dtype) + ex.unary("abs", v)))


@op("ThresholdedRelu")
def thresholded_relu(b, n):
    alpha = n.attr("alpha")
    return _unary(b, n, lambda v: ex.select(ex.binary("gt", v, _c(alpha, v.dtype)), v,
                                            _c(0, v.dtype)))


@op("Mish")
def mish(b, n):
    return _unary(b, n, lambda v: v * ex.unary("tanh", _softplus(v)))


@op("Shrink")
def shrink(b, n):
    lambd, bias = n.attr("lambd"), n.attr("bias")

    def f(v):
        lo, hi = _c(-lambd, v.dtype), _c(lambd, v.dtype)
        bb, zero = _c(bias, v.dtype), _c(0, v.dtype)
        return ex.select(ex.binary("lt", v, lo), v + bb,
                         ex.select(ex.binary("gt", v, hi), v - bb, zero))

    return _unary(b, n, f)


@op("Swish")
def swish(b, n):
    alpha = n.attr("alpha", 1.0)
    return _unary(b, n, lambda v: v * ex.unary("sigmoid", _c(alpha, v.dtype) * v))


@op("Gelu")
def gelu(b, n):
    approx = n.attr("approximate")
    if approx not in ("none", "tanh"):
        raise n.fail(f"approximate={approx!r}")

    def f(v):
        half, one = _c(0.5, v.dtype), _c(1, v.dtype)
        if approx == "tanh":
            inner = _c(math.sqrt(2 / math.pi), v.dtype) * (v + _c(0.044715, v.dtype) * v * v * v)
            return half * v * (one + ex.unary("tanh", inner))
        return half * v * (one + ex.unary("erf", v * _c(1 / math.sqrt(2), v.dtype)))

    return _unary(b, n, f)


@op("PRelu")
def prelu(b, n):
    x, slope = n.inputs[0], n.inputs[1]
    return [b.elementwise(x.dtype, [x, slope], lambda v, s: ex.select(_lt0(v), s * v, v))]


@op("Clip")
def clip(b, n):
    x = n.inputs[0]
    if n.opset < 11:
        lo, hi = n.attr("min", None), n.attr("max", None)
        bounds = [None if v is None else b.constant(_scalar(v, x.dtype)) for v in (lo, hi)]
    else:
        bounds = [n.input(1), n.input(2)]
    for v in bounds:
        if v is not None and v.rank != 0 and v.static_shape() not in ((1,),):
            raise n.fail(f"min/max of shape {v.shape}; ONNX requires scalars")
    lo, hi = bounds
    scalar = lambda v: v.at([ex.const(0)] * v.rank)  # noqa: E731

    def f(v):
        if lo is not None:
            v = ex.maximum(v, ex.cast(scalar(lo), x.dtype))
        if hi is not None:
            v = ex.minimum(v, ex.cast(scalar(hi), x.dtype))
        return v

    return [b.elementwise(x.dtype, [x], f)]


def _scalar(v, dtype):
    return np.asarray(v, dtype=dt.to_numpy(dtype))


# ---------------------------------------------------------------- variadic and integer ops


_FOLD = {"Max": "max", "Min": "min", "Sum": "add", "Mean": "add"}


@op(*_FOLD)
def variadic(b, n):
    xs = [v for v in n.inputs if v is not None]
    if not xs:
        raise n.fail("no inputs")
    name, dtype = _FOLD[n.op_type], xs[0].dtype

    def f(*vs):
        acc = vs[0]
        for v in vs[1:]:
            acc = ex.binary(name, acc, v)
        if n.op_type == "Mean":
            acc = ex.binary("div", acc, _c(len(vs), dtype))
        return acc

    return [b.elementwise(dtype, xs, f)]


@op("Mod")
def mod(b, n):
    x, y = n.inputs[0], n.inputs[1]
    # fmod=0 is Python's sign-of-divisor remainder (floats too, as the ONNX reference does)
    name = "fmod" if n.attr("fmod") else "mod"
    return [b.elementwise(x.dtype, [x, y], lambda a, c: ex.binary(name, a, c))]


@op("BitShift")
def bit_shift(b, n):
    x, y = n.inputs[0], n.inputs[1]
    direction = n.attr("direction")
    if direction not in ("LEFT", "RIGHT"):
        raise n.fail(f"direction={direction!r}")
    name = "shl" if direction == "LEFT" else "shr"
    width = dt.bits(x.dtype)

    def f(a, c):
        # a shift outside [0, width) shifts every bit out: 0, or the sign for a right shift
        ok = ex.binary("and", ex.binary("ge", c, _c(0, c.dtype)),
                       ex.binary("lt", c, _c(width, c.dtype)))
        out = _c(0, x.dtype)
        if name == "shr" and x.dtype in dt.SIGNED:
            out = ex.select(_lt0(a), _c(-1, x.dtype), out)
        return ex.select(ok, ex.binary(name, a, c), out)

    return [b.elementwise(x.dtype, [x, y], f)]


@op("IsInf")
def is_inf(b, n):
    x = n.inputs[0]
    pos, neg = n.attr("detect_positive"), n.attr("detect_negative")

    def f(v):
        inf = ex.unary("isinf", v)
        if pos and neg:
            return inf
        if not pos and not neg:
            return _c(False, "bool")
        side = ex.binary("gt" if pos else "lt", v, _c(0, v.dtype))
        return ex.binary("and", inf, side)

    return [b.elementwise("bool", [x], f)]
