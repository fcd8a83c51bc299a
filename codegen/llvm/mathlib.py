"""Transcendental functions as straight-line LLVM IR that vectorizes and needs no libm.

``llvm.exp``/``llvm.log``/``llvm.sin``/... lower to libm calls, which a kernel library may not
import, so each function here is emitted inline: range reduction with ``rint`` and integer bit
tricks, then a polynomial or rational approximation (Cephes' single-precision ones, fdlibm's
for the f64 exp/log) evaluated with ``llvm.fmuladd`` (an FMA where the target has one, a
multiply and an add otherwise; never a libcall). Only intrinsics that lower to instructions on
every target are used (fabs, copysign, sqrt, rint, trunc, minnum/maxnum, fmuladd).

This module is the library's entry (``emit``, ``emit_binary``) and holds erf, pow and fmod; exp
and log are in mathbase.py, sin to atan2 in trig.py, tanh, sigmoid and sinh to atanh in
hyperbolic.py.

Accuracy in f32, measured against float64 NumPy/math on dense grids (tests/codegen/targets/
test_cpu_mathlib.py and test_cpu_math_dtypes.py check these bounds, with ~1.5x slack):

=========  ==========================  ============================================
function   range                       max error (f32, measured)
=========  ==========================  ============================================
exp        [-87.33, 88]                relative 1e-7 (~1 ulp); 0 below -87.336 (no
                                       denormal), inf above 88.72
log        [1e-38, 3e38] and denormals relative 1e-7 where |log x| >= 0.05, absolute 1e-8 nearer 1
tanh       all                         relative 1.5e-7 (absolute 1e-7)
sigmoid    [-80, inf)                  relative 1.5e-7 (absolute 1e-7); 0 below -87.336 (no
                                       denormal)
erf        all                         absolute and relative 4.5e-7 (7 ulp near +-1)
sin, cos   |x| <= 1.6e6                absolute 9e-8, relative 1.25e-7 (1.5 ulp); reduction by
                                       pi/2 in f64 (3-part Cody-Waite), exact up to 1.6e6;
                                       absolute error ~|x| 1e-16 above; in [-1, 1] always
tan        |x| <= 1.6e6                relative 1.6e-7 (2.3 ulp)
asin/acos  [-1, 1]                     relative 2.6e-7 / 1.4e-7 (2.2 / 1.2 ulp)
atan       all                         relative 1.7e-7 (2.2 ulp)
atan2      all (signed zeros, infs)    relative 2e-7
sinh/cosh  |x| <= 89 (inf beyond)      relative 1.7e-7 (2.3 ulp)
asinh      all                         relative 1.1e-7
acosh      [1, 3e38]                   relative 1.1e-7
atanh      (-1, 1)                     relative 1.4e-7
pow        all                         relative 6e-8 (<= 1 ulp): exp(x log|a|) in f64
fmod       |a/x| < 2^29                exact (computed in f64, where the product is exact)
=========  ==========================  ============================================

pow follows C/NumPy: a negative base with an integer exponent gives the signed power, with a
fractional one nan; pow(x, 0) = pow(1, y) = 1 (nan included), pow(-1, +-inf) = 1, signed zeros
and infinities as C. f64 operands: exp, log and pow compute in f64 (error ~2 ulp, and for pow
~|x log a| 2^-52 relative); fmod in f64 (exact while the quotient times x is); every other
function computes in f32 (converted in and out), so f64 results carry the f32 error above.
Special values: nan in gives nan out; exp(-inf)=0, exp(inf)=inf, log(0)=-inf, log(x<0)=nan,
log(inf)=inf, tanh/erf(+-inf)=+-1, sigmoid(-inf)=0, sigmoid(inf)=1, sin/cos/tan(+-inf)=nan,
asin/acos outside [-1, 1] and acosh below 1 nan, atanh(+-1)=+-inf, odd functions keep -0.
"""

from __future__ import annotations

import math

from llvmlite import ir

from mlpack.codegen.llvm import hyperbolic, mathbase, trig
from mlpack.codegen.llvm.mathbase import F32, F64, I64, Math, exp64, log64
from mlpack.spec.ir.erf import ERF32_ALPHA, ERF32_BETA, ERF32_CLAMP

FUNCTIONS = ("exp", "log", "tanh", "sigmoid", "erf", "sin", "cos", "tan", "asin", "acos", "atan",
             "sinh", "cosh", "asinh", "acosh", "atanh")
BINARY_FUNCTIONS = ("pow", "atan2", "fmod")


# ---------------------------------------------------------------- erf

def _erf(M: Math, x):
    """Rational minimax x P(x^2) / Q(x^2) on [-4, 4] (erf is +-1 in f32 beyond): the
    coefficients the portable interpreter evaluates too (spec/ir/erf.py's ``erf32``)."""
    b = M.b
    xc = M.clamp(x, -ERF32_CLAMP, ERF32_CLAMP)
    z = b.fmul(xc, xc)
    p = b.fmul(xc, M.poly(z, ERF32_ALPHA))
    q = M.poly(z, ERF32_BETA)
    out = b.fdiv(p, q)
    return b.select(M.isnan(x), x, out)


# ---------------------------------------------------------------- pow, fmod


_POW_SQUARING_MAX = 64.0   # |x| up to 2^6: six squarings


def _pow_by_squaring(D: Math, a, n):
    """a ** n for an f64 integer-valued n with |n| <= 64, by binary exponentiation; a
    negative n takes the reciprocal at the end. (n outside that range: any value; the caller
    does not select it, and the clamp keeps the conversion defined.)"""
    b = D.b
    k = b.fptosi(D.clamp(D.abs(n), 0.0, _POW_SQUARING_MAX), I64)
    r, base = D.c(1.0), a
    for i in range(7):
        bit = b.trunc(b.lshr(k, ir.Constant(I64, i)), ir.IntType(1))
        r = D.sel(bit, b.fmul(r, base), r)
        base = b.fmul(base, base)
    return D.sel(D.lt(n, 0.0), b.fdiv(D.c(1.0), r), r)


def _pow(M: Math, a, x):
    """C/NumPy pow: exp(x log|a|) computed in f64 (so f32 results are within 1 ulp), negated
    for a negative base and odd integer x, nan for a negative finite base and fractional x;
    x = 0 or a = 1 give 1 (even with nan), |a| = 1 with x = +-inf gives 1."""
    b = M.b
    D = Math(b, F64)
    ad, xd = M.to(a, F64), M.to(x, F64)
    r = exp64(D, b.fmul(xd, log64(D, D.abs(ad))))
    xi = M.call("llvm.rint", x)
    is_int = b.fcmp_ordered("==", xi, x)
    # small integer exponents by repeated squaring in f64: exact wherever the result is, as
    # NumPy's pow is (3 ** 6 must be 729, not 728.99.., once an integer output truncates it)
    small = b.and_(is_int, b.fcmp_ordered("<=", M.abs(x), M.c(_POW_SQUARING_MAX)))
    r = D.sel(small, _pow_by_squaring(D, D.abs(ad), M.to(xi, F64)), r)   # |a|: sign below
    r = M.to(r, M.ty)
    half = b.fmul(xi, M.c(0.5))
    odd = b.and_(is_int, b.fcmp_ordered("!=", M.call("llvm.rint", half), half))
    sign = b.icmp_signed("<", b.bitcast(a, M.ity), M.ci(0))
    r = M.sel(b.and_(sign, odd), b.fneg(r), r)
    finite_neg = b.and_(M.lt(a, 0.0), M.gt(a, -math.inf))
    r = M.sel(b.and_(finite_neg, b.xor(is_int, ir.Constant(ir.IntType(1), 1))), M.c(math.nan), r)
    one = b.or_(b.fcmp_ordered("==", x, M.c(0.0)), b.fcmp_ordered("==", a, M.c(1.0)))
    unit = b.and_(b.fcmp_ordered("==", M.abs(a), M.c(1.0)),
                  b.fcmp_ordered("==", M.abs(x), M.c(math.inf)))
    return M.sel(b.or_(one, unit), M.c(1.0), r)


def _fmod(M: Math, a, x):
    """C fmod: a - trunc(a/x) x. f32 operands work in f64, where the product is exact, so the
    result is exact while |a/x| < 2^29; f64 is exact while the product is (|a/x| small). A
    quotient rounded up to the next integer leaves a remainder of the wrong sign, fixed by one
    more x. fmod(a, +-inf) = a; x = 0 or a = +-inf give nan."""
    b = M.b
    wide = F64 if M.ty == F32 else M.ty
    W = Math(b, wide)
    ad, xd = M.to(a, wide), M.to(x, wide)
    q = W.call("llvm.trunc", b.fdiv(ad, xd))
    r = b.fsub(ad, b.fmul(q, xd))
    wrong = b.and_(b.fcmp_ordered("!=", r, W.c(0.0)),
                   b.xor(W.lt(r, 0.0), b.icmp_signed("<", b.bitcast(ad, W.ity), W.ci(0))))
    r = W.sel(wrong, b.fadd(r, W.call("llvm.copysign", xd, ad)), r)
    r = M.to(W.call("llvm.copysign", r, ad), M.ty)
    keep = b.and_(b.fcmp_ordered("==", M.abs(x), M.c(math.inf)),
                  b.fcmp_ordered("<", M.abs(a), M.c(math.inf)))
    return M.sel(keep, a, r)


_EMIT = {"exp": mathbase.exp, "log": mathbase.log, "tanh": hyperbolic.tanh,
         "sigmoid": hyperbolic.sigmoid, "erf": _erf, "sin": trig.sin, "cos": trig.cos,
         "tan": trig.tan, "asin": trig.asin, "acos": trig.acos, "atan": trig.atan,
         "sinh": hyperbolic.sinh, "cosh": hyperbolic.cosh, "asinh": hyperbolic.asinh,
         "acosh": hyperbolic.acosh, "atanh": hyperbolic.atanh}
_EMIT64 = {"exp": mathbase.exp64, "log": mathbase.log64}
_EMIT2 = {"pow": _pow, "atan2": trig.atan2, "fmod": _fmod}
# pow and fmod work in f64 themselves, so f64 operands stay f64; atan2 goes through f32
_BINARY_F64 = ("pow", "fmod")


def emit(b: ir.IRBuilder, name: str, x):
    """Emit ``name(x)`` for a float or double ``x`` at the builder's position."""
    if x.type == F32:
        return _EMIT[name](Math(b), x)
    if name in _EMIT64:
        return _EMIT64[name](Math(b, F64), x)
    return b.fpext(_EMIT[name](Math(b), b.fptrunc(x, F32)), x.type)


def emit_binary(b: ir.IRBuilder, name: str, a, x):
    """Emit ``name(a, x)`` (pow, atan2, fmod) for two floats or two doubles."""
    if a.type == F32 or name in _BINARY_F64:
        return _EMIT2[name](Math(b, a.type), a, x)
    out = _EMIT2[name](Math(b), b.fptrunc(a, F32), b.fptrunc(x, F32))
    return b.fpext(out, a.type)
