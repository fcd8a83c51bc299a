"""The cpu target: IR graph -> LLVM IR (llvmlite) -> ELF shared object + plan.

``compile_cpu(graph, target)`` is the entry point; ``TARGETS`` lists the target names. The
compiler is imported on first use (PEP 562), so reading the target descriptions (target.py, the
registry of codegen/targets) does not load LLVM.
"""

from mlpack.codegen.targets.cpu.target import TARGETS, CpuTarget, get_target  # noqa: F401


def __getattr__(name: str):
    if name in ("CpuArtifact", "compile_cpu"):
        from mlpack.codegen.targets.cpu import compile as _compile

        return getattr(_compile, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
