"""The LLVM rule of every scalar op of the IR, one table per dtype class.

Each table maps an op of spec/ir/expr.py's UNARY or BINARY to the function that emits it: a
unary rule takes ``(emitter, x, dtype)``, a binary one ``(emitter, a, x, dtype, pure)`` where
``pure`` says the operands are index arithmetic without reads (so ``nsw`` is safe). The emitter
(scalar.py's ScalarEmitter) gives the builder ``b``, ``intrinsic`` and ``cast``. Floats include
f16 and bf16, which are f32 in registers; bool ops that have no rule of their own take the
integer one. tests/codegen/test_scalar_ops.py fails when an op of the IR has no rule here (or in
the NumPy or C interpreters) and runs each one against the interpreter.

Semantics follow the interpreter (spec/ir/interp.py): integer division truncates and gives 0
for a zero divisor, ``//`` and ``%`` follow Python, shifts by the width or more give 0, max and
min propagate NaN, float ``ne`` is true on NaN.
"""

from __future__ import annotations

import math

from llvmlite import ir

from mlpack.codegen.llvm import mathlib
from mlpack.codegen.llvm.types import FLOAT_TYPES, I1, is_signed
from mlpack.spec.ir import dtypes as dt

CONTRACT = ("contract",)             # a*b+c may become an fma
_FLOAT_REL = {"eq": "==", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_INT_REL = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def unary(em, op: str, x, dtype: str):
    """x's op, by the rule of its dtype class; None where there is none."""
    table = FLOAT_UNARY if dtype in FLOAT_TYPES else BOOL_UNARY if dtype == "bool" else INT_UNARY
    rule = table.get(op)
    return None if rule is None else rule(em, x, dtype)


def binary(em, op: str, a, x, dtype: str, pure: bool):
    """a op x (operands of the one dtype), by the rule of its dtype class; None where none."""
    if dtype in FLOAT_TYPES:
        rule = FLOAT_BINARY.get(op)
    else:
        rule = BOOL_BINARY.get(op) if dtype == "bool" else None
        rule = rule or INT_BINARY.get(op)
    return None if rule is None else rule(em, a, x, dtype, pure)


# ---------------------------------------------------------------- floats

def _float_sign(em, x, dtype):
    b, ty = em.b, x.type
    one = ir.Constant(ty, 1.0)
    pos = b.fcmp_ordered(">", x, ir.Constant(ty, 0.0))
    neg = b.fcmp_ordered("<", x, ir.Constant(ty, 0.0))
    return b.select(pos, one, b.select(neg, ir.Constant(ty, -1.0), x))


def _float_isinf(em, x, dtype):
    return em.b.fcmp_ordered("==", em.intrinsic("llvm.fabs", x.type, x),
                             ir.Constant(x.type, math.inf))


def _intrinsic(name: str):
    return lambda em, x, dtype: em.intrinsic(name, x.type, x)


def _mathlib(name: str):
    return lambda em, x, dtype: mathlib.emit(em.b, name, x)


FLOAT_UNARY = {
    **{f: _mathlib(f) for f in mathlib.FUNCTIONS},
    "neg": lambda em, x, dtype: em.b.fneg(x),
    "abs": _intrinsic("llvm.fabs"),
    "sqrt": _intrinsic("llvm.sqrt"),
    "floor": _intrinsic("llvm.floor"),
    "ceil": _intrinsic("llvm.ceil"),
    "round": _intrinsic("llvm.rint"),      # half to even, as NumPy
    "recip": lambda em, x, dtype: em.b.fdiv(ir.Constant(x.type, 1.0), x),
    "sign": _float_sign,
    "isnan": lambda em, x, dtype: em.b.fcmp_unordered("uno", x, x),
    "isinf": _float_isinf,
}


def float_minmax(b: ir.IRBuilder, kind: str, a, x):
    """max(a, x) (min for kind "min") that propagates NaN, as compares and a select.

    llvm.maximum also orders -0 below +0, and its x86 lowering (blends on the sign bit plus
    NaN fix-ups) is several times longer than vmaxps and kept pooling windows from being
    vectorized; signed zeros compare equal at any tolerance, so they may come out either way."""
    rel = ">" if kind == "max" else "<"
    if isinstance(a, ir.Constant) and not isinstance(x, ir.Constant):
        a, x = x, a   # the constant second
    if isinstance(x, ir.Constant) and isinstance(x.constant, float) and not math.isnan(x.constant):
        # relu: a NaN ``a`` fails the compare and is kept
        return b.select(b.fcmp_ordered("<" if kind == "max" else ">", a, x), x, a)
    take_a = b.or_(b.fcmp_ordered(rel, a, x), b.fcmp_unordered("uno", a, a))
    return b.select(take_a, a, x)


def float_extreme_chain(b: ir.IRBuilder, kind: str, values: list):
    """max (min for kind "min") of three or more ``values`` that propagates NaN, as one
    select per value and one NaN test over them all: a pooling window's nine taps as
    ``float_minmax`` each were four vector instructions a tap (two compares, a mask or, a
    blend). Each select keeps the running extreme unless the value beats it (x86's vmaxps /
    vminps: a NaN on either side keeps the running one), and the NaN tests of the values,
    or-ed, LLVM pairs into one unordered compare of two values."""
    rel = ">" if kind == "max" else "<"
    ty = values[0].type
    out, nan = values[0], None
    for v in values[1:]:
        out = b.select(b.fcmp_ordered(rel, v, out), v, out)
    for v in values:
        if isinstance(v, ir.Constant) and isinstance(v.constant, float) \
                and not math.isnan(v.constant):
            continue
        test = b.fcmp_unordered("uno", v, v)
        nan = test if nan is None else b.or_(nan, test)
    if nan is None:
        return out
    quiet = ir.Constant(ty, [math.nan] * ty.count if isinstance(ty, ir.VectorType) else math.nan)
    return b.select(nan, quiet, out)


def _float_mod(em, a, x, dtype, pure):
    """Python/NumPy mod: the remainder takes the divisor's sign."""
    b = em.b
    r = mathlib.emit_binary(b, "fmod", a, x)
    zero = ir.Constant(a.type, 0.0)
    fix = b.and_(b.fcmp_ordered("!=", r, zero),
                 b.icmp_unsigned("!=", b.fcmp_ordered("<", r, zero), b.fcmp_ordered("<", x, zero)))
    return b.select(fix, b.fadd(r, x), r)


def float_pow(b: ir.IRBuilder, a, x):
    """a**x: small constant integer exponents multiply; everything else is mathlib's pow."""
    if isinstance(x, ir.Constant) and x.constant in (1.0, 2.0, 3.0):
        out = a
        for _ in range(int(x.constant) - 1):
            out = b.fmul(out, a)
        return out
    return mathlib.emit_binary(b, "pow", a, x)


def _float_rel(rel: str):
    return lambda em, a, x, dtype, pure: em.b.fcmp_ordered(rel, a, x)


FLOAT_BINARY = {
    "add": lambda em, a, x, dtype, pure: em.b.fadd(a, x, flags=CONTRACT),
    "sub": lambda em, a, x, dtype, pure: em.b.fsub(a, x, flags=CONTRACT),
    "mul": lambda em, a, x, dtype, pure: em.b.fmul(a, x, flags=CONTRACT),
    "div": lambda em, a, x, dtype, pure: em.b.fdiv(a, x),
    "max": lambda em, a, x, dtype, pure: float_minmax(em.b, "max", a, x),
    "min": lambda em, a, x, dtype, pure: float_minmax(em.b, "min", a, x),
    **{op: _float_rel(rel) for op, rel in _FLOAT_REL.items()},
    "ne": lambda em, a, x, dtype, pure: em.b.fcmp_unordered("!=", a, x),
    "floordiv": lambda em, a, x, dtype, pure: em.intrinsic("llvm.floor", a.type, em.b.fdiv(a, x)),
    "fmod": lambda em, a, x, dtype, pure: mathlib.emit_binary(em.b, "fmod", a, x),
    "mod": _float_mod,
    "pow": lambda em, a, x, dtype, pure: float_pow(em.b, a, x),
    "atan2": lambda em, a, x, dtype, pure: mathlib.emit_binary(em.b, "atan2", a, x),
}


# ---------------------------------------------------------------- integers

def _int_abs(em, x, dtype):
    b, zero = em.b, ir.Constant(x.type, 0)
    return b.select(b.icmp_signed("<", x, zero), b.sub(zero, x), x) if is_signed(dtype) else x


def _int_sign(em, x, dtype):
    b, zero, one = em.b, ir.Constant(x.type, 0), ir.Constant(x.type, 1)
    if not is_signed(dtype):
        return b.zext(b.icmp_unsigned("!=", x, zero), x.type)
    return b.select(b.icmp_signed(">", x, zero), one,
                    b.select(b.icmp_signed("<", x, zero), ir.Constant(x.type, -1), zero))


def int_div(b: ir.IRBuilder, a, x, dtype: str):
    """C division; x == 0 gives 0 and INT_MIN / -1 wraps instead of trapping."""
    zero, one = ir.Constant(a.type, 0), ir.Constant(a.type, 1)
    if not is_signed(dtype):
        safe = b.select(b.icmp_unsigned("==", x, zero), one, x)
        return b.select(b.icmp_unsigned("==", x, zero), zero, b.udiv(a, safe))
    m1 = ir.Constant(a.type, -1)
    bad = b.or_(b.icmp_signed("==", x, zero), b.icmp_signed("==", x, m1))
    q = b.sdiv(a, b.select(bad, one, x))
    q = b.select(b.icmp_signed("==", x, m1), b.sub(zero, a), q)
    return b.select(b.icmp_signed("==", x, zero), zero, q)


def _identity(em, x, dtype):
    return x


INT_UNARY = {
    "neg": lambda em, x, dtype: em.b.sub(ir.Constant(x.type, 0), x),
    "abs": _int_abs,
    "sign": _int_sign,
    "bitnot": lambda em, x, dtype: em.b.xor(x, ir.Constant(x.type, -1)),
    "recip": lambda em, x, dtype: int_div(em.b, ir.Constant(x.type, 1), x, dtype),
    "floor": _identity,
    "ceil": _identity,
    "round": _identity,
    "isnan": lambda em, x, dtype: ir.Constant(I1, 0),
    "isinf": lambda em, x, dtype: ir.Constant(I1, 0),
}


def _int_floor(op: str):
    """Python // and % (x == 0 gives 0)."""
    def rule(em, a, x, dtype, pure):
        b = em.b
        zero, one = ir.Constant(a.type, 0), ir.Constant(a.type, 1)
        if not is_signed(dtype):
            safe = b.select(b.icmp_unsigned("==", x, zero), one, x)
            r = b.udiv(a, safe) if op == "floordiv" else b.urem(a, safe)
            return b.select(b.icmp_unsigned("==", x, zero), zero, r)
        if isinstance(x, ir.Constant) and x.constant > 0:
            q, r = b.sdiv(a, x), b.srem(a, x)
            fix = b.icmp_signed("<", r, zero)
            if op == "floordiv":
                return b.sub(q, b.zext(fix, a.type))
            return b.select(fix, b.add(r, x), r)
        m1 = ir.Constant(a.type, -1)
        bad = b.or_(b.icmp_signed("==", x, zero), b.icmp_signed("==", x, m1))
        safe = b.select(bad, one, x)
        q, r = b.sdiv(a, safe), b.srem(a, safe)
        fix = b.and_(b.icmp_signed("!=", r, zero),
                     b.icmp_signed("!=", b.icmp_signed("<", r, zero), b.icmp_signed("<", safe, zero)))
        if op == "floordiv":
            q = b.sub(q, b.zext(fix, a.type))
            q = b.select(b.icmp_signed("==", x, m1), b.sub(zero, a), q)
        else:
            q = b.select(fix, b.add(r, safe), r)
            q = b.select(b.icmp_signed("==", x, m1), zero, q)
        return b.select(b.icmp_signed("==", x, zero), zero, q)
    return rule


def _int_shift(op: str):
    """Shifts by the width or more give 0 (LLVM's would be poison)."""
    def rule(em, a, x, dtype, pure):
        b = em.b
        w = ir.Constant(a.type, dt.bits(dtype))
        amt = b.select(b.icmp_unsigned("<", x, w), x, ir.Constant(a.type, 0))
        r = b.shl(a, amt) if op == "shl" else (b.ashr(a, amt) if is_signed(dtype) else b.lshr(a, amt))
        return b.select(b.icmp_unsigned("<", x, w), r, ir.Constant(a.type, 0))
    return rule


def _int_pow(em, a, x, dtype, pure):
    """Exact (wrapping) square-and-multiply for exponents >= 0, as NumPy's f64 pow is exact
    in that range; negative exponents (0, +-1 or a cast inf) take the f64 pow, rounded."""
    b = em.b
    zero, one = ir.Constant(a.type, 0), ir.Constant(a.type, 1)
    # exponents past 63 overflow unless |a| <= 1, where only their parity matters
    big = b.icmp_unsigned(">", x, ir.Constant(a.type, 63))
    e = b.select(big, b.or_(ir.Constant(a.type, 62), b.and_(x, one)), x)
    acc, sq = one, a
    for bit in range(6):
        on = b.icmp_unsigned("!=", b.and_(e, ir.Constant(a.type, 1 << bit)), zero)
        acc = b.select(on, b.mul(acc, sq), acc)
        sq = b.mul(sq, sq)
    if not is_signed(dtype):
        return acc
    fa = em.cast(a, dtype, "f64")
    fx = em.cast(x, dtype, "f64")
    p = em.intrinsic("llvm.rint", ir.DoubleType(), float_pow(b, fa, fx))
    return b.select(b.icmp_signed("<", x, zero), em.cast(p, "f64", dtype), acc)


def _int_minmax(kind: str):
    def rule(em, a, x, dtype, pure):
        cmp = em.b.icmp_signed if is_signed(dtype) else em.b.icmp_unsigned
        return em.b.select(cmp(">" if kind == "max" else "<", a, x), a, x)
    return rule


def _int_rel(rel: str):
    def rule(em, a, x, dtype, pure):
        cmp = em.b.icmp_signed if is_signed(dtype) else em.b.icmp_unsigned
        return cmp(rel, a, x)
    return rule


def _nsw(pure: bool):
    return ("nsw",) if pure else ()


INT_BINARY = {
    "add": lambda em, a, x, dtype, pure: em.b.add(a, x, flags=_nsw(pure)),
    "sub": lambda em, a, x, dtype, pure: em.b.sub(a, x, flags=_nsw(pure)),
    "mul": lambda em, a, x, dtype, pure: em.b.mul(a, x, flags=_nsw(pure)),
    "div": lambda em, a, x, dtype, pure: int_div(em.b, a, x, dtype),
    "floordiv": _int_floor("floordiv"),
    "mod": _int_floor("mod"),
    "fmod": lambda em, a, x, dtype, pure: (em.b.srem(a, x) if is_signed(dtype)
                                           else em.b.urem(a, x)),
    "max": _int_minmax("max"),
    "min": _int_minmax("min"),
    **{op: _int_rel(rel) for op, rel in _INT_REL.items()},
    "and": lambda em, a, x, dtype, pure: em.b.and_(a, x),
    "bitand": lambda em, a, x, dtype, pure: em.b.and_(a, x),
    "or": lambda em, a, x, dtype, pure: em.b.or_(a, x),
    "bitor": lambda em, a, x, dtype, pure: em.b.or_(a, x),
    "xor": lambda em, a, x, dtype, pure: em.b.xor(a, x),
    "bitxor": lambda em, a, x, dtype, pure: em.b.xor(a, x),
    "shl": _int_shift("shl"),
    "shr": _int_shift("shr"),
    "pow": _int_pow,
}


# ---------------------------------------------------------------- bools (i1)

BOOL_UNARY = {
    "not": lambda em, x, dtype: em.b.xor(x, ir.Constant(I1, 1)),
    "abs": _identity,
}

BOOL_BINARY = {
    "and": INT_BINARY["and"], "bitand": INT_BINARY["and"], "min": INT_BINARY["and"],
    "or": INT_BINARY["or"], "bitor": INT_BINARY["or"], "max": INT_BINARY["or"],
    "xor": INT_BINARY["xor"], "bitxor": INT_BINARY["xor"],
    "eq": lambda em, a, x, dtype, pure: em.b.icmp_unsigned("==", a, x),
    "ne": lambda em, a, x, dtype, pure: em.b.icmp_unsigned("!=", a, x),
}
