"""Selection (runtime/select.py) on synthetic containers, with hosts given explicitly."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from runtime_helpers import ARM, AVX2, AVX512, GPU, OLD_X86, Host, artifact, every_target, write

from mlpack.runtime import select_artifact
from mlpack.runtime.select import _policy_fault, host_fault, rank_key
from mlpack.spec.container import open_container
from mlpack.spec.errors import Error, NoRunnableArtifactError


def _select(path, host, **kw):
    with open_container(path) as box:
        art, verdicts = select_artifact(box, host, **kw)
        return art.index, {v.artifact.index: v for v in verdicts}


@pytest.fixture
def full(tmp_path, tiny):
    return write(tmp_path / "full.mlpack", tiny, every_target(tiny))


def test_avx512_host_picks_v4_and_says_why_not_the_others(full):
    chosen, v = _select(full, AVX512)
    assert chosen == 3
    assert v[3].chosen and v[3].reason == "chosen: x86-64 v4 cpu fp32 (artifact 3) is the most " \
                                          "specific artifact this host runs"
    assert v[0].reason == "portable: runs anywhere; slower"
    assert v[1].reason == v[2].reason == "passed over: x86-64 v4 cpu fp32 (artifact 3) ranks higher"
    assert v[4].reason == v[5].reason == "passed over: arm64, this host is amd64"
    assert v[6].reason == "passed over: needs a CUDA GPU: this host has none"
    assert sum(x.chosen for x in v.values()) == 1
    assert [i for i, x in v.items() if x.runnable] == [0, 1, 2, 3]


def test_avx2_host_picks_v3_and_v4_needs_the_level(full):
    chosen, v = _select(full, AVX2)
    assert chosen == 2
    assert v[3].reason == "passed over: needs x86-64 v4, this host is x86-64 v3"


def test_missing_feature_is_named(tmp_path, tiny):
    # a v3 host that lacks fma (a level claimed but a feature absent): the feature is named
    host = Host("linux", "amd64", frozenset({"avx2"}), 3)
    path = write(tmp_path / "f.mlpack", tiny, [artifact(tiny),
                                                artifact(tiny, "cpu", target="x86_64-v3",
                                                         features=("avx2", "fma", "avx512f"))])
    chosen, v = _select(path, host)
    assert chosen == 0
    assert v[1].reason == "passed over: needs fma, avx512f, this host lacks them"
    path = write(tmp_path / "g.mlpack", tiny, [artifact(tiny), artifact(
        tiny, "cpu", target="x86_64-v3", features=("avx512f",))])
    assert _select(path, AVX2)[1][1].reason == "passed over: needs avx512f, this host lacks it"


def test_arm64_host_without_a_budget_picks_the_fastest(full):
    """No budget: the fastest artifact; none was timed, so the narrower precision of the more
    specific target (fp16 with dotprod) outranks fp32; precision= pins fp32."""
    chosen, v = _select(full, ARM)
    assert chosen == 5
    assert v[4].reason == ("passed over: arm64 cpu fp16 (artifact 5) ranks higher "
                           "(ask for precision='fp32')")
    assert v[3].reason == "passed over: amd64, this host is arm64"
    assert _select(full, ARM, precision="fp32")[0] == 4


def test_old_x86_host_gets_portable(full):
    chosen, v = _select(full, OLD_X86)
    assert chosen == 0
    assert v[0].reason.startswith("chosen: portable: runs anywhere; slower")
    assert v[1].reason == "passed over: needs x86-64 v2, this host is x86-64 v1"


def test_gpu_host_prefers_cuda_and_checks_the_sm(full, tmp_path, tiny):
    chosen, v = _select(full, GPU)
    assert chosen == 7   # cuda first; of its precisions, untimed, the narrower
    assert v[2].reason == "passed over: cuda sm_80 fp16 (artifact 7) ranks higher"
    assert v[6].reason == ("passed over: cuda sm_80 fp16 (artifact 7) ranks higher "
                           "(ask for precision='fp32')")
    assert _select(full, GPU, precision="fp32")[0] == 6
    path = write(tmp_path / "sm90.mlpack", tiny,
                 [artifact(tiny), artifact(tiny, "cuda", target="cuda", cuda_sm=90)])
    chosen, v = _select(path, GPU)
    assert chosen == 0 and v[1].reason == "passed over: needs sm_90, this host's GPU is sm_86"


def test_device_and_precision_requests(full):
    chosen, v = _select(full, GPU, device="cpu", precision="fp32")
    assert chosen == 2 and v[6].reason == "passed over: device 'cpu' was requested"
    chosen, v = _select(full, GPU, precision="fp16")
    assert chosen == 7 and v[6].reason == "passed over: precision 'fp16' was requested"
    assert _select(full, AVX512, device="portable")[0] == 0
    with pytest.raises(NoRunnableArtifactError) as info:
        _select(full, AVX512, precision="fp16")
    msg = str(info.value)
    assert "no artifact runs on this host" in msg
    assert "arm64 cpu fp16 (artifact 5): passed over: arm64, this host is amd64" in msg
    assert "x86-64 v4 cpu fp32 (artifact 3): passed over: precision 'fp16' was requested" in msg
    with pytest.raises(Error, match="device 'tpu' is not one of"):
        _select(full, AVX512, device="tpu")


def test_accuracy_budget_picks_the_fastest_within_it(full):
    chosen, v = _select(full, ARM, accuracy_budget=1e-2)
    assert chosen == 5 and "fastest artifact within the accuracy budget 0.01" in v[5].reason
    chosen, v = _select(full, ARM, accuracy_budget=1e-3)
    assert chosen == 4
    assert v[5].reason == "passed over: max_error 0.002 exceeds the accuracy budget 0.001"
    chosen, _ = _select(full, GPU, accuracy_budget=1e-3)
    assert chosen == 7  # cuda fp16 (error 1e-3) is within 1e-3 and faster than cuda fp32
    with pytest.raises(Error, match="accuracy budget -1"):
        _select(full, GPU, accuracy_budget=-1)


def test_under_a_budget_a_measured_latency_outranks_the_precisions_name(tmp_path, tiny):
    def box(fp32_s, fp16_s):
        specs = [artifact(tiny),
                 artifact(tiny, "cpu", target="aarch64", features=("neon",), latency=fp32_s),
                 artifact(tiny, "cpu", "fp16", target="aarch64", features=("neon",), err=2e-3,
                          latency=fp16_s)]
        return write(tmp_path / f"t{fp32_s}-{fp16_s}.mlpack", tiny, specs)
    with open_container(box(None, None)) as c:     # not timed: fp16 is guessed faster
        assert select_artifact(c, ARM, accuracy_budget=1e-2)[0].index == 2
    with open_container(box(1e-3, 2e-3)) as c:     # timed: fp32 was faster on the build host
        winner, v = select_artifact(c, ARM, accuracy_budget=1e-2)
        assert winner.index == 1 and "fastest artifact within the accuracy budget" in v[1].reason
    with open_container(box(1e-3, 0.5e-3)) as c:
        assert select_artifact(c, ARM, accuracy_budget=1e-2)[0].index == 2
    with open_container(box(1e-3, 2e-3)) as c:     # no budget: the fastest, as measured
        winner, v = select_artifact(c, ARM)
        assert winner.index == 1
        assert v[1].reason == ("chosen: arm64 cpu fp32 (artifact 1) is the fastest artifact this "
                               "host runs (timed at build)")
    with open_container(box(1e-3, 0.5e-3)) as c:
        assert select_artifact(c, ARM)[0].index == 2
    with open_container(box(None, None)) as c:     # not timed: the narrower precision
        assert select_artifact(c, ARM)[0].index == 2


def test_a_level_the_build_host_could_not_time_counts_as_the_one_it_extends(tmp_path, tiny):
    """Built on an AVX2 host (v3 timed, v4 not: that host could not run it), opened on an
    AVX-512 one: v4 counts as fast as the v3 artifact of its precision whose instructions it
    extends, and ranks above it; a precision timed faster at v3 that v4 lacks still wins. The
    C engine's test_select.c checks the same, word for word."""
    def box(fp32_s, fp16_s):
        specs = [artifact(tiny),
                 artifact(tiny, "cpu", target="x86_64-v3", features=("avx2", "fma"),
                          latency=fp32_s),
                 artifact(tiny, "cpu", "fp16", target="x86_64-v3", features=("avx2", "fma"),
                          err=1e-3, latency=fp16_s),
                 artifact(tiny, "cpu", target="x86_64-v4",
                          features=("avx2", "fma", "avx512f", "avx512bw"))]
        return write(tmp_path / f"t{fp32_s}-{fp16_s}.mlpack", tiny, specs)
    with open_container(box(2e-3, 3e-3)) as c:
        winner, v = select_artifact(c, AVX512)
        assert winner.index == 3
        assert v[3].reason == ("chosen: x86-64 v4 cpu fp32 (artifact 3) is the fastest artifact "
                               "this host runs (as x86-64 v3 cpu fp32 (artifact 1) timed at "
                               "build, whose instructions it extends)")
        assert v[1].reason == "passed over: x86-64 v4 cpu fp32 (artifact 3) ranks higher"
        assert select_artifact(c, AVX2)[0].index == 1   # where v4 cannot run: as timed
    with open_container(box(2e-3, 1e-3)) as c:
        assert select_artifact(c, AVX512)[0].index == 2


def test_without_a_budget_native_code_outranks_the_interpreter_at_any_precision(tmp_path, tiny):
    """A container whose only fp32 artifact is the portable one and whose native ones are int8
    (`-t x86_64-v4-vnni -p int8`): the host runs the native int8 code, not the interpreter;
    beside a native fp32 artifact of the same target, untimed, the narrower one ranks first."""
    native = artifact(tiny, "cpu", "int8", target="aarch64", features=("neon",), err=2e-2)
    with open_container(write(tmp_path / "a.mlpack", tiny, [artifact(tiny), native])) as c:
        winner, v = select_artifact(c, ARM)
        assert winner.index == 1 and v[0].reason == "portable: runs anywhere; slower"
    fp32 = artifact(tiny, "cpu", target="aarch64", features=("neon",))
    with open_container(write(tmp_path / "b.mlpack", tiny, [artifact(tiny), native, fp32])) as c:
        winner, v = select_artifact(c, ARM)
        assert winner.index == 1
        assert v[2].reason == ("passed over: arm64 cpu int8 (artifact 1) ranks higher "
                               "(ask for precision='fp32')")


def test_min_runtime_and_unknown_platforms_are_passed_over(tmp_path, tiny):
    specs = [artifact(tiny, min_runtime="0.1.0"),
             artifact(tiny, "cpu", target="x86_64-v2", min_runtime="99.0.0"),
             artifact(tiny, "cpu", target="x86_64-v2",
                      platform={"os": "windows", "architecture": "amd64", "variant": "v2"})]
    chosen, v = _select(write(tmp_path / "r.mlpack", tiny, specs), AVX2)
    assert chosen == 0
    assert v[1].reason.startswith("passed over: needs mlpack runtime 99.0.0, this is ")
    assert v[2].reason == "passed over: windows, this host is linux"


def test_no_portable_and_nothing_fits_raises_naming_each(tmp_path, tiny):
    path = write(tmp_path / "n.mlpack", tiny, every_target(tiny)[1:4])
    with pytest.raises(NoRunnableArtifactError) as info:
        _select(path, ARM)
    assert str(info.value).count("passed over: amd64, this host is arm64") == 3


def test_code_types_restrict_what_this_runtime_executes(full):
    from mlpack.spec import media
    chosen, v = _select(full, AVX512, code_types={media.PROGRAM_PORTABLE})
    assert chosen == 0 and not v[3].runnable
    assert "native ELF code, which this runtime cannot execute yet" in v[3].reason


# ---------------------------------------------------------------- properties


class _Box:
    """Just what select_artifact reads of a Container: a path and the artifacts."""

    def __init__(self, artifacts):
        self.path, self.artifacts = "box", artifacts


_FEATURES = ["sse4_2", "avx2", "fma", "avx512f", "avx512bw", "neon", "fp16", "dotprod"]


@settings(max_examples=200)
@given(subset=st.lists(st.integers(0, 7), min_size=1, max_size=8, unique=True),
       arch=st.sampled_from(["amd64", "arm64"]), level=st.integers(1, 4),
       features=st.sets(st.sampled_from(_FEATURES)), sm=st.sampled_from([None, 75, 80, 90]),
       device=st.sampled_from([None, "cpu", "cuda", "portable"]),
       precision=st.sampled_from([None, "fp32", "fp16"]),
       budget=st.sampled_from([None, 0.0, 1e-3, 1e-2]))
def test_selection_invariants(full_artifacts, subset, arch, level, features, sm, device, precision,
                              budget):
    host = Host("linux", arch, frozenset(features), level if arch == "amd64" else None, sm)
    box = _Box([full_artifacts[i] for i in subset])
    try:
        winner, verdicts = select_artifact(box, host, device=device, precision=precision,
                                           accuracy_budget=budget)
    except NoRunnableArtifactError as e:
        assert str(e).count("passed over:") == len(subset)
        return
    assert [v.artifact for v in verdicts] == box.artifacts and all(v.reason for v in verdicts)
    assert [v.artifact for v in verdicts if v.chosen] == [winner]
    assert host_fault(winner, host) is None
    assert device in (None, winner.device) and precision in (None, winner.precision)
    for v in verdicts:  # nothing runnable and allowed outranks the winner
        allowed = _policy_fault(v.artifact, device, precision, budget) is None
        assert v.runnable == (host_fault(v.artifact, host) is None)
        if v.runnable and allowed:
            assert rank_key(v.artifact, box.artifacts) <= rank_key(winner, box.artifacts)


@pytest.fixture(scope="module")
def full_artifacts(tmp_path_factory):
    from mlpack.spec.ir import parse_graph
    from runtime_helpers import TINY
    g = parse_graph(TINY)
    path = write(tmp_path_factory.mktemp("full") / "full.mlpack", g, every_target(g))
    with open_container(path) as box:
        return list(box.artifacts)
