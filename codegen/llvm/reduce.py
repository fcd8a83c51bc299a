"""Reductions' steps in LLVM IR: the identity a reduction starts from, how one more term joins
the running value, and when a term replaces an argmax/argmin's running best.

Max and min propagate NaN (``oprules.float_minmax``; into a scalar accumulator, the NaN test
beside a vmaxps step, ``extreme_step``, as ``oprules.float_extreme_chain`` does over a pooling
window's terms); argmax and argmin keep the first NaN, as NumPy does; sums and products may
reassociate (``FAST_SUM``), which the fp32 tolerance allows.
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


# an inner float max/min keeps its running extreme as x86's vmaxps / vminps would (a NaN term
# is skipped) and the NaN test of its terms beside it (``extreme_step``, ``extreme_result``)
RELAXED = ("nnan", "nsz")


def is_float_extreme(kind: str, dtype: str) -> bool:
    """Whether a scalar-accumulator reduction takes ``extreme_step``: a float max or min."""
    return kind in ("max", "min") and dtype in FLOAT_TYPES


def extreme_step(b: ir.IRBuilder, kind: str, acc, x, nan):
    """(running extreme, any NaN so far) with the term ``x`` joined.

    llvm.maximum propagates a NaN and orders -0 below +0 in every step, five vector
    instructions on x86 chained from one step to the next (Whisper's attention's row maxes,
    1500 terms a row). Here a step is a compare and a select that LLVM vectorizes as vmaxps,
    its flags saying that NaN and the sign of zero need not be kept (a NaN term makes the
    compare poison, which ``extreme_result`` never returns), and the NaN test of the terms is
    or-ed beside it: off the chain. Signed zeros may come out either way (they compare equal
    at any tolerance, as ``float_minmax`` says)."""
    better = b.fcmp_ordered(">" if kind == "max" else "<", x, acc, flags=RELAXED)
    return (b.select(better, x, acc, flags=RELAXED),
            b.or_(nan, b.fcmp_unordered("uno", x, x)))


def extreme_result(b: ir.IRBuilder, acc, nan):
    """The reduction's value: NaN where any term was, else the running extreme."""
    return b.select(nan, ir.Constant(acc.type, float("nan")), acc)
