"""Reductions' steps in LLVM IR: the identity a reduction starts from, how one more term joins
the running value, and when a term replaces an argmax/argmin's running best.

Max and min propagate NaN (``oprules.float_minmax``); argmax and argmin keep the first NaN, as
NumPy does; sums and products may reassociate (``FAST_SUM``), which the fp32 tolerance allows.
A target's schedule decides where the running value lives (a register, an output row).
"""

from __future__ import annotations

from llvmlite import ir

from mlpack.spec.ir import dtypes as dt
from mlpack.codegen.llvm.oprules import float_minmax
from mlpack.codegen.llvm.scalar import FAST_SUM, ScalarEmitter
from mlpack.codegen.llvm.types import FLOAT_TYPES, const, is_signed


def identity(kind: str, dtype: str) -> ir.Constant:
    """The value a ``kind`` reduction over ``dtype`` starts from."""
    if kind == "sum":
        return const(dtype, 0)
    if kind == "prod":
        return const(dtype, 1)
    if kind in ("max", "argmax", "argmax_last"):
        return const(dtype, dt.lowest(dtype))
    return const(dtype, dt.highest(dtype))


def combine(E: ScalarEmitter, kind: str, acc, x, dtype: str, inner: bool = False):
    """The running value ``acc`` of a ``kind`` reduction with the term ``x`` joined; ``inner``:
    ``acc`` is a scalar accumulator (not an output row)."""
    b = E.b
    if dtype in FLOAT_TYPES:
        if kind == "sum":
            return b.fadd(acc, x, flags=FAST_SUM)
        if kind == "prod":
            return b.fmul(acc, x, flags=FAST_SUM)
        if inner:   # a scalar accumulator: the vectorizer turns llvm.maximum into a reduction
            return E.intrinsic("llvm.maximum" if kind == "max" else "llvm.minimum", acc.type, acc, x)
        return float_minmax(b, kind, x, acc)
    if dtype == "bool":
        return (b.or_ if kind in ("sum", "max") else b.and_)(acc, x)
    if kind == "sum":
        return b.add(acc, x)
    if kind == "prod":
        return b.mul(acc, x)
    cmp = b.icmp_signed if is_signed(dtype) else b.icmp_unsigned
    return b.select(cmp(">" if kind == "max" else "<", x, acc), x, acc)


def arg_better(E: ScalarEmitter, kind: str, x, best, dtype: str):
    """Whether x replaces the running best of an argmax/argmin (first or last occurrence)."""
    b = E.b
    last = kind.endswith("_last")
    if dtype in FLOAT_TYPES:
        rel = ("<=" if last else "<") if kind.startswith("argmin") else (">=" if last else ">")
        better = b.fcmp_ordered(rel, x, best)
        # numpy: the first nan wins
        first_nan = b.and_(b.fcmp_unordered("uno", x, x), b.fcmp_ordered("ord", best, best))
        return b.or_(better, first_nan)
    cmp = b.icmp_signed if is_signed(dtype) else b.icmp_unsigned
    rel = ("<=" if last else "<") if kind.startswith("argmin") else (">=" if last else ">")
    return cmp(rel, x, best)

