"""IR dtypes as LLVM types: in registers, in memory, and as constants.

f16 and bf16 live in f32 registers: loads widen, stores (and casts to them) round to nearest
even, and so does every op on them, as the interpreter (NumPy, the ONNX reference) computes
each f16 op in f32 and rounds it (scalar.py does the rounding). fp8/fp4 live in f32 registers
too, int4/int2 in i8 ones (narrow.py converts them). bool is i1 in a register and i8 in memory.
"""

from __future__ import annotations

from llvmlite import ir

from mlpack.spec.ir import dtypes as dt
from mlpack.codegen.errors import UnsupportedTargetError
from mlpack.codegen.llvm import narrow

I1, I8, I16, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)


class BFloatType(ir.Type):
    """LLVM's ``bfloat`` (llvmlite has no class for it): the element of the bf16 vectors that
    x86's vdpbf16ps takes. Registers elsewhere hold bf16 as i16 bits or widened to f32."""

    def _to_string(self) -> str:
        return "bfloat"

    def __eq__(self, other) -> bool:
        return isinstance(other, BFloatType)

    def __hash__(self) -> int:
        return hash("bfloat")


BF16 = BFloatType()
PTR = ir.PointerType()
F32, F16, F64 = ir.FloatType(), ir.HalfType(), ir.DoubleType()
FLOAT_TYPES = {"f32": ir.FloatType(), "f64": ir.DoubleType(), "f16": ir.FloatType(),
               "bf16": ir.FloatType()}
NARROW_FLOATS = ("f16", "bf16")
FLOAT_TYPES.update({d: F32 for d in narrow.FLOATS})
NARROW_FLOATS += tuple(sorted(narrow.FLOATS))


def llvm_type(dtype: str, what: str = "", target: str = "llvm") -> ir.Type:
    """The register type of an IR dtype (bool is i1; storage of bool is i8). ``target``
    begins the error for a dtype no register holds, ``what`` ends it."""
    if dtype in FLOAT_TYPES:
        return FLOAT_TYPES[dtype]
    if dtype == "bool":
        return I1
    if dtype in narrow.INTS:
        return I8
    if dt.is_int(dtype) and dt.bits(dtype) in (8, 16, 32, 64):
        return ir.IntType(dt.bits(dtype))
    raise UnsupportedTargetError(f"{target}: dtype {dtype} is not supported{what}")


def storage_type(dtype: str) -> ir.Type:
    """How a dtype lies in memory: bool as i8, f16 as half, bf16 as its i16 bits."""
    if dtype == "f16":
        return F16
    if dtype == "bf16":
        return I16
    return I8 if dtype == "bool" or narrow.handles(dtype) else llvm_type(dtype)


def itemsize(dtype: str) -> int:
    """Bytes of one element in memory as ``storage_type`` lays it (a narrow one: its byte)."""
    return 1 if dtype == "bool" or narrow.handles(dtype) else dt.bits(dtype) // 8


def const(dtype: str, value) -> ir.Constant:
    """``value`` as a register constant of ``dtype`` (negative ints in two's complement)."""
    ty = llvm_type(dtype)
    if dtype in FLOAT_TYPES:
        return ir.Constant(ty, float(value))
    if dtype == "bool":
        return ir.Constant(I1, int(bool(value)))
    v = int(value)
    bits = ty.width   # (int4/int2 registers are i8, sign- or zero-extended)
    return ir.Constant(ty, v & ((1 << bits) - 1) if v < 0 else v)


def i64(value: int) -> ir.Constant:
    """An i64 constant: index arithmetic's."""
    return ir.Constant(I64, value)


def is_signed(dtype: str) -> bool:
    return dtype in dt.SIGNED
