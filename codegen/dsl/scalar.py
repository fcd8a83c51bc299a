"""Elementwise maths on values: each function is one scalar op of the IR (spec/ir/expr.py).

``exp``, ``log``, ``sqrt``, ``sigmoid``, ``tanh``, ... map one to one onto the IR's unary ops;
``maximum``, ``minimum``, ``pow``, ``atan2`` onto its binary ones; ``where(c, a, b)`` is
``select``. Operators (``+ - * / // % **``, comparisons, ``& | ~``) are on the values
themselves (values.py). Dims align by name, so ``exp(a - m)`` with ``m`` lacking a dim of ``a``
broadcasts it, as the maths means.
"""

from __future__ import annotations

from mlpack.spec.ir import expr as ex
from mlpack.codegen.dsl.values import Value, apply, as_value


def _unary(op: str):
    def fn(x) -> Value:
        return apply(op, x)
    fn.__name__ = op
    fn.__doc__ = f"Elementwise {op} (the IR's unary op {op!r})."
    return fn


# every unary op of the IR, under its IR name (recip, sigmoid, erf, ...); `not` is logical_not
UNARY = sorted(ex.UNARY - {"not"})
for _op in UNARY:
    globals()[_op] = _unary(_op)
logical_not = _unary("not")


def maximum(a, b) -> Value: return apply("max", a, b)
def minimum(a, b) -> Value: return apply("min", a, b)
def pow(a, b) -> Value: return apply("pow", a, b)   # noqa: A001 (the maths' name)
def atan2(a, b) -> Value: return apply("atan2", a, b)
def fmod(a, b) -> Value: return apply("fmod", a, b)
def eq(a, b) -> Value: return apply("eq", a, b)
def ne(a, b) -> Value: return apply("ne", a, b)


def where(cond, a, b) -> Value:
    """``a`` where ``cond`` holds, else ``b`` (the IR's select)."""
    return apply("select", cond, a, b)


def cast(x, dtype: str) -> Value:
    """``x`` converted to ``dtype`` (an IR dtype name: f32, f16, i64, bool, ...)."""
    return as_value(x).astype(dtype)


def square(x) -> Value:
    x = as_value(x)
    return x * x


def relu(x) -> Value:
    return maximum(x, 0.0)


__all__ = UNARY + ["logical_not", "maximum", "minimum", "pow", "atan2", "fmod", "eq", "ne",
                   "where", "cast", "square", "relu"]
