"""What each scalar op of spec/ir/expr.py means on NumPy values: the interpreter's op rules.

``apply_op(op, args, dtype, arg_dtypes)`` applies one op elementwise and gives the node's dtype;
the tables map each op to a NumPy function (integer rules that differ in ``_INT_*``).
tests/codegen/test_scalar_ops.py holds these tables, the C interpreter's and the LLVM
lowering's (codegen/llvm/oprules.py) equal to the IR's ops.
"""

from __future__ import annotations

import numpy as np

from mlpack.spec.errors import InterpError
from mlpack.spec.ir import dtypes as dt
from mlpack.spec.ir.erf import erf as _erf
from mlpack.spec.ir.erf import erf32 as _erf32


def _int_div(a, b):
    """C-style truncating integer division (what ONNX Div does on integers)."""
    with np.errstate(all="ignore"):
        b_safe = np.where(b == 0, 1, b)
        q = np.floor_divide(a, b_safe)
        r = a - q * b_safe
        q = q + ((r != 0) & ((a < 0) != (b_safe < 0)))
        return np.where(b == 0, 0, q)


def _sigmoid(x):
    with np.errstate(over="ignore"):
        e = np.exp(-np.abs(x))
        return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _int_floor(f):
    """Python // and % on integers, 0 for a zero divisor."""
    def rule(a, b, dtype):
        b_safe = np.where(b == 0, 1, b)
        return np.where(b == 0, 0, f(a, b_safe))
    return rule


def _int_pow(a, b, dtype):
    return np.power(a.astype(np.float64), b.astype(np.float64))


def _shift(f):
    """Shifts by the width or more give 0 (NumPy's wrap the amount)."""
    def rule(a, b, dtype):
        w = dt.bits(dtype)
        out = f(a, np.minimum(b, w - 1).astype(a.dtype))
        return np.where(b >= w, 0, out)
    return rule


# One rule per op of spec/ir/expr.py's UNARY and BINARY (a NumPy function of the operands), with
# the integer rules that differ from it in _INT_* (shifts are integer only).
# tests/codegen/test_scalar_ops.py holds these tables, the C interpreter's and the LLVM
# lowering's (codegen/llvm/oprules.py) equal to the IR's ops.
_UNARY = {
    "neg": np.negative, "abs": np.abs, "exp": np.exp, "log": np.log, "sqrt": np.sqrt,
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos,
    "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh, "tanh": np.tanh, "asinh": np.arcsinh,
    "acosh": np.arccosh, "atanh": np.arctanh, "erf": _erf, "floor": np.floor, "ceil": np.ceil,
    "round": np.round, "sign": np.sign, "not": np.logical_not, "bitnot": np.invert,
    "isnan": np.isnan, "isinf": np.isinf, "recip": np.reciprocal, "sigmoid": _sigmoid,
}
_INT_UNARY = {"recip": lambda x: _int_div(np.ones_like(x), x)}
# rules for f32, f16 and bf16 operands that differ: erf as the cpu target computes it, in f32
# (the float64 reference, whose operands are f64, keeps the exact one)
_NARROW_UNARY = {"erf": _erf32}
_BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide,
    "floordiv": np.floor_divide, "mod": np.mod, "fmod": np.fmod, "pow": np.power,
    "max": np.maximum, "min": np.minimum,
    "and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor,
    "bitand": np.bitwise_and, "bitor": np.bitwise_or, "bitxor": np.bitwise_xor,
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
    "ge": np.greater_equal, "atan2": np.arctan2,
}
_INT_BINARY = {   # (a, b, dtype)
    "div": lambda a, b, dtype: _int_div(a, b), "pow": _int_pow,
    "floordiv": _int_floor(np.floor_divide), "mod": _int_floor(np.mod),
    "shl": _shift(np.left_shift), "shr": _shift(np.right_shift),
}
# ops computed in the node's dtype when the operands' promoted dtype differs from it
_IN_RESULT_DTYPE = ("add", "sub", "mul", "max", "min", "pow", "atan2")


def float_ufunc(op: str, dtype: str, arg_dtypes: list[str]) -> np.ufunc | None:
    """The NumPy ufunc that ``apply_op`` applies for ``op`` on float operands all of the
    node's float ``dtype``, where it is one (so a caller may pass it an ``out`` array and get
    the same values): None for integer or mixed operands and for the rules that are not
    ufuncs (erf, sigmoid, select, cast)."""
    if not dt.is_float(dtype) or any(a != dtype for a in arg_dtypes):
        return None
    rule = _UNARY.get(op) if len(arg_dtypes) == 1 else _BINARY.get(op)
    return rule if isinstance(rule, np.ufunc) and rule.nout == 1 else None


def apply_op(op: str, args: list, dtype: str, arg_dtypes: list[str]):
    """Apply a scalar op elementwise to NumPy values, giving the node's dtype."""
    np_dtype = dt.to_numpy(dtype)
    with np.errstate(all="ignore"):
        if op in _UNARY:
            rule = (_INT_UNARY.get(op) if dt.is_int(arg_dtypes[0]) else
                    _NARROW_UNARY.get(op) if arg_dtypes[0] in ("f32", "f16", "bf16") else
                    None) or _UNARY[op]
            return np.asarray(rule(args[0])).astype(np_dtype, copy=False)
        if op in _INT_BINARY and dt.is_int(dtype):
            return np.asarray(_INT_BINARY[op](*args, dtype)).astype(np_dtype, copy=False)
        if op in _BINARY:
            a, b = args
            if op in _IN_RESULT_DTYPE and dt.promote(*arg_dtypes) != dtype:
                a, b = a.astype(np_dtype), b.astype(np_dtype)
            return np.asarray(_BINARY[op](a, b)).astype(np_dtype, copy=False)
        if op == "select":
            c, a, b = args
            return np.where(c, a, b).astype(np_dtype, copy=False)
        if op == "cast":
            x = np.asarray(args[0])
            if dtype == "bool":
                return x != 0
            if dt.is_int(dtype) and dt.is_float(arg_dtypes[0]):
                x = np.where(np.isfinite(x), x, 0)
            return x.astype(np_dtype)
    raise InterpError(f"the interpreter has no rule for op {op!r}")
