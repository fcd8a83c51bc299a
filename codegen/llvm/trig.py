"""The trigonometric functions of the math library: sin, cos, tan (argument reduced by pi/2 in
f64) and asin, acos, atan, atan2 (mathlib.py states their accuracy).
"""

from __future__ import annotations

import math

from llvmlite import ir

from mlpack.codegen.llvm.mathbase import F32, F64, I32, I64, Math


# ---------------------------------------------------------------- sin, cos, tan

# pi/2 in three 33-bit parts (fdlibm): n * part is exact in f64 for n < 2^20
_PIO2 = (1.57079632673412561417e+00, 6.07710050630396597660e-11, 2.02226624871116645580e-21)
_SIN_P = (-1.9515295891e-4, 8.3321608736e-3, -1.6666654611e-1)
_COS_P = (2.443315711809948e-5, -1.388731625493765e-3, 4.166664568298827e-2)
_TAN_P = (9.38540185543e-3, 3.11992232697e-3, 2.44301354525e-2, 5.34112807005e-2,
          1.33387994085e-1, 3.33331568548e-1)


def _reduce_pio2(M: Math, x):
    """x = n pi/2 + r, |r| <= pi/4, in f64 (Cody-Waite, exact for |x| < 1.6e6): (r as f32, n mod 4)."""
    b = M.b
    D = Math(b, F64)
    xd = b.fpext(x, F64)
    n = D.call("llvm.rint", b.fmul(xd, D.c(2.0 / math.pi)))
    r = xd
    for part in _PIO2:
        r = b.fsub(r, b.fmul(n, D.c(part)))      # no contraction: each product is exact
    # past 2^52 (and for inf/nan) n is no longer a usable integer; the result is then bounded only
    n = D.sel(D.lt(D.abs(n), 2.0 ** 52), n, D.c(0.0))
    q = b.trunc(b.and_(b.fptosi(n, I64), ir.Constant(I64, 3)), I32)
    return b.fptrunc(r, F32), q


def _sin_cos_r(M: Math, r):
    """sin r and cos r for |r| <= pi/4 (Cephes sinf/cosf polynomials)."""
    b = M.b
    z = b.fmul(r, r)
    s = M.fma(b.fmul(r, z), M.poly(z, _SIN_P), r)
    c = M.fma(b.fmul(z, z), M.poly(z, _COS_P), M.fma(z, M.c(-0.5), M.c(1.0)))
    return s, c


def _quadrant(M: Math, s, c, q):
    """sin(n pi/2 + r) from sin r, cos r and n mod 4 (cos: n + 1)."""
    b = M.b
    swap = b.icmp_unsigned("!=", b.and_(q, M.ci(1)), M.ci(0))
    neg = b.icmp_unsigned("!=", b.and_(q, M.ci(2)), M.ci(0))
    v = M.sel(swap, c, s)
    return M.sel(neg, b.fneg(v), v)


def _periodic_out(M: Math, x, v, odd: bool):
    """Clamped to [-1, 1] (bounded even past the reduction's range); nan for +-inf and nan;
    an odd function keeps the sign of a zero (sin(-0) = -0)."""
    v = M.clamp(v, -1.0, 1.0)
    if odd:
        v = M.sel(M.b.fcmp_ordered("==", x, M.c(0.0)), x, v)
    return M.sel(M.lt(M.abs(x), math.inf), v, M.c(math.nan))


def sin(M: Math, x):
    r, q = _reduce_pio2(M, x)
    s, c = _sin_cos_r(M, r)
    return _periodic_out(M, x, _quadrant(M, s, c, q), odd=True)


def cos(M: Math, x):
    r, q = _reduce_pio2(M, x)
    s, c = _sin_cos_r(M, r)
    q = M.b.add(q, M.ci(1))
    return _periodic_out(M, x, _quadrant(M, s, c, q), odd=False)


def tan(M: Math, x):
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


def _asin_core(M: Math, x):
    """(asin t, big) with t = |x| <= 0.5 ? x : sqrt((1 - |x|) / 2) (Cephes asinf)."""
    b = M.b
    ax = M.abs(x)
    big = M.gt(ax, 0.5)
    zb = b.fmul(M.c(0.5), b.fsub(M.c(1.0), ax))
    t = M.sel(big, M.call("llvm.sqrt", zb), x)
    z = M.sel(big, zb, b.fmul(x, x))
    return M.fma(b.fmul(t, z), M.poly(z, _ASIN_P), t), big


def asin(M: Math, x):
    b = M.b
    p, big = _asin_core(M, x)
    far = b.fsub(M.c(math.pi / 2), b.fadd(p, p))
    return M.keep_nan(x, M.sel(big, M.call("llvm.copysign", far, x), p))


def acos(M: Math, x):
    """acos x = pi/2 - asin x near 0; 2 asin(sqrt((1-x)/2)) near 1 (pi minus that near -1)."""
    b = M.b
    p, big = _asin_core(M, x)
    twice = b.fadd(p, p)
    far = M.sel(M.lt(x, 0.0), b.fsub(M.c(math.pi), twice), twice)
    near = b.fsub(M.c(math.pi / 2), p)
    return M.keep_nan(x, M.sel(big, far, near))


def _atan_01(M: Math, t):
    """atan t for 0 <= t <= 1 (Cephes atanf: t > tan(pi/8) reduces by (t-1)/(t+1))."""
    b = M.b
    mid = M.gt(t, 0.4142135623730950)
    u = M.sel(mid, b.fdiv(b.fsub(t, M.c(1.0)), b.fadd(t, M.c(1.0))), t)
    z = b.fmul(u, u)
    y = M.fma(b.fmul(u, z), M.poly(z, _ATAN_P), u)
    return b.fadd(y, M.sel(mid, M.c(math.pi / 4), M.c(0.0)))


def _atan2_abs(M: Math, y, x):
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


def atan(M: Math, x):
    a = _atan2_abs(M, x, M.c(1.0))
    return M.keep_nan(x, M.call("llvm.copysign", a, x))


def atan2(M: Math, y, x):
    """C atan2, signed zeros and infinities included: x with its sign bit set gives pi - a."""
    b = M.b
    a = _atan2_abs(M, y, x)
    xneg = b.icmp_signed("<", b.bitcast(x, M.ity), M.ci(0))
    a = M.sel(xneg, b.fsub(M.c(math.pi), a), a)
    out = M.call("llvm.copysign", a, y)
    return M.sel(M.isnan(x), x, M.keep_nan(y, out))
