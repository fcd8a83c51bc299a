"""What the host can run: OS, architecture, CPU features, x86-64 level, CUDA compute capability.

Selection (select.py) matches artifacts against a ``Host``. ``detect_host`` reads the machine it
runs on; every API that selects also takes an explicit ``Host``, so tests and ``mlpack inspect``
can ask "what would an arm64 board pick?" without an environment-variable override.

Names follow OCI: ``os`` is ``linux``/``darwin``/``windows``, ``arch`` is ``amd64``/``arm64``.
CPU features are the Linux ``/proc/cpuinfo`` names plus the LLVM spellings of the same features
(``sse4.1`` beside ``sse4_1``, ``neon`` beside ``asimd``), so an artifact may name either.

The x86-64 levels are the psABI microarchitecture levels (v1 baseline, v2 SSE4.2/POPCNT,
v3 AVX2/FMA/BMI, v4 AVX-512 F/BW/CD/DQ/VL); a level counts only if every feature of it and of
the levels below is present.

CUDA: ``detect_cuda_sm`` asks the driver (libcuda, through ctypes) for device 0's compute
capability; with no driver, no GPU or any failure it returns None. It loads nothing else.
"""

from __future__ import annotations

import ctypes
import functools
import platform
from dataclasses import dataclass

from mlpack.spec.media import CPU_FEATURE_SPELLINGS

# psABI x86-64 levels, as /proc/cpuinfo spells the flags (pni = SSE3, abm = LZCNT)
X86_LEVELS = (
    (1, frozenset({"cmov", "cx8", "fpu", "fxsr", "mmx", "sse", "sse2"})),
    (2, frozenset({"cx16", "lahf_lm", "popcnt", "pni", "sse4_1", "sse4_2", "ssse3"})),
    (3, frozenset({"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"})),
    (4, frozenset({"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"})),
)

# other spellings of the same feature (LLVM's), added beside the cpuinfo name
_X86_ALIASES = CPU_FEATURE_SPELLINGS["amd64"]
_ARM_ALIASES = CPU_FEATURE_SPELLINGS["arm64"]

_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64",
         "armv8l": "arm64", "i686": "386", "i386": "386", "riscv64": "riscv64",
         "ppc64le": "ppc64le", "s390x": "s390x"}


@dataclass(frozen=True)
class Host:
    """The machine selection matches artifacts against."""

    os: str  # OCI os: "linux", "darwin", "windows"
    arch: str  # OCI architecture: "amd64", "arm64", ...
    cpu_features: frozenset[str] = frozenset()
    x86_level: int | None = None  # 1..4 on amd64 (x86-64 v1..v4); None elsewhere
    cuda_sm: int | None = None  # compute capability as digits (80 = 8.0); None: no usable GPU
    cuda_why: str = ""  # why no GPU is usable (the driver's own words), when cuda_sm is None

    def describe(self) -> str:
        """One line: ``linux/amd64 x86-64 v4, cuda sm_90``."""
        cpu = f"x86-64 v{self.x86_level}" if self.x86_level else self.arch
        gpu = f"cuda sm_{self.cuda_sm}" if self.cuda_sm else "no CUDA GPU"
        return f"{self.os}/{self.arch} {cpu}, {gpu}"


def x86_level(flags) -> int | None:
    """The highest psABI level whose features (and every lower level's) are all in ``flags``."""
    level = None
    for n, needed in X86_LEVELS:
        if not needed <= set(flags):
            break
        level = n
    return level


def with_aliases(flags, aliases: dict[str, str]) -> frozenset[str]:
    """``flags`` plus the other spelling of each flag that has one."""
    flags = set(flags)
    return frozenset(flags | {aliases[f] for f in flags if f in aliases})


def parse_cpuinfo(text: str, arch: str) -> frozenset[str]:
    """The CPU feature flags of the first processor in a /proc/cpuinfo text, with aliases (on
    riscv64 the single-letter extensions of its ``isa`` line, as the C engine reads them)."""
    key = {"amd64": "flags", "riscv64": "isa"}.get(arch, "features")
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip().lower() == key:
            if arch == "riscv64":
                base = value.strip().lower().split("_")[0].removeprefix("rv64")
                return frozenset(c for c in base if c in "imafdcv")
            flags = value.split()
            return with_aliases(flags, _X86_ALIASES if arch == "amd64" else _ARM_ALIASES)
    return frozenset()


def _read_cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            return f.read()
    except OSError:  # not Linux, or /proc not mounted: no features known beyond the baseline
        return ""


def cpu_name() -> str | None:
    """The CPU's model name as /proc/cpuinfo gives it ("AMD EPYC"); None where it gives none
    (arm64 kernels have no such line, other systems no /proc)."""
    for line in _read_cpuinfo().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip() or None
    return None


def probe_cuda() -> tuple[int | None, str]:
    """Device 0's compute capability from the CUDA driver API, or None with why none is usable,
    in the words of the C engine's probe (runtime/c/src/cuda.c ``mp_cuda_probe``): the driver is
    libcuda.so.1, or the library MLPACK_LIBCUDA names ("0": none)."""
    from mlpack.spec import environment

    path = environment.get("MLPACK_LIBCUDA") or "libcuda.so.1"
    if path == "0":
        return None, "MLPACK_LIBCUDA=0 turns CUDA off"
    try:
        cuda = ctypes.CDLL(path)
    except OSError as e:
        return None, f"no CUDA driver ({str(e)[:200]})"

    def name(r: int) -> str:
        s = ctypes.c_char_p()
        fn = getattr(cuda, "cuGetErrorName", None)
        if fn is not None and fn(r, ctypes.byref(s)) == 0 and s.value:
            return s.value.decode()
        return "an unknown CUDA error"

    for symbol in ("cuInit", "cuDeviceGetCount", "cuDeviceGet", "cuDeviceGetAttribute"):
        if not hasattr(cuda, symbol):
            return None, f"the CUDA driver lacks {symbol}"
    r = cuda.cuInit(0)
    if r != 0:
        return None, f"the CUDA driver did not start (cuInit: {name(r)})"
    count, dev, major, minor = ctypes.c_int(), ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    if cuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value < 1:
        return None, "the CUDA driver sees no GPU"
    # attributes 75/76: CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR/MINOR
    for r in (cuda.cuDeviceGet(ctypes.byref(dev), 0),
              cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, dev),
              cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev)):
        if r != 0:
            return None, f"the CUDA driver cannot describe GPU 0 ({name(r)})"
    return major.value * 10 + minor.value, ""


def detect_cuda_sm() -> int | None:
    """Device 0's compute capability (probe_cuda), or None."""
    return probe_cuda()[0]


# Linux gives a process the AMX tile state only when asked (arch_prctl ARCH_REQ_XCOMP_PERM for
# XFEATURE_XTILEDATA); a tile instruction before that is SIGILL
_ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA, _SYS_ARCH_PRCTL_X86_64 = 0x1023, 18, 158
_AMX_FLAGS = ("amx_tile", "amx_bf16", "amx_int8", "amx_fp16", "amx-tile", "amx-bf16")


@functools.lru_cache(maxsize=1)
def request_amx() -> str | None:
    """Ask Linux for this process's AMX tile state, as the C engine does when it detects the
    host: None once granted (asking again is harmless), else why not."""
    if platform.system() != "Linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return f"not x86-64 Linux ({platform.system()} {platform.machine()})"
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(_SYS_ARCH_PRCTL_X86_64, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) != 0:
        return f"the kernel refused the tile state (errno {ctypes.get_errno()})"
    return None


@functools.lru_cache(maxsize=1)
def detect_host() -> Host:
    """The machine this process runs on (read once, then cached)."""
    arch = _ARCH.get(platform.machine().lower(), platform.machine().lower())
    features = parse_cpuinfo(_read_cpuinfo(), arch)
    level = None
    if arch == "amd64":
        # every x86-64 CPU has v1; a missing /proc/cpuinfo must not make the host look older
        level = x86_level(features) or 1
        if "amx_tile" in features and request_amx() is not None:   # as host.c: usable or not
            features = frozenset(f for f in features if f not in _AMX_FLAGS)
    sm, why = probe_cuda()
    return Host(platform.system().lower(), arch, features, level, sm, why)


__all__ = ["Host", "detect_host", "detect_cuda_sm", "probe_cuda", "parse_cpuinfo", "request_amx", "x86_level",
           "X86_LEVELS"]
