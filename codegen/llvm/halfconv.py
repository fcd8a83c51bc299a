"""f16 and bf16 <-> f32 conversions in integer bit operations (no libcalls, vectorizable).

bf16 is the top half of an f32, so both directions are shifts (round to nearest even on the
way down, nan kept quiet). f16 needs exponent rebiasing; these are the branch-free conversions
of F. Giesen's "half_to_float" / "float_to_half_fast3_rtne", used where the target has no
half-precision conversion instructions (x86-64 v2: LLVM would emit __extendhfsf2 and
__truncsfhf2 calls there), and wherever a target says its f16 stores must not use ``fptrunc``
(the cpu target on x86: targets/cpu/module.py). Both are exact: every f16 widens exactly, and
every f32 rounds to the nearest f16 (ties to even; overflow to inf, nan to a quiet nan,
denormals included).
"""

from __future__ import annotations

from llvmlite import ir

F32 = ir.FloatType()
I16, I32 = ir.IntType(16), ir.IntType(32)


def _c(v: int) -> ir.Constant:
    return ir.Constant(I32, v)


def bf16_to_f32(b: ir.IRBuilder, h):
    """bf16 bits (i16) -> f32."""
    return b.bitcast(b.shl(b.zext(h, I32), _c(16)), F32)


def widen_vector(b: ir.IRBuilder, v, dtype: str, vty: ir.VectorType):
    """A vector of bf16 bits (i16 lanes) or of f16 as the f32 vector ``vty``."""
    if dtype == "f16":
        return b.fpext(v, vty)
    n = vty.count
    return b.bitcast(b.shl(b.zext(v, ir.VectorType(I32, n)), ir.Constant(ir.VectorType(I32, n),
                                                                          [16] * n)), vty)


def f32_to_bf16(b: ir.IRBuilder, x):
    """f32 -> bf16 bits (i16), rounding to nearest even; nan stays a (quiet) nan."""
    u = b.bitcast(x, I32)
    lsb = b.and_(b.lshr(u, _c(16)), _c(1))
    rounded = b.lshr(b.add(u, b.add(_c(0x7FFF), lsb)), _c(16))
    quiet = b.or_(b.lshr(u, _c(16)), _c(0x0040))
    nan = b.fcmp_unordered("uno", x, x)
    return b.trunc(b.select(nan, quiet, rounded), I16)


def f16_to_f32(b: ir.IRBuilder, h):
    """f16 bits (i16) -> f32, exactly (denormals by one float subtraction)."""
    h32 = b.zext(h, I32)
    o = b.shl(b.and_(h32, _c(0x7FFF)), _c(13))
    exp = b.and_(o, _c(0x7C00 << 13))
    o = b.add(o, _c((127 - 15) << 23))
    special = b.add(o, _c((128 - 16) << 23))                  # inf/nan: exponent all ones
    denorm = b.bitcast(b.fsub(b.bitcast(b.add(o, _c(1 << 23)), F32),
                              b.bitcast(_c(113 << 23), F32)), I32)
    o = b.select(b.icmp_unsigned("==", exp, _c(0x7C00 << 13)), special,
                 b.select(b.icmp_unsigned("==", exp, _c(0)), denorm, o))
    return b.bitcast(b.or_(o, b.shl(b.and_(h32, _c(0x8000)), _c(16))), F32)


def f32_to_f16(b: ir.IRBuilder, x):
    """f32 -> f16 bits (i16), round to nearest even (float_to_half_fast3_rtne)."""
    u = b.bitcast(x, I32)
    sign = b.and_(u, _c(-0x80000000))
    f = b.xor(u, sign)
    # too big: inf, or a quiet nan
    big = b.select(b.icmp_unsigned(">", f, _c(255 << 23)), _c(0x7E00), _c(0x7C00))
    # denormal results: adding 0.5 aligns the mantissa so the float add rounds (to even)
    magic = (127 - 15 + 23 - 10 + 1) << 23
    den = b.sub(b.bitcast(b.fadd(b.bitcast(f, F32), b.bitcast(_c(magic), F32)), I32), _c(magic))
    # normal results: rebias, round to nearest even by hand
    odd = b.and_(b.lshr(f, _c(13)), _c(1))
    norm = b.lshr(b.add(b.add(f, _c(((15 - 127) << 23) + 0xFFF)), odd), _c(13))
    o = b.select(b.icmp_unsigned(">=", f, _c((127 + 16) << 23)), big,
                 b.select(b.icmp_unsigned("<", f, _c(113 << 23)), den, norm))
    return b.trunc(b.or_(o, b.lshr(sign, _c(16))), I16)
