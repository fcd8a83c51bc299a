"""Transcendental functions as straight-line LLVM IR that vectorizes and needs no libm.

``llvm.exp``/``llvm.log``/``llvm.sin``/... lower to libm calls, which a kernel library may not
import, so each function here is emitted inline: range reduction with ``rint`` and integer bit
tricks, then a polynomial or rational approximation (Cephes' single-precision ones, fdlibm's
for the f64 exp/log) evaluated with ``llvm.fmuladd`` (an FMA where the target has one, a
multiply and an add otherwise; never a libcall). Only intrinsics that lower to instructions on
every target are used (fabs, copysign, sqrt, rint, trunc, minnum/maxnum, fmuladd).

Accuracy in f32, measured against float64 NumPy/math on dense grids (tests/codegen/targets/
test_cpu_mathlib.py and test_cpu_math_dtypes.py check these bounds, with ~1.5x slack):

=========  ==========================  ============================================
function   range                       max error (f32, measured)
=========  ==========================  ============================================
exp        [-87, 88]                   relative 1e-7 (~1 ulp); 0 below -104, inf above 88.8
log        [1e-38, 3e38] and denormals relative 1e-7 where |log x| >= 0.05, absolute 1e-8 nearer 1
tanh       all                         relative 1.5e-7 (absolute 1e-7)
sigmoid    [-80, inf)                  relative 1.5e-7 (absolute 1e-7); 0 or denormal below
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

F32 = ir.FloatType()
F64 = ir.DoubleType()
I32 = ir.IntType(32)
I64 = ir.IntType(64)
FUNCTIONS = ("exp", "log", "tanh", "sigmoid", "erf", "sin", "cos", "tan", "asin", "acos", "atan",
             "sinh", "cosh", "asinh", "acosh", "atanh")
BINARY_FUNCTIONS = ("pow", "atan2", "fmod")


def declare(module: ir.Module, name: str, fnty: ir.FunctionType) -> ir.Function:
    """The function ``name`` of ``module``, declared with ``fnty`` the first time it is asked for."""
    if name in module.globals:
        return module.globals[name]
    return ir.Function(module, fnty, name=name)


def type_suffix(ty: ir.Type) -> str:
    """How LLVM names an overloaded intrinsic's type: f32, f64, f16, i32, v16f32, ..."""
    if isinstance(ty, ir.VectorType):
        return f"v{ty.count}{type_suffix(ty.element)}"
    return {"float": "f32", "double": "f64", "half": "f16"}.get(str(ty), str(ty))


def intrinsic(module: ir.Module, name: str, ty: ir.Type, nargs: int) -> ir.Function:
    """Declare (once) the LLVM intrinsic ``name`` overloaded on ``ty`` (a scalar or vector)."""
    return declare(module, f"{name}.{type_suffix(ty)}", ir.FunctionType(ty, [ty] * nargs))


def masked_load(module: ir.Module, vty: ir.VectorType) -> ir.Function:
    """``llvm.masked.load`` of ``vty`` through an opaque pointer: (ptr, align, mask, passthru)."""
    return declare(module, f"llvm.masked.load.{type_suffix(vty)}.p0", ir.FunctionType(
        vty, [ir.PointerType(), I32, ir.VectorType(ir.IntType(1), vty.count), vty]))


class _Math:
    """Emission helpers on one builder, in one float type (f32, or f64 for the f64 kernels)."""

    def __init__(self, b: ir.IRBuilder, ty: ir.Type = F32):
        self.b = b
        self.m = b.module
        self.ty = ty
        self.ity = I32 if ty == F32 else I64

    def c(self, v: float) -> ir.Constant:
        return ir.Constant(self.ty, float(v))

    def ci(self, v: int) -> ir.Constant:
        return ir.Constant(self.ity, v)

    def call(self, name: str, *args):
        return self.b.call(intrinsic(self.m, name, args[0].type, len(args)), list(args))

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

    def abs(self, x):
        return self.call("llvm.fabs", x)

    def lt(self, x, v: float):
        return self.b.fcmp_ordered("<", x, self.c(v))

    def gt(self, x, v: float):
        return self.b.fcmp_ordered(">", x, self.c(v))

    def sel(self, cond, a, b):
        return self.b.select(cond, a, b)

    def keep_nan(self, x, out):
        """``out``, or ``x`` itself where ``x`` is nan (nan in, the same nan out)."""
        return self.b.select(self.isnan(x), x, out)

    def pow2i(self, n):
        """2**n for an integer n in the exponent's normal range, as float bits."""
        mant = 23 if self.ty == F32 else 52
        bias = 127 if self.ty == F32 else 1023
        bits = self.b.shl(self.b.add(n, self.ci(bias)), self.ci(mant))
        return self.b.bitcast(bits, self.ty)

    def to(self, x, ty: ir.Type):
        if x.type == ty:
            return x
        return self.b.fpext(x, ty) if ty == F64 else self.b.fptrunc(x, ty)


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
    half = b.ashr(ni, M.ci(1))
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
    return _log_specials(M, x, out)


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


# ---------------------------------------------------------------- f64 exp and log (for pow)

_LN2_HI64, _LN2_LO64 = 6.93147180369123816490e-01, 1.90821492927058770002e-10
_LG = (1.479819860511658591e-01, 1.531383769920937332e-01, 1.818357216161805012e-01,
       2.222219843214978396e-01, 2.857142874366239149e-01, 3.999999999940941908e-01,
       6.666666666666735130e-01)


def _exp64(M: _Math, x):
    """f64 exp: x = n ln2 + r (ln2 in two parts), e^r by its degree-12 Taylor polynomial."""
    b = M.b
    xc = M.clamp(x, -746.0, 710.0)
    n = M.call("llvm.rint", b.fmul(xc, M.c(1.0 / math.log(2.0))))
    r = b.fsub(b.fsub(xc, b.fmul(n, M.c(_LN2_HI64))), b.fmul(n, M.c(_LN2_LO64)))
    er = M.poly(r, [1.0 / math.factorial(k) for k in range(12, -1, -1)])
    ni = b.fptosi(n, I64)
    half = b.ashr(ni, M.ci(1))
    out = b.fmul(b.fmul(er, M.pow2i(half)), M.pow2i(b.sub(ni, half)))
    return M.keep_nan(x, M.sel(M.gt(x, 710.0), M.c(math.inf), out))


def _log64(M: _Math, x):
    """fdlibm log: x = 2^k (1+f), log(1+f) = f - f^2/2 + s (f^2/2 + R(s^2)), s = f / (2+f)."""
    b = M.b
    tiny = M.lt(x, 2.2250738585072014e-308)
    xs = M.sel(tiny, b.fmul(x, M.c(2.0 ** 54)), x)
    bits = b.bitcast(xs, I64)
    k = b.sub(b.ashr(bits, M.ci(52)), M.ci(1022))
    m = b.bitcast(b.or_(b.and_(bits, M.ci((1 << 52) - 1)), M.ci(0x3FE0000000000000)), F64)
    small = M.lt(m, 0.70710678118654752440)
    k = b.sub(k, b.zext(small, I64))
    f = b.fsub(M.sel(small, b.fadd(m, m), m), M.c(1.0))
    kf = b.fsub(b.sitofp(k, F64), M.sel(tiny, M.c(54.0), M.c(0.0)))
    s = b.fdiv(f, b.fadd(f, M.c(2.0)))
    z = b.fmul(s, s)
    r = b.fmul(z, M.poly(z, _LG))
    hfsq = b.fmul(M.c(0.5), b.fmul(f, f))
    lo = b.fadd(b.fmul(s, b.fadd(hfsq, r)), b.fmul(kf, M.c(_LN2_LO64)))
    out = b.fsub(b.fmul(kf, M.c(_LN2_HI64)), b.fsub(b.fsub(hfsq, lo), f))
    return _log_specials(M, x, out)


def _log_specials(M: _Math, x, out):
    b = M.b
    out = M.sel(b.fcmp_ordered("==", x, M.c(0.0)), M.c(-math.inf), out)
    out = M.sel(b.fcmp_ordered("==", x, M.c(math.inf)), x, out)
    out = M.sel(M.lt(x, 0.0), M.c(math.nan), out)
    return M.keep_nan(x, out)


# ---------------------------------------------------------------- sin, cos, tan

# pi/2 in three 33-bit parts (fdlibm): n * part is exact in f64 for n < 2^20
_PIO2 = (1.57079632673412561417e+00, 6.07710050630396597660e-11, 2.02226624871116645580e-21)
_SIN_P = (-1.9515295891e-4, 8.3321608736e-3, -1.6666654611e-1)
_COS_P = (2.443315711809948e-5, -1.388731625493765e-3, 4.166664568298827e-2)
_TAN_P = (9.38540185543e-3, 3.11992232697e-3, 2.44301354525e-2, 5.34112807005e-2,
          1.33387994085e-1, 3.33331568548e-1)


def _reduce_pio2(M: _Math, x):
    """x = n pi/2 + r, |r| <= pi/4, in f64 (Cody-Waite, exact for |x| < 1.6e6): (r as f32, n mod 4)."""
    b = M.b
    D = _Math(b, F64)
    xd = b.fpext(x, F64)
    n = D.call("llvm.rint", b.fmul(xd, D.c(2.0 / math.pi)))
    r = xd
    for part in _PIO2:
        r = b.fsub(r, b.fmul(n, D.c(part)))      # no contraction: each product is exact
    # past 2^52 (and for inf/nan) n is no longer a usable integer; the result is then bounded only
    n = D.sel(D.lt(D.abs(n), 2.0 ** 52), n, D.c(0.0))
    q = b.trunc(b.and_(b.fptosi(n, I64), ir.Constant(I64, 3)), I32)
    return b.fptrunc(r, F32), q


def _sin_cos_r(M: _Math, r):
    """sin r and cos r for |r| <= pi/4 (Cephes sinf/cosf polynomials)."""
    b = M.b
    z = b.fmul(r, r)
    s = M.fma(b.fmul(r, z), M.poly(z, _SIN_P), r)
    c = M.fma(b.fmul(z, z), M.poly(z, _COS_P), M.fma(z, M.c(-0.5), M.c(1.0)))
    return s, c


def _quadrant(M: _Math, s, c, q):
    """sin(n pi/2 + r) from sin r, cos r and n mod 4 (cos: n + 1)."""
    b = M.b
    swap = b.icmp_unsigned("!=", b.and_(q, M.ci(1)), M.ci(0))
    neg = b.icmp_unsigned("!=", b.and_(q, M.ci(2)), M.ci(0))
    v = M.sel(swap, c, s)
    return M.sel(neg, b.fneg(v), v)


def _periodic_out(M: _Math, x, v, odd: bool):
    """Clamped to [-1, 1] (bounded even past the reduction's range); nan for +-inf and nan;
    an odd function keeps the sign of a zero (sin(-0) = -0)."""
    v = M.clamp(v, -1.0, 1.0)
    if odd:
        v = M.sel(M.b.fcmp_ordered("==", x, M.c(0.0)), x, v)
    return M.sel(M.lt(M.abs(x), math.inf), v, M.c(math.nan))


def _sin(M: _Math, x):
    r, q = _reduce_pio2(M, x)
    s, c = _sin_cos_r(M, r)
    return _periodic_out(M, x, _quadrant(M, s, c, q), odd=True)


def _cos(M: _Math, x):
    r, q = _reduce_pio2(M, x)
    s, c = _sin_cos_r(M, r)
    q = M.b.add(q, M.ci(1))
    return _periodic_out(M, x, _quadrant(M, s, c, q), odd=False)


def _tan(M: _Math, x):
    """Cephes tanf on the reduced argument; odd quadrants give -1/tan r."""
    b = M.b
    r, q = _reduce_pio2(M, x)
    z = b.fmul(r, r)
    t = M.fma(b.fmul(r, z), M.poly(z, _TAN_P), r)
    odd = b.icmp_unsigned("!=", b.and_(q, M.ci(1)), M.ci(0))
    out = M.sel(odd, b.fdiv(M.c(-1.0), t), t)
    out = M.sel(b.fcmp_ordered("==", x, M.c(0.0)), x, out)
    return M.sel(M.lt(M.abs(x), math.inf), out, M.c(math.nan))


# ---------------------------------------------------------------- asin, acos, atan, atan2

_ASIN_P = (4.2163199048e-2, 2.4181311049e-2, 4.5470025998e-2, 7.4953002686e-2, 1.6666752422e-1)
_ATAN_P = (8.05374449538e-2, -1.38776856032e-1, 1.99777106478e-1, -3.33329491539e-1)


def _asin_core(M: _Math, x):
    """(asin t, big) with t = |x| <= 0.5 ? x : sqrt((1 - |x|) / 2) (Cephes asinf)."""
    b = M.b
    ax = M.abs(x)
    big = M.gt(ax, 0.5)
    zb = b.fmul(M.c(0.5), b.fsub(M.c(1.0), ax))
    t = M.sel(big, M.call("llvm.sqrt", zb), x)
    z = M.sel(big, zb, b.fmul(x, x))
    return M.fma(b.fmul(t, z), M.poly(z, _ASIN_P), t), big


def _asin(M: _Math, x):
    b = M.b
    p, big = _asin_core(M, x)
    far = b.fsub(M.c(math.pi / 2), b.fadd(p, p))
    return M.keep_nan(x, M.sel(big, M.call("llvm.copysign", far, x), p))


def _acos(M: _Math, x):
    """acos x = pi/2 - asin x near 0; 2 asin(sqrt((1-x)/2)) near 1 (pi minus that near -1)."""
    b = M.b
    p, big = _asin_core(M, x)
    twice = b.fadd(p, p)
    far = M.sel(M.lt(x, 0.0), b.fsub(M.c(math.pi), twice), twice)
    near = b.fsub(M.c(math.pi / 2), p)
    return M.keep_nan(x, M.sel(big, far, near))


def _atan_01(M: _Math, t):
    """atan t for 0 <= t <= 1 (Cephes atanf: t > tan(pi/8) reduces by (t-1)/(t+1))."""
    b = M.b
    mid = M.gt(t, 0.4142135623730950)
    u = M.sel(mid, b.fdiv(b.fsub(t, M.c(1.0)), b.fadd(t, M.c(1.0))), t)
    z = b.fmul(u, u)
    y = M.fma(b.fmul(u, z), M.poly(z, _ATAN_P), u)
    return b.fadd(y, M.sel(mid, M.c(math.pi / 4), M.c(0.0)))


def _atan2_abs(M: _Math, y, x):
    """atan(|y| / |x|) in [0, pi/2], from min/max so the quotient is in [0, 1]."""
    b = M.b
    ay, ax = M.abs(y), M.abs(x)
    steep = b.fcmp_ordered(">", ay, ax)
    num, den = M.sel(steep, ax, ay), M.sel(steep, ay, ax)
    t = b.fdiv(num, den)
    t = M.sel(b.fcmp_ordered("==", den, M.c(0.0)), M.c(0.0), t)            # 0 / 0
    t = M.sel(b.fcmp_ordered("==", num, M.c(math.inf)), M.c(1.0), t)       # inf / inf
    a = _atan_01(M, t)
    return M.sel(steep, b.fsub(M.c(math.pi / 2), a), a)


def _atan(M: _Math, x):
    a = _atan2_abs(M, x, M.c(1.0))
    return M.keep_nan(x, M.call("llvm.copysign", a, x))


def _atan2(M: _Math, y, x):
    """C atan2, signed zeros and infinities included: x with its sign bit set gives pi - a."""
    b = M.b
    a = _atan2_abs(M, y, x)
    xneg = b.icmp_signed("<", b.bitcast(x, M.ity), M.ci(0))
    a = M.sel(xneg, b.fsub(M.c(math.pi), a), a)
    out = M.call("llvm.copysign", a, y)
    return M.sel(M.isnan(x), x, M.keep_nan(y, out))


# ---------------------------------------------------------------- hyperbolic

_SINH_P = (2.03721912945e-4, 8.33028376239e-3, 1.66667160211e-1)
_ASINH_P = (2.0122003309e-2, -4.2699340972e-2, 7.4847586088e-2, -1.6666288134e-1)
_ACOSH_P = (1.7596881071e-3, -7.5272886713e-3, 2.6454905019e-2, -1.1784741703e-1, 1.4142135263e0)
_ATANH_P = (1.81740078349e-1, 8.24370301058e-2, 1.46691431730e-1, 1.99782164500e-1,
            3.33337300303e-1)
_LN2 = math.log(2.0)


def _exp_pair(M: _Math, ax):
    """(e^|x| / 2, e^-|x| / 2), without overflow up to |x| ~ 177 (the f32 range of sinh)."""
    b = M.b
    e = _exp(M, ax)
    h = _exp(M, b.fmul(ax, M.c(0.5)))
    half = M.sel(M.gt(ax, 88.0), b.fmul(b.fmul(h, M.c(0.5)), h), b.fmul(e, M.c(0.5)))
    return half, b.fdiv(M.c(0.5), e)


def _sinh(M: _Math, x):
    """Cephes sinhf: x + x^3 P(x^2) for |x| <= 1, else (e^|x| - e^-|x|) / 2 with x's sign."""
    b = M.b
    ax = M.abs(x)
    z = b.fmul(x, x)
    small = M.fma(b.fmul(x, z), M.poly(z, _SINH_P), x)
    hi, lo = _exp_pair(M, ax)
    big = M.call("llvm.copysign", b.fsub(hi, lo), x)
    return M.keep_nan(x, M.sel(M.gt(ax, 1.0), big, small))


def _cosh(M: _Math, x):
    hi, lo = _exp_pair(M, M.abs(x))
    return M.keep_nan(x, M.b.fadd(hi, lo))


def _asinh(M: _Math, x):
    """Cephes asinhf: polynomial below 0.5, log(2|x|) above 1500, else log(|x| + sqrt(x^2+1))."""
    b = M.b
    ax = M.abs(x)
    z = b.fmul(x, x)
    small = M.fma(b.fmul(ax, z), M.poly(z, _ASINH_P), ax)
    mid = _log(M, b.fadd(ax, M.call("llvm.sqrt", b.fadd(z, M.c(1.0)))))
    far = b.fadd(_log(M, ax), M.c(_LN2))
    out = M.sel(M.lt(ax, 0.5), small, M.sel(M.gt(ax, 1500.0), far, mid))
    return M.keep_nan(x, M.call("llvm.copysign", out, x))


def _acosh(M: _Math, x):
    """Cephes acoshf: sqrt(z) P(z) for z = x - 1 < 0.5, log(2x) above 1500, nan below 1."""
    b = M.b
    z = b.fsub(x, M.c(1.0))
    small = b.fmul(M.call("llvm.sqrt", z), M.poly(z, _ACOSH_P))
    mid = _log(M, b.fadd(x, M.call("llvm.sqrt", b.fmul(z, b.fadd(x, M.c(1.0))))))
    far = b.fadd(_log(M, x), M.c(_LN2))
    out = M.sel(M.lt(z, 0.5), small, M.sel(M.gt(x, 1500.0), far, mid))
    return M.keep_nan(x, M.sel(M.lt(x, 1.0), M.c(math.nan), out))


def _atanh(M: _Math, x):
    """Cephes atanhf: x + x^3 P(x^2) for |x| < 0.5, else log((1+x) / (1-x)) / 2."""
    b = M.b
    z = b.fmul(x, x)
    small = M.fma(b.fmul(x, z), M.poly(z, _ATANH_P), x)
    big = b.fmul(M.c(0.5), _log(M, b.fdiv(b.fadd(M.c(1.0), x), b.fsub(M.c(1.0), x))))
    return M.keep_nan(x, M.sel(M.lt(M.abs(x), 0.5), small, big))


# ---------------------------------------------------------------- pow, fmod


_POW_SQUARING_MAX = 64.0   # |x| up to 2^6: six squarings


def _pow_by_squaring(D: _Math, a, n):
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


def _pow(M: _Math, a, x):
    """C/NumPy pow: exp(x log|a|) computed in f64 (so f32 results are within 1 ulp), negated
    for a negative base and odd integer x, nan for a negative finite base and fractional x;
    x = 0 or a = 1 give 1 (even with nan), |a| = 1 with x = +-inf gives 1."""
    b = M.b
    D = _Math(b, F64)
    ad, xd = M.to(a, F64), M.to(x, F64)
    r = _exp64(D, b.fmul(xd, _log64(D, D.abs(ad))))
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


def _fmod(M: _Math, a, x):
    """C fmod: a - trunc(a/x) x. f32 operands work in f64, where the product is exact, so the
    result is exact while |a/x| < 2^29; f64 is exact while the product is (|a/x| small). A
    quotient rounded up to the next integer leaves a remainder of the wrong sign, fixed by one
    more x. fmod(a, +-inf) = a; x = 0 or a = +-inf give nan."""
    b = M.b
    wide = F64 if M.ty == F32 else M.ty
    W = _Math(b, wide)
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


_EMIT = {"exp": _exp, "log": _log, "tanh": _tanh, "sigmoid": _sigmoid, "erf": _erf,
         "sin": _sin, "cos": _cos, "tan": _tan, "asin": _asin, "acos": _acos, "atan": _atan,
         "sinh": _sinh, "cosh": _cosh, "asinh": _asinh, "acosh": _acosh, "atanh": _atanh}
_EMIT64 = {"exp": _exp64, "log": _log64}
_EMIT2 = {"pow": _pow, "atan2": _atan2, "fmod": _fmod}
# pow and fmod work in f64 themselves, so f64 operands stay f64; atan2 goes through f32
_BINARY_F64 = ("pow", "fmod")


def emit(b: ir.IRBuilder, name: str, x):
    """Emit ``name(x)`` for a float or double ``x`` at the builder's position."""
    if x.type == F32:
        return _EMIT[name](_Math(b), x)
    if name in _EMIT64:
        return _EMIT64[name](_Math(b, F64), x)
    return b.fpext(_EMIT[name](_Math(b), b.fptrunc(x, F32)), x.type)


def emit_binary(b: ir.IRBuilder, name: str, a, x):
    """Emit ``name(a, x)`` (pow, atan2, fmod) for two floats or two doubles."""
    if a.type == F32 or name in _BINARY_F64:
        return _EMIT2[name](_Math(b, a.type), a, x)
    out = _EMIT2[name](_Math(b), b.fptrunc(a, F32), b.fptrunc(x, F32))
    return b.fpext(out, a.type)
