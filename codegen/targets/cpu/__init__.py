"""The cpu target: IR graph -> LLVM IR (llvmlite) -> ELF shared object + plan.

``compile_cpu(graph, target)`` is the entry point; ``TARGETS`` lists the target names.
"""

from mlpack.codegen.targets.cpu.compile import CpuArtifact, compile_cpu  # noqa: F401
from mlpack.codegen.targets.cpu.target import TARGETS, CpuTarget, get_target  # noqa: F401
