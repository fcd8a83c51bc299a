"""The hyperbolic functions of the math library, and the logistic sigmoid (tanh's relative):
tanh, sigmoid, sinh, cosh, asinh, acosh, atanh, built on exp and log (mathlib.py states their
accuracy).
"""

from __future__ import annotations

import math

from mlpack.codegen.llvm.mathbase import EXP_BOUNDED, EXP_FLUSH, Math, exp, exp_bounded, log


# ---------------------------------------------------------------- tanh, sigmoid

_TANH_P = (-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1,
           -3.33332819422e-1)


def tanh(M: Math, x):
    """Cephes tanhf: x + x^3 P(x^2) for |x| < 0.625, else sign(x) (1 - 2 / (e^{2|x|} + 1))."""
    b = M.b
    ax = M.call("llvm.fabs", x)
    z = b.fmul(x, x)
    small = M.fma(b.fmul(M.poly(z, _TANH_P), z), x, x)
    e = exp_bounded(M, b.fmul(M.clamp(ax, 0.0, 20.0), M.c(2.0)))
    big = b.fsub(M.c(1.0), b.fdiv(M.c(2.0), b.fadd(e, M.c(1.0))))
    big = M.call("llvm.copysign", big, x)
    out = b.select(b.fcmp_ordered("<", ax, M.c(0.625)), small, big)
    return b.select(M.isnan(x), x, out)


def sigmoid(M: Math, x):
    """1 / (1 + e^-x), with no denormal on the way or out (mathbase.exp's reason): e^-x is
    ``exp_bounded``'s, whose smallest value is normal, and where 1 / (1 + e^-x) would be a
    denormal (x < EXP_FLUSH) the result is 0."""
    b = M.b
    lo, hi = EXP_BOUNDED
    t = b.fneg(x)   # (clamped by compares, which keep a nan: it comes out of the arithmetic)
    t = M.sel(M.gt(t, hi), M.c(hi), t)
    t = M.sel(M.lt(t, lo), M.c(lo), t)
    out = b.fdiv(M.c(1.0), b.fadd(M.c(1.0), exp_bounded(M, t)))
    return M.sel(M.lt(x, EXP_FLUSH), M.c(0.0), out)


# ---------------------------------------------------------------- hyperbolic

_SINH_P = (2.03721912945e-4, 8.33028376239e-3, 1.66667160211e-1)
_ASINH_P = (2.0122003309e-2, -4.2699340972e-2, 7.4847586088e-2, -1.6666288134e-1)
_ACOSH_P = (1.7596881071e-3, -7.5272886713e-3, 2.6454905019e-2, -1.1784741703e-1, 1.4142135263e0)
_ATANH_P = (1.81740078349e-1, 8.24370301058e-2, 1.46691431730e-1, 1.99782164500e-1,
            3.33337300303e-1)
_LN2 = math.log(2.0)


def _exp_pair(M: Math, ax):
    """(e^|x| / 2, e^-|x| / 2), without overflow up to |x| ~ 177 (the f32 range of sinh)."""
    b = M.b
    e = exp(M, ax)
    h = exp(M, b.fmul(ax, M.c(0.5)))
    half = M.sel(M.gt(ax, 88.0), b.fmul(b.fmul(h, M.c(0.5)), h), b.fmul(e, M.c(0.5)))
    return half, b.fdiv(M.c(0.5), e)


def sinh(M: Math, x):
    """Cephes sinhf: x + x^3 P(x^2) for |x| <= 1, else (e^|x| - e^-|x|) / 2 with x's sign."""
    b = M.b
    ax = M.abs(x)
    z = b.fmul(x, x)
    small = M.fma(b.fmul(x, z), M.poly(z, _SINH_P), x)
    hi, lo = _exp_pair(M, ax)
    big = M.call("llvm.copysign", b.fsub(hi, lo), x)
    return M.keep_nan(x, M.sel(M.gt(ax, 1.0), big, small))


def cosh(M: Math, x):
    hi, lo = _exp_pair(M, M.abs(x))
    return M.keep_nan(x, M.b.fadd(hi, lo))


def asinh(M: Math, x):
    """Cephes asinhf: polynomial below 0.5, log(2|x|) above 1500, else log(|x| + sqrt(x^2+1))."""
    b = M.b
    ax = M.abs(x)
    z = b.fmul(x, x)
    small = M.fma(b.fmul(ax, z), M.poly(z, _ASINH_P), ax)
    mid = log(M, b.fadd(ax, M.call("llvm.sqrt", b.fadd(z, M.c(1.0)))))
    far = b.fadd(log(M, ax), M.c(_LN2))
    out = M.sel(M.lt(ax, 0.5), small, M.sel(M.gt(ax, 1500.0), far, mid))
    return M.keep_nan(x, M.call("llvm.copysign", out, x))


def acosh(M: Math, x):
    """Cephes acoshf: sqrt(z) P(z) for z = x - 1 < 0.5, log(2x) above 1500, nan below 1."""
    b = M.b
    z = b.fsub(x, M.c(1.0))
    small = b.fmul(M.call("llvm.sqrt", z), M.poly(z, _ACOSH_P))
    mid = log(M, b.fadd(x, M.call("llvm.sqrt", b.fmul(z, b.fadd(x, M.c(1.0))))))
    far = b.fadd(log(M, x), M.c(_LN2))
    out = M.sel(M.lt(z, 0.5), small, M.sel(M.gt(x, 1500.0), far, mid))
    return M.keep_nan(x, M.sel(M.lt(x, 1.0), M.c(math.nan), out))


def atanh(M: Math, x):
    """Cephes atanhf: x + x^3 P(x^2) for |x| < 0.5, else log((1+x) / (1-x)) / 2."""
    b = M.b
    z = b.fmul(x, x)
    small = M.fma(b.fmul(x, z), M.poly(z, _ATANH_P), x)
    big = b.fmul(M.c(0.5), log(M, b.fdiv(b.fadd(M.c(1.0), x), b.fsub(M.c(1.0), x))))
    return M.keep_nan(x, M.sel(M.lt(M.abs(x), 0.5), small, big))
