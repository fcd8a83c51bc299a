"""The narrow dtypes in LLVM registers and memory: fp8, fp4, int4 and int2.

Registers: the narrow floats (f8e4m3fn, f8e4m3fnuz, f8e5m2, f8e5m2fnuz, f8e8m0, f4e2m1) live
in f32 registers as f16 and bf16 do (see scalar.py); the narrow ints (i4, u4, i2, u2) in i8
registers, sign- or zero-extended. A cast to a narrow type rounds the register value to it
(``round_to``: encode then decode), so later arithmetic sees exactly the interpreter's values.

Conversions are integer bit manipulation plus, for subnormal results, one float add that
makes the FPU round at the right bit (as halfconv.py): no tables, no libcalls, so loops over
them vectorize. They reproduce ml_dtypes (what the interpreter's ``astype`` uses) bit for bit:
f32 -> narrow rounds to nearest even (e8m0: ties away, ml_dtypes' rule for a format without
fraction bits), overflow gives inf (e5m2), nan (e4m3fn, the fnuz types, e8m0) or the largest
finite value (f4e2m1, which has neither); nan keeps its sign where the format has signed nans;
fnuz types have no -0. Saturation is not done here: the importer clamps before the cast
(Cast's ``saturate``, QuantizeLinear), so a cast itself is ml_dtypes' non-saturating one.
Wider sources narrow in two steps like ml_dtypes does (f64 -> f32 -> fp8, int -> f32 -> fp8).

Memory: fp8 is one byte. The sub-byte types (4-bit, 2-bit) are packed as ONNX packs them,
two (four) elements per byte, element 0 in the low bits, in buffers the engine owns (a
``Base`` with ``packed``); a buffer that is not packed (a model's input or output: how NumPy
holds ml_dtypes arrays) keeps one element per byte, low bits, upper bits zero. A packed store
is a read-modify-write of its byte, so a target gives a kernel writing a packed buffer to one
thread (the cpu target: targets/cpu/narrowconv.py, which also packs the weights).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llvmlite import ir

from mlpack.spec.ir import dtypes as dt

F32 = ir.FloatType()
I8, I32, I64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
F32_NAN = 0x7FC00000


@dataclass(frozen=True)
class _Float:
    """A narrow float format: exponent and mantissa widths, bias, and its special values."""
    bits: int
    exp: int
    man: int
    bias: int
    max_mag: int            # largest finite magnitude code (sign bit clear)
    over_mag: int           # the magnitude code an overflow or an inf becomes
    nan_mag: int            # the magnitude code of nan (sign added where signed)
    unsigned_zero: bool = False   # fnuz: no -0, and the nan is the bare sign bit
    ieee: bool = False            # all-ones exponent is inf (mantissa 0) or nan (e5m2)
    nan_flips_sign: bool = False  # f4e2m1 has no nan: ml_dtypes gives -0, and -nan +0


FLOAT_FORMATS: dict[str, _Float] = {
    "f8e4m3fn": _Float(8, 4, 3, 7, 0x7E, 0x7F, 0x7F),
    "f8e4m3fnuz": _Float(8, 4, 3, 8, 0x7F, 0x80, 0x80, unsigned_zero=True),
    "f8e5m2": _Float(8, 5, 2, 15, 0x7B, 0x7C, 0x7E, ieee=True),
    "f8e5m2fnuz": _Float(8, 5, 2, 16, 0x7F, 0x80, 0x80, unsigned_zero=True),
    "f4e2m1": _Float(4, 2, 1, 1, 0x7, 0x7, 0x0, nan_flips_sign=True),
}
E8M0 = "f8e8m0"
FLOATS = frozenset([*FLOAT_FORMATS, E8M0]) & frozenset(dt.DTYPES)
INTS = frozenset({"i4", "u4", "i2", "u2"}) & frozenset(dt.DTYPES)
NARROW = FLOATS | INTS


def handles(dtype: str) -> bool:
    """Whether ``dtype`` is one this module converts (fp8, fp4, int4, int2)."""
    return dtype in NARROW


def sub_byte(dtype: str) -> bool:
    return dtype in NARROW and dt.bits(dtype) < 8


def register_type(dtype: str) -> ir.Type:
    return F32 if dtype in FLOATS else I8


def _c(v: int, ty=I32) -> ir.Constant:
    return ir.Constant(ty, v & ((1 << ty.width) - 1))


def _f(v: float) -> ir.Constant:
    return ir.Constant(F32, v)


# ---------------------------------------------------------------- floats


def decode_float(b: ir.IRBuilder, dtype: str, code):
    """Narrow float code (an integer, format bits in the low bits, the rest ignored) -> f32."""
    c = b.and_(b.zext(code, I32) if code.type.width < 32 else code, _c((1 << dt.bits(dtype)) - 1))
    if dtype == E8M0:
        # 2**(c - 127): c is the f32 exponent field; c == 0 is 2**-127, an f32 subnormal
        bits = b.select(b.icmp_unsigned("==", c, _c(0)), _c(0x00400000), b.shl(c, _c(23)))
        return b.bitcast(b.select(b.icmp_unsigned("==", c, _c(0xFF)), _c(F32_NAN), bits), F32)
    f = FLOAT_FORMATS[dtype]
    w = f.bits
    sign = b.shl(b.lshr(c, _c(w - 1)), _c(31))
    mag = b.and_(c, _c((1 << (w - 1)) - 1))
    exp = b.lshr(mag, _c(f.man))
    # normal: the fields moved into f32 position and the exponent rebiased
    norm = b.add(b.shl(mag, _c(23 - f.man)), _c((127 - f.bias) << 23))
    # subnormal (exponent 0): mantissa * 2**(1 - bias - man), exact in f32
    sub = b.bitcast(b.fmul(b.uitofp(mag, F32), _f(2.0 ** (1 - f.bias - f.man))), I32)
    bits = b.select(b.icmp_unsigned("==", exp, _c(0)), sub, norm)
    top = (1 << f.exp) - 1
    if f.ieee:
        special = b.icmp_unsigned("==", exp, _c(top))
        inf = b.icmp_unsigned("==", mag, _c(top << f.man))
        inf_or_nan = b.select(inf, _c(0x7F800000), _c(F32_NAN))
        bits = b.select(special, inf_or_nan, bits)
    elif f.unsigned_zero:
        # the code 0x80 (sign bit alone) is the nan (ml_dtypes widens it to -nan)
        bits = b.select(b.icmp_unsigned("==", c, _c(1 << (w - 1))), _c(F32_NAN), bits)
    elif dtype != "f4e2m1":
        bits = b.select(b.icmp_unsigned("==", mag, _c(f.nan_mag)), _c(F32_NAN), bits)
    return b.bitcast(b.or_(bits, sign), F32)


def encode_float(b: ir.IRBuilder, dtype: str, x):
    """f32 -> narrow float code (i32, format bits in the low bits), as ml_dtypes converts."""
    u = b.bitcast(x, I32)
    s = b.lshr(u, _c(31))
    a = b.and_(u, _c(0x7FFFFFFF))
    is_nan = b.icmp_unsigned(">", a, _c(0x7F800000))
    if dtype == E8M0:
        return _encode_e8m0(b, s, a)
    f = FLOAT_FORMATS[dtype]
    w = f.bits
    # normal results: rebias, then round to nearest even by adding 0111..1 plus the kept lsb
    shift = 23 - f.man
    t = b.sub(a, _c((127 - f.bias) << 23))
    lsb = b.and_(b.lshr(t, _c(shift)), _c(1))
    norm = b.lshr(b.add(t, b.add(_c((1 << (shift - 1)) - 1), lsb)), _c(shift))
    # subnormal results: adding 2**k whose ulp is the format's subnormal step makes the f32 add
    # round |x| to that step (ties to even); the bits above the magic are the code (may reach
    # the smallest normal, which is then right too)
    k = (1 - f.bias) - f.man + 23
    magic = (k + 127) << 23
    den = b.sub(b.bitcast(b.fadd(b.bitcast(a, F32), b.bitcast(_c(magic), F32)), I32), _c(magic))
    small = b.icmp_unsigned("<", a, _c((1 - f.bias + 127) << 23))
    mag = b.select(small, den, norm)
    # overflow (inf included: its norm is far above max_mag)
    mag = b.select(b.icmp_unsigned(">", mag, _c(f.max_mag)), _c(f.over_mag), mag)
    mag = b.select(is_nan, _c(f.nan_mag), mag)
    sbit = b.shl(s, _c(w - 1))
    if f.unsigned_zero:
        # no -0 (a negative value rounding to zero is +0); nan and overflow are the bare sign
        zero_or_special = b.or_(b.icmp_unsigned("==", mag, _c(0)),
                                b.icmp_unsigned("==", mag, _c(f.over_mag)))
        sbit = b.select(zero_or_special, _c(0), sbit)
    out = b.or_(mag, sbit)
    if f.nan_flips_sign:
        # ml_dtypes' quiet_NaN() of f4e2m1 is the code of -0, and -nan negates it to +0
        out = b.select(is_nan, b.xor(_c(1 << (w - 1)), sbit), out)
    return out


def _encode_e8m0(b: ir.IRBuilder, s, a):
    """f32 -> e8m0 (2**(code-127), no sign, no zero): ml_dtypes rounds the mantissa away at
    its half (the implicit bit makes its round-to-even a round-half-up); from an f32 subnormal
    (only 2**-127 <= x < 2**-126 can round to a code) code 1 needs more than the half."""
    e = b.lshr(a, _c(23))
    frac = b.and_(a, _c(0x7FFFFF))
    normal = b.add(e, b.zext(b.icmp_unsigned(">=", frac, _c(0x400000)), I32))
    sub = b.zext(b.icmp_unsigned(">", frac, _c(0x400000)), I32)
    code = b.select(b.icmp_unsigned("==", e, _c(0)), sub, normal)
    # nan, inf, overflow past 2**127, zero and negatives are all the nan 0xff
    bad = b.or_(b.or_(b.icmp_unsigned(">", code, _c(254)), b.icmp_unsigned("==", a, _c(0))),
                b.icmp_unsigned("!=", s, _c(0)))
    return b.select(bad, _c(0xFF), code)


# ---------------------------------------------------------------- ints


def decode_int(b: ir.IRBuilder, dtype: str, code):
    """Narrow int code (i8, its bits in the low bits) -> canonical i8 register value."""
    w = dt.bits(dtype)
    if dtype in dt.SIGNED:
        return b.ashr(b.shl(code, _c(8 - w, I8)), _c(8 - w, I8))
    return b.and_(code, _c((1 << w) - 1, I8))


def encode_int(b: ir.IRBuilder, dtype: str, v):
    """i8 register value -> code (its low bits; the upper bits zero, as ml_dtypes stores it)."""
    return b.and_(v, _c((1 << dt.bits(dtype)) - 1, I8))


# ---------------------------------------------------------------- registers


def decode(b: ir.IRBuilder, dtype: str, code):
    """A loaded code (i8) -> the register value."""
    if dtype in FLOATS:
        return decode_float(b, dtype, code)
    return decode_int(b, dtype, code)


def encode(b: ir.IRBuilder, dtype: str, v):
    """A register value -> the code to store (i8)."""
    if dtype in FLOATS:
        return b.trunc(encode_float(b, dtype, v), I8)
    return encode_int(b, dtype, v)


def round_to(b: ir.IRBuilder, dtype: str, v):
    """A register value rounded (floats) or wrapped (ints) to ``dtype``, still in a register."""
    if dtype in FLOATS:
        return decode_float(b, dtype, encode_float(b, dtype, v))
    return decode_int(b, dtype, v)


# ---------------------------------------------------------------- memory


class Base:
    """A narrow buffer's base pointer and whether its elements are packed (sub-byte types in
    engine-owned buffers), standing in for the plain pointer in a ScalarEmitter's bases."""

    def __init__(self, ptr, dtype: str, packed: bool):
        self.ptr = ptr
        self.dtype = dtype
        self.packed = packed and sub_byte(dtype)

    def at(self, flat) -> "Ref":
        return Ref(self, flat)


class Ref:
    """One element of a narrow buffer (what ScalarEmitter.address gives for them)."""

    def __init__(self, base: Base, flat):
        self.base = base
        self.flat = flat

    def _byte(self, b: ir.IRBuilder):
        """(byte pointer, bit shift of the element in it as i8)."""
        base = self.base
        if not base.packed:
            return b.gep(base.ptr, [self.flat], inbounds=True, source_etype=I8), None
        w = dt.bits(base.dtype)
        per = 8 // w
        ix = b.lshr(self.flat, ir.Constant(I64, int(math.log2(per))))
        lane = b.and_(self.flat, ir.Constant(I64, per - 1))
        shift = b.trunc(b.mul(lane, ir.Constant(I64, w)), I8)
        return b.gep(base.ptr, [ix], inbounds=True, source_etype=I8), shift

    def load(self, b: ir.IRBuilder):
        ptr, shift = self._byte(b)
        byte = b.load(ptr, typ=I8, align=1)
        return decode(b, self.base.dtype, byte if shift is None else b.lshr(byte, shift))

    def store(self, b: ir.IRBuilder, value) -> None:
        ptr, shift = self._byte(b)
        code = encode(b, self.base.dtype, value)
        if shift is None:
            b.store(code, ptr, align=1)
            return
        # read-modify-write of the byte (one thread per buffer: see the module docstring)
        code = b.and_(code, _c((1 << dt.bits(self.base.dtype)) - 1, I8))
        mask = b.shl(_c((1 << dt.bits(self.base.dtype)) - 1, I8), shift)
        old = b.load(ptr, typ=I8, align=1)
        b.store(b.or_(b.and_(old, b.xor(mask, _c(-1, I8))), b.shl(code, shift)), ptr, align=1)


def load(b: ir.IRBuilder, base, flat):
    """Load through a Base at ``flat``, or through a Ref (``flat`` then is 0)."""
    ref = base if isinstance(base, Ref) else base.at(flat)
    if isinstance(base, Ref) and not (isinstance(flat, ir.Constant) and flat.constant == 0):
        ref = Ref(base.base, b.add(base.flat, flat))
    return ref.load(b)
