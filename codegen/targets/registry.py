"""Every target mlpack knows, in one list: what `mlpack build` makes, what `--target` accepts
and refuses, what its help says, and the platforms of spec/media.py (a test holds them equal).

Adding a target is one folder in codegen/targets and one entry here.
"""

from __future__ import annotations

from mlpack.codegen.errors import UnsupportedTargetError
from mlpack.codegen.targets.base import DEFAULT, OPT_IN, PLANNED, Target
from mlpack.codegen.targets.cpu.target import TARGETS as CPU
from mlpack.spec.media import PLATFORMS as TARGETS_PLATFORMS

_CPU_COMPILER = "mlpack.codegen.targets.cpu.compile:compile_artifact"
_CPU_SUMMARY = {
    "x86_64-v2": "x86-64 with SSE4.2 and POPCNT",
    "x86_64-v3": "x86-64 with AVX2, FMA and BMI",
    "x86_64-v4": "x86-64 with AVX-512",
    "x86_64-v4-amx": "x86-64 v4 with Intel AMX tiles (on shared machines their speed swings by "
                     "the minute)",
    "x86_64-v4-bf16": "x86-64 v4 with AVX512_BF16: bf16 artifacts multiply bf16 pairs "
                      "(vdpbf16ps); builds bf16 only",
    "x86_64-v4-vnni": "x86-64 v4 with AVX512_VNNI: int8 artifacts multiply bytes in fours "
                      "(vpdpbusd); builds int8 only",
    "aarch64": "ARMv8 with NEON",
    "aarch64-bf16": "ARMv8 with NEON and BF16: bf16 artifacts multiply bf16 pairs (BFDOT); "
                    "builds bf16 only",
    "aarch64-dotprod": "ARMv8.2 with NEON and DotProd: int8 artifacts multiply bytes in fours "
                       "(SDOT); builds int8 only",
    "aarch64-i8mm": "ARMv8 with NEON and I8MM: int8 artifacts multiply bytes in fours (USDOT); "
                    "builds int8 only",
    "riscv64": "RV64GC with the vector extension 1.0",
}


_CUDA_COMPILER = "mlpack.codegen.targets.cuda.compile:compile_artifact"
_CUDA_PRECISIONS = ("fp32", "fp16", "bf16")


def _host_features() -> tuple[str, ...]:
    import platform

    arm = platform.machine().lower() in ("aarch64", "arm64")
    return CPU["aarch64" if arm else "x86_64-v2"].features


def _cpu(name: str, platform: dict, status: str = DEFAULT,
         precisions: tuple[str, ...] = ("fp32", "fp16", "bf16", "int8")) -> Target:
    return Target(name, "cpu", platform, _CPU_SUMMARY[name], status, precisions, CPU[name].features,
                  _CPU_COMPILER, parallel=True)


TARGETS: dict[str, Target] = {t.name: t for t in (
    Target("portable", "portable", None, "the IR for the runtime's interpreters; runs anywhere, "
           "always built", compiler="mlpack.codegen.targets.portable.compile:compile_portable"),
    _cpu("x86_64-v2", {"os": "linux", "architecture": "amd64", "variant": "v2"}),
    _cpu("x86_64-v3", {"os": "linux", "architecture": "amd64", "variant": "v3"}),
    _cpu("x86_64-v4", {"os": "linux", "architecture": "amd64", "variant": "v4"}),
    # OCI has no variant for AMX: the artifact's cpu features tell it apart from plain v4
    _cpu("x86_64-v4-amx", {"os": "linux", "architecture": "amd64", "variant": "v4"}, OPT_IN),
    # its bf16 artifact rounds the activations as well as the weights (bf16dot.py); a build of
    # fp32 alone (the default) makes nothing for it
    _cpu("x86_64-v4-bf16", {"os": "linux", "architecture": "amd64", "variant": "v4"},
         precisions=("bf16",)),
    # Intel Cascade Lake, Ice Lake and on, AMD Zen 4 and on; a build of fp32 alone makes nothing
    _cpu("x86_64-v4-vnni", {"os": "linux", "architecture": "amd64", "variant": "v4"},
         precisions=("int8",)),
    _cpu("aarch64", {"os": "linux", "architecture": "arm64", "variant": "v8"}),
    _cpu("aarch64-bf16", {"os": "linux", "architecture": "arm64", "variant": "v8"},
         precisions=("bf16",)),
    _cpu("aarch64-dotprod", {"os": "linux", "architecture": "arm64", "variant": "v8"},
         precisions=("int8",)),
    _cpu("aarch64-i8mm", {"os": "linux", "architecture": "arm64", "variant": "v8"},
         precisions=("int8",)),
    _cpu("riscv64", {"os": "linux", "architecture": "riscv64"}),
    # PTX (and a cubin where ptxas is installed) for one SM level; a build host without a GPU
    # cannot validate them, so they are built when named (--target cuda names both)
    Target("cuda-sm80", "cuda", None, "NVIDIA GPUs of compute capability 8.0 and newer (A100, "
           "RTX 30xx on), through PTX for sm_80", OPT_IN, _CUDA_PRECISIONS, (), _CUDA_COMPILER,
           parallel=True),
    Target("cuda-sm90", "cuda", None, "NVIDIA GPUs of compute capability 9.0 and newer (H100, "
           "H200, GH200), through PTX for sm_90", OPT_IN, _CUDA_PRECISIONS, (), _CUDA_COMPILER,
           parallel=True),
    # the cuda kernels compiled for this CPU, each block's threads run in turn: the CUDA lowering
    # checked against the float64 reference where no GPU is
    Target("cuda-emulated", "cpu", dict(TARGETS_PLATFORMS["cuda-emulated"]), "the cuda target's "
           "kernels run on this machine's CPU block by block (checks the CUDA lowering without "
           "a GPU; slow)", OPT_IN, _CUDA_PRECISIONS, _host_features(), _CUDA_COMPILER,
           parallel=True),
)}

# names that stand for several targets on the command line
GROUPS = {"cuda": ("cuda-sm80", "cuda-sm90")}

# the target every container carries, so it runs everywhere
ALWAYS = "portable"


def expand(names) -> list[str] | None:
    """``names`` with each group name (``cuda``) replaced by its targets, in order, once each."""
    if not names:
        return names
    out: list[str] = []
    for n in names:
        for t in GROUPS.get(n, (n,)):
            if t not in out:
                out.append(t)
    return out


def get(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise UnsupportedTargetError(f"unknown target {name!r}; targets are: {', '.join(TARGETS)}") from None


def names(status: str | None = None) -> tuple[str, ...]:
    """Target names in registry order; only those of ``status`` when given."""
    return tuple(t.name for t in TARGETS.values() if status is None or t.status == status)


def implemented() -> tuple[str, ...]:
    return tuple(t.name for t in TARGETS.values() if t.implemented)


def defaults() -> tuple[str, ...]:
    """What a build without --target makes."""
    return tuple(t.name for t in TARGETS.values() if t.implemented and t.status == DEFAULT)


def help_text() -> str:
    """The targets for `mlpack build --help`, one line each."""
    mark = {DEFAULT: "", OPT_IN: " [only when named]", PLANNED: " [planned]"}
    lines = [f"{t.name}: {t.summary}{mark[t.status]}" for t in TARGETS.values()]
    lines += [f"{g}: {' and '.join(names)}" for g, names in GROUPS.items()]
    return "\n".join(lines)
