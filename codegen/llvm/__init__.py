"""LLVM emission that any LLVM-based target shares: IR dtypes as LLVM types, scalar expressions,
reductions' combining steps, the math library, loops, intrinsics and vector helpers, index checks.

The layer knows the IR (mlpack.spec) and llvmlite, never a target: a target (``targets/cpu``
now, an NVPTX one next) decides the schedule, the kernel ABI and what each kernel's function
looks like, and calls in here for the code inside. Nothing here imports ``codegen/targets``
(tests/codegen/test_structure.py checks it).
"""
