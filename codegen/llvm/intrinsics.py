"""LLVM intrinsics declared once per module, and the vector helpers built on them.

Every intrinsic a kernel calls is declared here by name and type, so an overloaded one gets the
name LLVM expects (``llvm.fma.v16f32``) and a module declares each at most once.
"""

from __future__ import annotations

from llvmlite import ir

I32 = ir.IntType(32)


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


def load_masked_f32(b: ir.IRBuilder, ptr, vty: ir.VectorType, mask):
    """The f32 lanes of ``vty`` at ``ptr`` where ``mask`` holds, zero where it does not (a
    masked-off lane is not read: it may lie past the buffer)."""
    return b.call(masked_load(b.module, vty), [ptr, ir.Constant(I32, 4), mask,
                                               ir.Constant(vty, [0.0] * vty.count)])


def umin(b: ir.IRBuilder, x, y):
    """The smaller of two unsigned integers, as a compare and a select (LLVM's umin)."""
    return b.select(b.icmp_unsigned("<", x, y), x, y)


def splat(b: ir.IRBuilder, value, vty: ir.VectorType):
    """A vector of ``vty`` with ``value`` in every lane (an insert and a shuffle, which every
    backend matches to its broadcast)."""
    undef = ir.Constant(vty, ir.Undefined)
    lanes = ir.Constant(ir.VectorType(I32, vty.count), [0] * vty.count)
    return b.shuffle_vector(b.insert_element(undef, value, ir.Constant(I32, 0)), undef, lanes)


def line_alloca(b: ir.IRBuilder, typ: ir.Type, name: str) -> ir.AllocaInstr:
    """A stack buffer that whole vectors are stored to and loaded from, on a 64-byte boundary
    (a cache line): a 512-bit access to it never splits two lines. (A cpu kernel's frame is
    realigned so that this holds whatever the caller's stack: cpu/module.py.)"""
    slot = b.alloca(typ, name=name)
    slot.align = 64
    return slot
