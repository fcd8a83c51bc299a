"""Transcendental functions as straight-line LLVM IR that vectorizes and needs no libm.

``llvm.exp``/``llvm.log``/... lower to libm calls, which a kernel library may not import, so
each function here is emitted inline: range reduction with ``rint`` and integer bit tricks,
then a polynomial or rational approximation evaluated with ``llvm.fmuladd`` (an FMA where the
target has one, a multiply and an add otherwise; never a libcall). Only intrinsics that lower
to instructions on every target are used (fabs, rint, minnum/maxnum, fmuladd).

Accuracy in f32, measured against float64 NumPy/math on dense grids (tests/codegen/targets/
test_cpu_mathlib.py checks these bounds):

=========  ==========================  ============================================
function   range                       max error (f32, measured; tests allow ~1.5x)
=========  ==========================  ============================================
exp        [-87, 88]                   relative 1e-7 (~1 ulp); 0 below -104, inf above 88.8
log        [1e-38, 3e38] and denormals relative 1e-7 where |log x| >= 0.05, absolute 1e-8 nearer 1
tanh       all                         relative 1.5e-7 (absolute 1e-7)
sigmoid    [-80, inf)                  relative 1.5e-7 (absolute 1e-7); 0 or denormal below
erf        all                         absolute and relative 4.5e-7 (7 ulp near +-1)
=========  ==========================  ============================================

f64 values are computed in f32 (converted in and out), so f64 results carry the f32 error.
Special values: nan in gives nan out; exp(-inf)=0, exp(inf)=inf, log(0)=-inf, log(x<0)=nan,
log(inf)=inf, tanh/erf(+-inf)=+-1, sigmoid(-inf)=0, sigmoid(inf)=1.
"""

from __future__ import annotations

import math

from llvmlite import ir

F32 = ir.FloatType()
I32 = ir.IntType(32)
FUNCTIONS = ("exp", "log", "tanh", "sigmoid", "erf")


def intrinsic(module: ir.Module, name: str, ty: ir.Type, nargs: int) -> ir.Function:
    """Declare (once) the LLVM intrinsic ``name`` overloaded on ``ty``."""
    suffix = {"float": "f32", "double": "f64", "half": "f16"}.get(str(ty), str(ty))
    full = f"{name}.{suffix}"
    if full in module.globals:
        return module.globals[full]
    return ir.Function(module, ir.FunctionType(ty, [ty] * nargs), name=full)


class _Math:
    """Emission helpers on one builder, all in f32."""

    def __init__(self, b: ir.IRBuilder):
        self.b = b
        self.m = b.module

    def c(self, v: float) -> ir.Constant:
        return ir.Constant(F32, float(v))

    def call(self, name: str, *args):
        return self.b.call(intrinsic(self.m, name, F32, len(args)), list(args))

    def fma(self, a, b, c):
        return self.call("llvm.fmuladd", a, b, c)

    def poly(self, x, coeffs):
        """Horner: coeffs from the highest degree down."""
        acc = self.c(coeffs[0])
        for k in coeffs[1:]:
            acc = self.fma(acc, x, self.c(k))
        return acc

    def clamp(self, x, lo: float, hi: float):
        return self.call("llvm.minnum", self.call("llvm.maxnum", x, self.c(lo)), self.c(hi))

    def isnan(self, x):
        return self.b.fcmp_unordered("uno", x, x)

    def pow2i(self, n):
        """2**n for an i32 n in [-126, 127], as f32 bits."""
        bits = self.b.shl(self.b.add(n, ir.Constant(I32, 127)), ir.Constant(I32, 23))
        return self.b.bitcast(bits, F32)


# ---------------------------------------------------------------- exp

_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4
_EXP_P = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
          1.6666665459e-1, 5.0000001201e-1)


def _exp(M: _Math, x):
    """Cephes expf: x = n ln2 + r, |r| <= ln2/2, e^r by a degree-7 polynomial, times 2^n.

    2^n is applied as two factors 2^(n//2) * 2^(n - n//2), so results down to the smallest
    denormal and up to overflow come out right without a branch."""
    b = M.b
    xc = M.clamp(x, -104.0, 88.8)
    n = M.call("llvm.rint", b.fmul(xc, M.c(1.0 / math.log(2.0))))
    r = M.fma(n, M.c(-_LN2_HI), xc)
    r = M.fma(n, M.c(-_LN2_LO), r)
    z = b.fmul(r, r)
    p = M.poly(r, _EXP_P)
    er = b.fadd(M.fma(p, z, r), M.c(1.0))
    ni = b.fptosi(n, I32)
    half = b.ashr(ni, ir.Constant(I32, 1))
    out = b.fmul(b.fmul(er, M.pow2i(half)), M.pow2i(b.sub(ni, half)))
    # inputs past the clamp: overflow to inf above, and nan stays nan
    out = b.select(b.fcmp_ordered(">", x, M.c(88.8)), M.c(math.inf), out)
    return b.select(M.isnan(x), x, out)


# ---------------------------------------------------------------- log

_LOG_P = (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1,
          1.4249322787e-1, -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1,
          3.3333331174e-1)


def _log(M: _Math, x):
    """Cephes logf: x = m 2^e with m in [sqrt(1/2), sqrt(2)), log(m) by a polynomial in m-1."""
    b = M.b
    tiny = b.fcmp_ordered("<", x, M.c(1.1754943508222875e-38))
    xs = b.select(tiny, b.fmul(x, M.c(2.0 ** 23)), x)      # denormals: scale up first
    bits = b.bitcast(xs, I32)
    e = b.sub(b.ashr(bits, ir.Constant(I32, 23)), ir.Constant(I32, 126))
    m = b.bitcast(b.or_(b.and_(bits, ir.Constant(I32, 0x007FFFFF)), ir.Constant(I32, 0x3F000000)),
                  F32)                                        # m in [0.5, 1)
    small = b.fcmp_ordered("<", m, M.c(0.707106781186547524))
    e = b.sub(e, b.zext(small, I32))
    m = b.fsub(b.select(small, b.fadd(m, m), m), M.c(1.0))
    ef = b.sitofp(e, F32)
    ef = b.fsub(ef, b.select(tiny, M.c(23.0), M.c(0.0)))
    z = b.fmul(m, m)
    y = b.fmul(b.fmul(M.poly(m, _LOG_P), m), z)
    y = M.fma(ef, M.c(_LN2_LO), y)
    y = M.fma(z, M.c(-0.5), y)
    out = M.fma(ef, M.c(_LN2_HI), b.fadd(m, y))
    out = b.select(b.fcmp_ordered("==", x, M.c(0.0)), M.c(-math.inf), out)
    out = b.select(b.fcmp_ordered("==", x, M.c(math.inf)), x, out)
    out = b.select(b.fcmp_ordered("<", x, M.c(0.0)), M.c(math.nan), out)
    return b.select(M.isnan(x), x, out)


# ---------------------------------------------------------------- tanh, sigmoid

_TANH_P = (-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1,
           -3.33332819422e-1)


def _tanh(M: _Math, x):
    """Cephes tanhf: x + x^3 P(x^2) for |x| < 0.625, else sign(x) (1 - 2 / (e^{2|x|} + 1))."""
    b = M.b
    ax = M.call("llvm.fabs", x)
    z = b.fmul(x, x)
    small = M.fma(b.fmul(M.poly(z, _TANH_P), z), x, x)
    e = _exp(M, b.fmul(M.clamp(ax, 0.0, 20.0), M.c(2.0)))
    big = b.fsub(M.c(1.0), b.fdiv(M.c(2.0), b.fadd(e, M.c(1.0))))
    big = M.call("llvm.copysign", big, x)
    out = b.select(b.fcmp_ordered("<", ax, M.c(0.625)), small, big)
    return b.select(M.isnan(x), x, out)


def _sigmoid(M: _Math, x):
    """1 / (1 + e^-x): e^-x overflows to inf for x < -88.8, giving exactly 0."""
    b = M.b
    return b.fdiv(M.c(1.0), b.fadd(M.c(1.0), _exp(M, b.fneg(x))))


# ---------------------------------------------------------------- erf

_ERF_ALPHA = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
              -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
              -1.60960333262415e-02)
_ERF_BETA = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
             -7.37332916720468e-03, -1.42647390514189e-02)


def _erf(M: _Math, x):
    """Rational minimax x P(x^2) / Q(x^2) on [-4, 4] (erf is +-1 in f32 beyond)."""
    b = M.b
    xc = M.clamp(x, -4.0, 4.0)
    z = b.fmul(xc, xc)
    p = b.fmul(xc, M.poly(z, _ERF_ALPHA))
    q = M.poly(z, _ERF_BETA)
    out = b.fdiv(p, q)
    return b.select(M.isnan(x), x, out)


_EMIT = {"exp": _exp, "log": _log, "tanh": _tanh, "sigmoid": _sigmoid, "erf": _erf}


def emit(b: ir.IRBuilder, name: str, x):
    """Emit ``name(x)`` for a float or double ``x`` at the builder's position."""
    M = _Math(b)
    if x.type == F32:
        return _EMIT[name](M, x)
    return b.fpext(_EMIT[name](M, b.fptrunc(x, F32)), x.type)
