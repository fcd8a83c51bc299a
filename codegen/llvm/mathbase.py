"""The emission helper of the math library (``Math``) and its base functions: exp and log in
f32 and in f64, which the others build on (mathlib.py states the accuracy of each).
"""

from __future__ import annotations

import math

from llvmlite import ir

from mlpack.codegen.llvm.intrinsics import intrinsic

F32 = ir.FloatType()
F64 = ir.DoubleType()
I32 = ir.IntType(32)
I64 = ir.IntType(64)


class Math:
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


# x log2(e) plus this rounds to an integer n (its ulp is 1) and leaves n + 127 in the low bits
_EXP_MAGIC = 1.5 * 2.0 ** 23 + 127.0


# below this e^x is not a normal f32 (ln of the smallest normal, 1.17549e-38, is -87.3365)
EXP_FLUSH = -87.336
# the range ``exp_bounded`` takes, and ``exp`` clamps to: e^x is a normal f32 from its low end
# (EXP_FLUSH) on, and 2^n one factor up to 2^128 (its bits those of inf)
EXP_BOUNDED = (EXP_FLUSH, 89.0)


def _exp_reduced(M: Math, x, n):
    """e^r for r = x - n ln2 (|r| <= ln2/2; ln2 in two parts), by Cephes' polynomial: what exp
    and exp_bounded multiply by 2^n, each rounding n its own way."""
    b = M.b
    r = M.fma(n, M.c(-_LN2_HI), x)
    r = M.fma(n, M.c(-_LN2_LO), r)
    z = b.fmul(r, r)
    return b.fadd(M.fma(M.poly(r, _EXP_P), z, r), M.c(1.0))


def _exp_parts(M: Math, x):
    """(k, e^r) for x = n ln2 + r: k is x log2(e) plus _EXP_MAGIC, rounded to n + 127 in its low
    bits (``_pow2``), and e^r the polynomial's (``_exp_reduced``); exp and exp_bounded share
    them."""
    k = M.fma(x, M.c(1.0 / math.log(2.0)), M.c(_EXP_MAGIC))
    return k, _exp_reduced(M, x, M.b.fsub(k, M.c(_EXP_MAGIC)))


def _pow2(M: Math, k):
    """2^n from a ``k`` of ``_exp_parts``: its low bits, n + 127, shifted into the exponent."""
    return M.b.bitcast(M.b.shl(M.b.bitcast(k, M.ity), M.ci(23)), M.ty)


def exp(M: Math, x):
    """Cephes expf: x = n ln2 + r, |r| <= ln2/2, e^r by a degree-7 polynomial, times 2^n.

    n is rounded by adding a constant whose low bits are then 2^n's exponent (``exp_bounded``'s
    way: no rint, no conversion to an integer, 2^n one shift), capped at 2^127; where n is 128
    (x from 88.38 on) the product is doubled after, so e^x stays finite up to e^88.72 and
    overflows to inf past it (the argument is clamped at 89, past which e^x is inf anyway).

    Below EXP_FLUSH the result is 0, not the denormal e^x is there: a denormal costs an Intel
    core a microcode assist of some hundred cycles wherever it is produced or read, and a
    softmax over a masked score (Swin's shifted windows add -100) made thousands of them in
    every attention (Swin-T ran 1.3x faster at one thread without them). The argument is
    clamped there first, so no step makes one either."""
    b = M.b
    k, er = _exp_parts(M, M.clamp(x, *EXP_BOUNDED))
    capped = M.call("llvm.minnum", k, M.c(_EXP_MAGIC + 127.0))
    out = b.fmul(er, _pow2(M, capped))
    out = M.fma(out, b.fsub(k, capped), out)   # (k - capped: 1 where n is 128, else 0)
    # below the clamp: flushed to 0; nan stays nan
    out = b.select(b.fcmp_ordered("<", x, M.c(EXP_FLUSH)), M.c(0.0), out)
    return b.select(M.isnan(x), x, out)


def exp_bounded(M: Math, x):
    """e^x for ``x`` in EXP_BOUNDED (or nan: nan out), as ``exp`` is there, but inf from e^88.4
    on, where exp is finite up to e^88.7. For the functions that add e^x to 1 (sigmoid, tanh),
    it takes fewer vector instructions than ``exp``: no clamp, no cap on 2^n, and no test for
    a flush or nan (nan propagates through the arithmetic)."""
    k, er = _exp_parts(M, x)
    return M.b.fmul(er, _pow2(M, k))


# ---------------------------------------------------------------- log

_LOG_P = (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1,
          1.4249322787e-1, -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1,
          3.3333331174e-1)


def log(M: Math, x):
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


# ---------------------------------------------------------------- f64 exp and log (for pow)

_LN2_HI64, _LN2_LO64 = 6.93147180369123816490e-01, 1.90821492927058770002e-10
_LG = (1.479819860511658591e-01, 1.531383769920937332e-01, 1.818357216161805012e-01,
       2.222219843214978396e-01, 2.857142874366239149e-01, 3.999999999940941908e-01,
       6.666666666666735130e-01)


def exp64(M: Math, x):
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


def log64(M: Math, x):
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


def _log_specials(M: Math, x, out):
    b = M.b
    out = M.sel(b.fcmp_ordered("==", x, M.c(0.0)), M.c(-math.inf), out)
    out = M.sel(b.fcmp_ordered("==", x, M.c(math.inf)), x, out)
    out = M.sel(M.lt(x, 0.0), M.c(math.nan), out)
    return M.keep_nan(x, out)
