"""Host detection (runtime/host.py): cpuinfo parsing, x86-64 levels, the live host."""

from __future__ import annotations

from mlpack.runtime import detect_host
from mlpack.runtime.host import X86_LEVELS, parse_cpuinfo, x86_level

V1 = "fpu cx8 cmov mmx fxsr sse sse2"
V2 = V1 + " pni ssse3 cx16 sse4_1 sse4_2 popcnt lahf_lm"
V3 = V2 + " avx avx2 bmi1 bmi2 f16c fma abm movbe xsave"
V4 = V3 + " avx512f avx512bw avx512cd avx512dq avx512vl"


def _cpuinfo(key: str, flags: str) -> str:
    return f"processor\t: 0\nvendor_id\t: X\n{key}\t\t: {flags}\n\nprocessor\t: 1\n{key}\t: none\n"


def test_x86_levels_need_every_feature_of_every_lower_level():
    assert [x86_level(parse_cpuinfo(_cpuinfo("flags", f), "amd64")) for f in (V1, V2, V3, V4)] \
        == [1, 2, 3, 4]
    assert x86_level(set(V4.split()) - {"popcnt"}) == 1  # a v2 hole caps the level
    assert x86_level(set()) is None
    assert all(n == i + 1 for i, (n, _) in enumerate(X86_LEVELS))


def test_feature_aliases():
    x86 = parse_cpuinfo(_cpuinfo("flags", V3), "amd64")
    assert {"sse4.1", "sse4_1", "lzcnt", "abm", "sse3", "pni"} <= x86
    arm = parse_cpuinfo(_cpuinfo("Features", "fp asimd asimdhp asimddp bf16"), "arm64")
    assert {"neon", "asimd", "fp16", "dotprod", "bf16"} <= arm


def test_the_live_host_is_consistent():
    host = detect_host()
    assert host is detect_host()  # detected once
    assert host.os and host.arch
    if host.arch == "amd64":
        assert 1 <= host.x86_level <= 4
    else:
        assert host.x86_level is None
    assert host.cuda_sm is None or host.cuda_sm >= 10
    assert host.describe().startswith(f"{host.os}/{host.arch}")
