"""CUDA target levels: the SM each builds for, the PTX ISA it writes and the driver it needs.

A level's PTX is written for its own SM (PTX for sm_90 does not assemble for sm_80) at the
oldest PTX ISA version that has what the kernels use, so the oldest driver that can JIT it runs
it; a cubin for the same SM (when ptxas is installed at build time) spares that JIT. The driver
runs a cubin on any GPU of the same major version and an equal or higher minor one, and JIT-
compiles PTX for any newer GPU, which is the rule the engine follows (runtime/c/src/cuda.c).
"""

from __future__ import annotations

from dataclasses import dataclass

from mlpack.codegen.errors import UnsupportedTargetError

TRIPLE = "nvptx64-nvidia-cuda"
# NVPTX's data layout for 64-bit pointers (shared memory, address space 3, has 32-bit ones)
DATA_LAYOUT = "e-p3:32:32-p4:32:32-p5:32:32-p6:32:32-i64:64-i128:128-v16:16-v32:32-n16:32:64"


@dataclass(frozen=True)
class CudaTarget:
    """One SM level of the cuda target."""
    name: str            # what --target takes: "cuda-sm80"
    sm: int              # compute capability as digits: 80 = 8.0
    ptx_isa: tuple[int, int]   # the PTX ISA version its PTX declares
    driver: str          # the oldest Linux driver whose JIT reads that PTX ISA version
    emulated: bool = False   # compiled for the build host's CPU instead (module.py)

    @property
    def arch(self) -> str:
        return f"sm_{self.sm}"

    @property
    def ptx_feature(self) -> str:
        return f"+ptx{self.ptx_isa[0]}{self.ptx_isa[1]}"

    @property
    def ptx_version(self) -> str:
        return f"{self.ptx_isa[0]}.{self.ptx_isa[1]}"


# PTX ISA 7.0 came with CUDA 11.0 (driver 450.36.06 on Linux), the first with sm_80; 7.8 with
# CUDA 11.8 (driver 520.61.05), the first with sm_90
TARGETS: dict[str, CudaTarget] = {t.name: t for t in (
    CudaTarget("cuda-sm80", 80, (7, 0), "450.36.06"),
    CudaTarget("cuda-sm90", 90, (7, 8), "520.61.05"),
    CudaTarget("cuda-emulated", 80, (7, 0), "", emulated=True),
)}

# what `--target cuda` stands for: every real SM level
LEVELS = ("cuda-sm80", "cuda-sm90")


def get_target(name: str) -> CudaTarget:
    try:
        return TARGETS[name]
    except KeyError:
        raise UnsupportedTargetError(
            f"unknown cuda target {name!r}; known: {', '.join(TARGETS)}") from None
