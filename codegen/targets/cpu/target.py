"""CPU target descriptions: the LLVM triple, CPU and explicit feature list of each level.

Each x86-64 level names its features explicitly and is a strict superset of the level below,
so an artifact built for one level runs on every host that has that level's features (the
engine reads the host's features and compares them with the config's ``cpu_features``). The
CPU is always the generic one of the architecture, so no tuning beyond the features leaks in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mlpack.codegen.errors import UnsupportedTargetError

_X86_V2 = ("cx16", "popcnt", "sahf", "sse3", "sse4.1", "sse4.2", "ssse3")
_X86_V3 = _X86_V2 + ("avx", "avx2", "bmi", "bmi2", "f16c", "fma", "lzcnt", "movbe", "xsave")
_X86_V4 = _X86_V3 + ("avx512bw", "avx512cd", "avx512dq", "avx512f", "avx512vl")
# v4 plus Intel AMX (Sapphire Rapids on): fp32 contractions run as bf16x6 tile products
# (amx.py); the split into bf16 parts rounds with integer ops, so avx512bf16 is not needed
_X86_V4_AMX = _X86_V4 + ("amx-tile", "amx-bf16")
# v4 plus AVX512_BF16 (Intel Cooper Lake and Sapphire Rapids on, AMD Zen 4 on): bf16 artifacts
# multiply bf16 pairs with vdpbf16ps (bf16dot.py)
_X86_V4_BF16 = _X86_V4 + ("avx512bf16",)
# v4 plus AVX512_VNNI (Intel Cascade Lake on, AMD Zen 4 on): int8 artifacts multiply u8 x s8
# in fours with vpdpbusd (codegen/precisions/int8.py, microkernel.py)
_X86_V4_VNNI = _X86_V4 + ("avx512vnni",)
_RV64GCV = ("m", "a", "f", "d", "c", "v")
# ARMv8 with FEAT_BF16 (Neoverse V1/N2 on, Graviton 3 on, Apple M2 on): BFDOT (bf16dot.py)
_ARM_BF16 = ("fp-armv8", "neon", "bf16")
# ARMv8.2 with FEAT_DotProd (Cortex-A55/A75 on, Neoverse N1 / Graviton 2 on, Apple M1 on): int8
# artifacts multiply in fours with SDOT, A's u8 shifted to s8 (gemm.SIGNED_A)
_ARM_DOTPROD = ("fp-armv8", "neon", "dotprod")
# ARMv8 with FEAT_I8MM (Neoverse V1/N2/V2, Graviton 3 on, Cortex-A510/A710/X2 on, Apple M2 on):
# int8 artifacts multiply u8 x s8 in fours with USDOT (codegen/precisions/int8.py)
_ARM_I8MM = ("fp-armv8", "neon", "dotprod", "i8mm")


@dataclass(frozen=True)
class CpuTarget:
    """One CPU target: what LLVM is told, and what the artifact's config advertises."""
    name: str                   # "x86_64-v3": the config's artifact.target
    triple: str
    cpu: str
    features: tuple[str, ...]   # without "+": the config's artifact.cpu_features
    arch: str                   # OCI platform architecture: "amd64" or "arm64"
    elf_machine: str            # what readelf calls the machine
    vector_bits: int            # widest vector register, for schedule heuristics
    options: dict = field(default_factory=dict)
    vector_registers: int = 16  # architectural vector registers (gemm tile register budget)
    fma: bool = True            # fused multiply-add instructions (llvm.fma is no libcall)

    @property
    def amx(self) -> bool:
        """Whether the target multiplies with AMX tiles (bf16)."""
        return "amx-bf16" in self.features

    @property
    def feature_string(self) -> str:
        return ",".join("+" + f for f in self.features)


def _x86(name: str, features: tuple[str, ...], vector_bits: int = 512, **kw) -> CpuTarget:
    """An x86-64 level (AVX-512 and its 32 vector registers unless told)."""
    if vector_bits == 512:
        kw.setdefault("vector_registers", 32)
    return CpuTarget(name, "x86_64-unknown-linux-gnu", "x86-64", features, "amd64",
                     "Advanced Micro Devices X86-64", vector_bits, **kw)


def _arm(name: str, features: tuple[str, ...]) -> CpuTarget:
    """An AArch64 level: NEON's 128-bit vectors, 32 registers."""
    return CpuTarget(name, "aarch64-unknown-linux-gnu", "generic", features, "arm64", "AArch64",
                     128, vector_registers=32)


TARGETS: dict[str, CpuTarget] = {t.name: t for t in (
    _x86("x86_64-v2", _X86_V2, 128, fma=False),
    _x86("x86_64-v3", _X86_V3, 256),
    _x86("x86_64-v4", _X86_V4),
    _x86("x86_64-v4-amx", _X86_V4_AMX),
    _x86("x86_64-v4-bf16", _X86_V4_BF16),
    _x86("x86_64-v4-vnni", _X86_V4_VNNI),
    _arm("aarch64", ("fp-armv8", "neon")),
    _arm("aarch64-bf16", _ARM_BF16),
    _arm("aarch64-dotprod", _ARM_DOTPROD),
    _arm("aarch64-i8mm", _ARM_I8MM),
    # RV64GC with the vector extension 1.0, whose registers are at least 128 bits (zvl128b):
    # fixed-width 128-bit vectors lower to it on every V 1.0 core. The float ABI is lp64d (the
    # module's target-abi flag), the one Linux distributions' glibc uses.
    CpuTarget("riscv64", "riscv64-unknown-linux-gnu", "generic-rv64", _RV64GCV, "riscv64",
              "RISC-V", 128, vector_registers=32),
)}


def get_target(name: str) -> CpuTarget:
    try:
        return TARGETS[name]
    except KeyError:
        raise UnsupportedTargetError(
            f"unknown cpu target {name!r}; known: {', '.join(TARGETS)}") from None
