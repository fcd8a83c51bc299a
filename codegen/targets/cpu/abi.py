"""The cpu kernel ABI (runtime/c/include/mlpack_abi.h) as LLVM types.

Every kernel, a comprehension's (lower.py) or a procedure's (procedure.py), is a function
``i32 k(const mlpack_dispatch *d, uint32_t wg)``; its wrapper unpacks the dispatch record and
calls the kernel's body (module.py puts the functions in the kernel table).
"""

from __future__ import annotations

from llvmlite import ir

I32 = ir.IntType(32)
PTR = ir.PointerType()
# mlpack_dispatch (ABI 1.2): bindings, push constants, workgroup count, (reserved), error record
DISPATCH = ir.LiteralStructType([PTR, PTR, I32, I32, PTR])
KERNEL_FN = ir.FunctionType(I32, [PTR, I32])
