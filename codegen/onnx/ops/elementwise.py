"""Elementwise ops: unary math, binary arithmetic with broadcasting, comparisons, logic,
activations, Cast, Identity, Constant. Each is one comprehension (``b.elementwise``)."""

from __future__ import annotations

import numpy as np
from onnx import numpy_helper

from mlpack.spec.ir import dtypes as dt
from mlpack.spec.ir import expr as ex
from mlpack.codegen.onnx.registry import op

_UNARY = {
    "Neg": "neg", "Abs": "abs", "Exp": "exp", "Log": "log", "Sqrt": "sqrt", "Sin": "sin",
    "Cos": "cos", "Tan": "tan", "Asin": "asin", "Acos": "acos", "Atan": "atan", "Sinh": "sinh",
    "Cosh": "cosh", "Tanh": "tanh", "Asinh": "asinh", "Acosh": "acosh", "Atanh": "atanh",
    "Erf": "erf", "Floor": "floor", "Ceil": "ceil", "Round": "round", "Sign": "sign",
    "Not": "not", "BitwiseNot": "bitnot", "IsNaN": "isnan", "Reciprocal": "recip",
    "Sigmoid": "sigmoid",
}


@op(*_UNARY)
def unary(b, n):
    x = n.inputs[0]
    name = _UNARY[n.op_type]
    out = "bool" if name in ex.UNARY_PREDICATES else x.dtype
    return [b.elementwise(out, [x], lambda a: ex.unary(name, a))]


_BINARY = {
    "Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow",
    "And": "and", "Or": "or", "Xor": "xor", "BitwiseAnd": "bitand", "BitwiseOr": "bitor",
    "BitwiseXor": "bitxor", "Equal": "eq", "Less": "lt", "LessOrEqual": "le", "Greater": "gt",
    "GreaterOrEqual": "ge",
}


@op(*_BINARY)
def binary(b, n):
    x, y = n.inputs[0], n.inputs[1]
    name = _BINARY[n.op_type]
    if name == "pow":  # the result has the base's type, whatever the exponent's
        return [b.elementwise(x.dtype, [x, y], lambda a, c: ex.cast(
            ex.binary("pow", a, ex.cast(c, a.dtype) if dt.is_float(a.dtype) else c), x.dtype))]
    out = "bool" if name in ex.COMPARISONS or name in ex.LOGICAL else x.dtype
    return [b.elementwise(out, [x, y], lambda a, c: ex.binary(name, a, c))]


@op("Relu")
def relu(b, n):
    x = n.inputs[0]
    return [b.elementwise(x.dtype, [x], lambda a: ex.maximum(a, ex.const(0, x.dtype)))]


@op("Identity")
def identity(b, n):
    return [n.inputs[0]]


_SATURATING = {"f8e4m3fn", "f8e4m3fnuz", "f8e5m2", "f8e5m2fnuz"}


def cast_to(b, n, x, to: str):
    """x cast to ``to``; casts into 8-bit floats saturate unless saturate=0 (opset 19+)."""
    if to == "f8e8m0":
        raise n.fail("casting to FLOAT8E8M0 (round_mode) is not supported")
    saturate = n.attr("saturate", 1) if n.opset >= 19 else 1
    if to in _SATURATING and saturate and dt.is_float(x.dtype):
        lo, hi = dt.finite_range(to)
        return b.elementwise(to, [x], lambda a: ex.cast(
            ex.minimum(ex.maximum(a, ex.const(lo, a.dtype)), ex.const(hi, a.dtype)), to))
    return b.elementwise(to, [x], lambda a: ex.cast(a, to))


@op("Cast")
def cast(b, n):
    from mlpack.codegen.onnx.importer import onnx_dtype
    to = onnx_dtype(n.attr("to"), "attribute 'to'", n)
    return [cast_to(b, n, n.inputs[0], to)]


@op("CastLike")
def cast_like(b, n):
    return [cast_to(b, n, n.inputs[0], n.inputs[1].dtype)]


@op("Constant")
def constant(b, n):
    for key in ("value", "sparse_value", "value_float", "value_floats", "value_int",
                "value_ints", "value_string", "value_strings"):
        if n.has(key):
            break
    else:
        raise n.fail("no value attribute")
    v = n.attr(key)
    if key == "value":
        data = numpy_helper.to_array(v)
    elif key == "value_float":
        data = np.array(v, dtype=np.float32)
    elif key == "value_floats":
        data = np.array(v, dtype=np.float32)
    elif key == "value_int":
        data = np.array(v, dtype=np.int64)
    elif key == "value_ints":
        data = np.array(v, dtype=np.int64)
    else:
        raise n.fail(f"attribute {key!r} is not supported")
    try:
        dt.from_numpy(data.dtype)
    except KeyError:
        raise n.fail(f"constant of dtype {data.dtype} is not supported") from None
    return [b.constant(data, name=n.output_names[0])]
