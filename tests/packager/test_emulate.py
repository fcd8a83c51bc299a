"""Artifacts of another architecture validated under qemu-user (packager/emulate.py): the MLP's
aarch64 artifact, run by runtime/c/tools/mlpack_vectors.c cross-compiled with zig under
qemu-aarch64, is validated by ``mlpack build`` and ``mlpack validate`` against the same float64
reference and tolerance as the x86 artifact this host runs; an aarch64 artifact compiled from a
wrong model fails both (dead on arrival; FAIL and exit 2); without qemu it is skipped with the
reason, as before.

The tests that run qemu skip, with the reason, where qemu-aarch64, the aarch64 glibc
(/usr/aarch64-linux-gnu: Debian's qemu-user and libc6-arm64-cross, which .ci/run installs) or
zig is missing, or where this host is arm64 itself. The first one compiles the program into the
user's cache folder (seconds); later runs reuse it.
"""

from __future__ import annotations

import os
import re
import tempfile

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from mlpack.codegen.compile import compile_onnx
from mlpack.packager import build as b
from mlpack.packager import emulate, validation
from mlpack.runtime import detect_host
from mlpack.spec.container import open_container
from mlpack.spec.errors import Error
import support

pytest.importorskip("onnxruntime")

MLP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models", "mlp.onnx")
ARM64 = emulate.EMULATORS["arm64"]
TARGETS = ["x86_64-v2", "aarch64"]   # portable, x86 (runs here), aarch64 (runs under qemu)
X86, AARCH64 = 1, 2                  # their artifact indices


def _why_not() -> str:
    if detect_host().arch != "amd64":
        return f"this host is {detect_host().arch}: the x86 artifact is the one it cannot run"
    return emulate.missing(ARM64)


needs_qemu = pytest.mark.skipif(bool(_why_not()), reason=_why_not() or "")


def _wrong_mlp() -> onnx.ModelProto:
    """The MLP with one logit's bias off by 0.01: a planted defect."""
    model = onnx.load(MLP)
    init = next(i for i in model.graph.initializer if i.name == "4.bias")
    bias = numpy_helper.to_array(init).copy()
    bias[3] += np.float32(1e-2)
    init.CopyFrom(numpy_helper.from_array(bias, init.name))
    return model


def _plant_in_aarch64(monkeypatch) -> None:
    """Compile the aarch64 artifact from the wrong MLP; the test vectors stay the right one's."""
    wrong, real = compile_onnx(_wrong_mlp()), b._compile_one

    def compile_one(graph, target, *rest, **kw):
        if target != "aarch64":
            return real(graph, target, *rest, **kw)
        code, seconds = real(wrong, target, *rest, **kw)
        code.weights, code.raw_weights = code.tensors(wrong), False   # the wrong MLP's own
        return code, seconds
    monkeypatch.setattr(b, "_compile_one", compile_one)


def _no_qemu(monkeypatch) -> None:
    monkeypatch.delenv("MLPACK_QEMU", raising=False)  # the reason is the missing qemu
    monkeypatch.setattr(emulate, "find_qemu", lambda name: None)


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    if _why_not():
        pytest.skip(_why_not())
    out = tmp_path_factory.mktemp("emulate") / "mlp.mlpack"
    lines = []
    report = b.build(MLP, out, targets=TARGETS, progress=lines.append)
    return out, report, lines


@needs_qemu
def test_build_validates_the_aarch64_artifact_under_qemu(mlp):
    path, report, lines = mlp
    x86, arm = report.artifacts[X86], report.artifacts[AARCH64]
    assert (arm.target, arm.validated, arm.emulator, arm.cases) == \
        ("aarch64", True, "qemu-aarch64", 2)
    assert (x86.validated, x86.emulator) == (True, "")
    assert "  validate aarch64 fp32 under qemu-aarch64" in lines
    # judged against the same float64 reference and ONNX Runtime baseline as the x86 artifact
    assert arm.baseline_max_error == x86.baseline_max_error
    assert 0 < arm.max_error < 1e-5 and 0 < arm.rel_l2 < 1e-5
    with open_container(path) as c:
        acc = [a.config["accuracy"] for a in c.artifacts]
    assert acc[AARCH64]["max_error"] == arm.max_error
    for key in ("reference", "baseline", "baseline_max_error", "tolerance"):
        assert acc[AARCH64][key] == acc[X86][key], key


@needs_qemu
def test_emulated_result_is_judged_as_the_native_one(mlp):
    path = str(mlp[0])
    from mlpack.runtime import load

    with load(path) as model:
        native = model.validate(X86)
        verdict = model.verdicts[AARCH64]
    result = emulate.validate(path, verdict.artifact, verdict.reason, ARM64)
    assert result.ok and result.emulator == "qemu-aarch64" and result.cases == native.cases == 2
    assert "under qemu-aarch64" in repr(result)
    [got], [want] = result.outputs, native.outputs
    assert (got.name, got.allowed_max_error, got.allowed_rel_l2, got.baseline_max_error) == \
        (want.name, want.allowed_max_error, want.allowed_rel_l2, want.baseline_max_error)
    assert 0 < got.max_error <= got.allowed_max_error and 0 < got.rel_l2 <= got.allowed_rel_l2


@needs_qemu
def test_validate_command_runs_the_aarch64_artifact_under_qemu(mlp):
    result = support.cli("validate", mlp[0])
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.stdout.splitlines()[1:4]]
    assert [(r[2], r[4], r[-1]) for r in rows] == \
        [("portable", "2", "ok"), ("x86_64-v2", "2", "ok"), ("aarch64", "2", "ok")]
    max_err, rel_l2, allowed = (float(x) for x in rows[2][5:8])
    assert 0 < max_err <= allowed and 0 < rel_l2 <= allowed
    assert "  [2] ok: validated under qemu-aarch64 (arm64, this host is amd64)" in result.stdout


@needs_qemu
def test_planted_defect_in_the_aarch64_artifact_is_dead_on_arrival(tmp_path, monkeypatch):
    _plant_in_aarch64(monkeypatch)
    out = tmp_path / "m.mlpack"
    with pytest.raises(b.DeadOnArrivalError, match=r"artifact 2 \(aarch64, fp32\) fails its test "
                       r"vectors under qemu-aarch64: output 'y': max error [0-9.e-]+ \(allowed"):
        b.build(MLP, out, targets=TARGETS)
    assert not out.exists() and os.listdir(tmp_path) == []


@needs_qemu
def test_planted_defect_in_the_aarch64_artifact_fails_validate(tmp_path, monkeypatch):
    _plant_in_aarch64(monkeypatch)
    _no_qemu(monkeypatch)  # so the build writes it: the aarch64 artifact is not run
    out = tmp_path / "m.mlpack"
    report = b.build(MLP, out, targets=TARGETS)
    assert not report.artifacts[AARCH64].validated
    monkeypatch.undo()
    result = support.cli("validate", out)
    assert result.exit_code == 2, result.output
    row = result.stdout.splitlines()[1 + AARCH64].split()
    assert (row[2], row[4], row[-1]) == ("aarch64", "2", "FAIL")
    assert float(row[5]) > float(row[7])  # max err over what is allowed
    assert "  [2] FAIL: under qemu-aarch64: output 'y': max error" in result.stdout
    assert "1 of 3 artifacts fail their test vectors: 2 (aarch64 fp32)" in result.stderr


@pytest.mark.skipif(detect_host().arch != "amd64",
                    reason="aarch64 is another architecture on x86-64 only")
def test_without_qemu_the_aarch64_artifact_is_skipped_with_the_reason(tmp_path, monkeypatch):
    _no_qemu(monkeypatch)
    out = tmp_path / "m.mlpack"
    report = b.build(MLP, out, targets=["aarch64"])
    arm = report.artifacts[1]
    assert (arm.target, arm.validated, arm.emulator) == ("aarch64", False, "")
    assert arm.reason == ("arm64, this host is amd64; not run under emulation: qemu-aarch64 was "
                          "not found (Debian package qemu-user)")
    result = support.cli("validate", out)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[2].split()[-1] == "skipped"
    assert ("  [1] skipped: passed over: arm64, this host is amd64; not run under emulation: "
            "qemu-aarch64 was not found (Debian package qemu-user)") in result.stdout


@needs_qemu
def test_program_is_built_once_and_a_failed_build_leaves_nothing(tmp_path, monkeypatch):
    exe = emulate.program(ARM64)
    assert exe.is_file() and emulate.program(ARM64) == exe   # cached: the same file
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(emulate, "FLAGS", (*emulate.FLAGS, "-include", "no_such_header.h"))
    with pytest.raises(emulate.NotEmulated,
                       match="zig cc could not build libmlpack for qemu-aarch64"):
        emulate.program(ARM64)
    [folder] = (tmp_path / "cache" / "mlpack" / "qemu").iterdir()
    assert list(folder.iterdir()) == []   # neither the program nor its scratch file


@needs_qemu
def test_a_run_leaves_no_temporary_files(mlp, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    from mlpack.runtime import load

    with load(str(mlp[0])) as model:
        verdict = model.verdicts[AARCH64]
    assert emulate.validate(str(mlp[0]), verdict.artifact, verdict.reason, ARM64).ok
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("lacking, reason", [
    ("switch", "MLPACK_QEMU=0"),
    ("qemu", "qemu-aarch64 was not found (Debian package qemu-user)"),
    ("sysroot", "no arm64 glibc in {sysroot} for qemu-aarch64 (Debian package libc6-arm64-cross)"),
    ("sources", "libmlpack's C sources are not installed, to build for qemu-aarch64 (a checkout "
                "has them: pip install -e ./runtime)"),
])
def test_missing_says_what_is_lacking(tmp_path, monkeypatch, lacking, reason):
    import dataclasses

    pytest.importorskip("ziglang")
    found = None if lacking == "qemu" else "/bin/true"
    monkeypatch.setattr(emulate, "find_qemu", lambda name: found)
    monkeypatch.setenv("MLPACK_QEMU", "0" if lacking == "switch" else "")
    if lacking != "sysroot":
        (tmp_path / "lib").mkdir()
        (tmp_path / "lib" / "ld-linux-aarch64.so.1").touch()
    if lacking == "sources":  # the runtime installed from its wheel
        monkeypatch.setattr(emulate, "_sources", lambda: None)
    emu = dataclasses.replace(ARM64, sysroot=str(tmp_path))
    assert emulate.missing(emu) == reason.format(sysroot=tmp_path)
    if lacking == "sources":
        with pytest.raises(emulate.NotEmulated, match="C sources are not installed"):
            emulate.program(emu)


@needs_qemu
def test_a_run_over_the_build_limit_is_skipped_with_the_reason(mlp, tmp_path, monkeypatch):
    """A build waits EMULATION_SECONDS at most for another CPU's vectors (ResNet-50's take a
    minute under qemu); the artifact is then listed as not validated, saying why."""
    path = str(mlp[0])
    from mlpack.runtime import load

    with load(path) as model:
        verdict = model.verdicts[AARCH64]
    with pytest.raises(emulate.NotEmulated, match=r"ran over 0.001 s under qemu-aarch64"):
        emulate.validate(path, verdict.artifact, verdict.reason, ARM64, timeout=0.001)
    monkeypatch.setenv("MLPACK_EMULATION_SECONDS", "0.001")   # (5 s, EMULATION_SECONDS, unset)
    report = b.build(MLP, tmp_path / "m.mlpack", targets=TARGETS)
    arm = report.artifacts[AARCH64]
    # (predicted from the native run: a start alone is over the limit, so it is not started)
    assert not arm.validated and re.search(r"would take about \d+ s under qemu-aarch64 .* "
                                           r"limit of 0.001 s", arm.reason), arm.reason
    assert report.artifacts[X86].validated


def test_the_build_limit_is_read_from_the_environment(monkeypatch, tmp_path):
    """MLPACK_EMULATION_SECONDS replaces the 5 s limit (a slow CI runner that wants every
    architecture validated in the build raises it); a value that is not a number of seconds
    stops the build before it compiles anything, naming the variable."""
    monkeypatch.delenv("MLPACK_EMULATION_SECONDS", raising=False)
    assert validation.emulation_seconds() == validation.EMULATION_SECONDS == 5.0
    monkeypatch.setenv("MLPACK_EMULATION_SECONDS", " 120 ")
    assert validation.emulation_seconds() == 120.0
    run = validation.NativeRun(0.5, (0.2, 0.2))   # at 470x: both cases 235 s, case 0 141 s
    assert validation.emulated_cases(run, "arm64", 2) == (1, pytest.approx(141.1))
    for bad in ("soon", "-1", "nan", "inf"):
        monkeypatch.setenv("MLPACK_EMULATION_SECONDS", bad)
        with pytest.raises(Error, match=rf"MLPACK_EMULATION_SECONDS='{bad}': expected a number"):
            b.build(MLP, tmp_path / "m.mlpack", targets=["portable"])
        assert not (tmp_path / "m.mlpack").exists()


def test_an_emulated_run_takes_the_first_cases_that_fit_the_limit(monkeypatch):
    """A build predicts each emulated run from the native run's load and per-case times and
    runs the first cases predicted to fit its limit (case 0 first); where not even case 0 fits,
    one case with its prediction, which the run then refuses."""
    monkeypatch.setattr(validation, "EMULATION_SECONDS", 5.0)
    monkeypatch.setattr(validation, "EMULATION_START_SECONDS", 0.5)
    monkeypatch.setattr(validation, "EMULATION_SLOWDOWN", {"arm64": 100.0})
    run = validation.NativeRun(0.05, (0.01, 0.03))   # a load of 0.01 s, a batch-1 and -2 case
    assert run.first(2) == pytest.approx(0.05) and run.first(1) == pytest.approx(0.02)
    k, predicted = validation.emulated_cases(run, "arm64", 2)   # 5.5 s for both, 2.5 for case 0
    assert k == 1 and predicted == pytest.approx(2.5)
    assert validation.emulated_cases(validation.NativeRun(0.02, (0.005, 0.01)), "arm64", 2) \
        == (2, pytest.approx(2.5))
    k, predicted = validation.emulated_cases(validation.NativeRun(0.5, (0.2, 0.2)), "arm64", 2)
    assert k == 1 and predicted > validation.EMULATION_SECONDS
    assert validation.emulated_cases(None, "arm64", 2) == (2, None)


def test_an_emulated_run_is_predicted_with_the_hashing_of_its_artifact(monkeypatch):
    """The engine hashes the artifact's blobs as it opens it, in emulated code: a big model
    whose test cases are small (DistilBERT at sequence 1) is mostly that under qemu, and a run
    predicted from its native time alone was started and killed at the limit."""
    monkeypatch.setattr(validation, "EMULATION_SECONDS", 5.0)
    monkeypatch.setattr(validation, "EMULATION_START_SECONDS", 0.1)
    monkeypatch.setattr(validation, "EMULATION_SECONDS_PER_MB", {"arm64": 0.02})
    monkeypatch.setattr(validation, "EMULATION_SLOWDOWN", {"arm64": 100.0})
    mb = 2 ** 20
    assert validation.predicted_seconds(0.01, "arm64", 100 * mb) == pytest.approx(3.1)
    run = validation.NativeRun(0.01, (0.004, 0.004))
    assert validation.emulated_cases(run, "arm64", 2, 8 * mb) == (2, pytest.approx(1.26))
    k, predicted = validation.emulated_cases(run, "arm64", 2, 253 * mb)   # DistilBERT's size
    assert k == 1 and predicted == pytest.approx(5.76) and predicted > 5.0   # not started
    # an architecture not measured: the slowest known hashing and slowdown
    assert validation.predicted_seconds(0.0, "s390x", 100 * mb) == pytest.approx(2.1)


@needs_qemu
def test_a_build_validates_the_cases_that_fit_under_qemu(mlp, tmp_path, monkeypatch):
    """The build's emulated run takes the cases ``emulated_cases`` picks (here, a limit that
    fits one), judges those, and says so: "validated under qemu-aarch64 on 1 of 2 cases"; the
    native artifacts run every case, their per-case times measured."""
    from mlpack.packager.cli import _artifact_state
    from mlpack.runtime import load

    with load(str(mlp[0])) as model:
        seconds = []
        assert len(model.vector_outputs(X86, seconds)) == len(seconds) == 2
    assert all(t > 0 for t in seconds)
    monkeypatch.setattr(validation, "emulated_cases", lambda native, arch, count, nbytes=0: (1, 0.1))
    lines = []
    report = b.build(MLP, tmp_path / "m.mlpack", targets=TARGETS, progress=lines.append)
    x86, arm = report.artifacts[X86], report.artifacts[AARCH64]
    assert (arm.validated, arm.emulator, arm.cases, x86.cases, report.cases) == \
        (True, "qemu-aarch64", 1, 2, 2)
    assert "  validate aarch64 fp32 under qemu-aarch64 (case 0 of 2)" in lines
    assert "validated under qemu-aarch64 on 1 of 2 cases against float64" in _artifact_state(arm,
                                                                                       cases=2)
    assert "validated on 2 cases" in _artifact_state(x86, cases=2)


@needs_qemu
def test_a_rebuild_reads_the_emulated_run_it_stored(tmp_path, monkeypatch):
    """A warm rebuild runs no native artifact, and predicts its emulated runs from the native
    times the first build stored with their outputs: the same cases, so the run it stored is
    the one it reads (without those times it asked for both cases and ran qemu again)."""
    monkeypatch.setenv("MLPACK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(validation, "emulated_cases",
                        lambda native, arch, count, nbytes=0: (1 if native else count, 0.1))
    cold = b.build(MLP, tmp_path / "cold.mlpack", targets=TARGETS)
    assert cold.artifacts[AARCH64].cases == 1

    def never(*args, **kw):
        raise AssertionError("ran under qemu again")
    monkeypatch.setattr(emulate, "_run", never)
    warm = b.build(MLP, tmp_path / "warm.mlpack", targets=TARGETS)
    assert (warm.artifacts[AARCH64].validated, warm.artifacts[AARCH64].cases) == (True, 1)
    assert warm.artifacts[AARCH64].max_error == cold.artifacts[AARCH64].max_error


@needs_qemu
def test_a_run_predicted_over_the_limit_is_not_started(mlp, monkeypatch):
    """The emulated run's time is predicted from the same vectors' native run; one predicted
    past the limit is not started, and the reason is stored with the runs as a run over the
    limit is, so a rebuild does not predict or wait again."""
    path = str(mlp[0])
    from mlpack.runtime import load

    with load(path) as model:
        verdict = model.verdicts[AARCH64]
    assert validation.predicted_seconds(None) is None
    assert validation.predicted_seconds(0.1) > validation.predicted_seconds(0.01) > 1
    # riscv64 emulates slower than aarch64; an architecture not measured, as the slowest
    assert validation.predicted_seconds(0.01, "riscv64") > validation.predicted_seconds(0.01, "arm64")
    assert validation.predicted_seconds(0.01, "s390x") == validation.predicted_seconds(0.01, "riscv64")
    started = []

    def fake_run(*args):
        started.append(args)
        raise emulate.NotEmulated("started")

    monkeypatch.setattr(emulate, "_run", fake_run)
    runs = {}

    class Runs:
        get_outputs = staticmethod(runs.get)
        put_outputs = staticmethod(runs.__setitem__)

    for _ in range(2):
        with pytest.raises(emulate.NotEmulated, match=r"would take about 20 s under qemu-aarch64"):
            emulate.validate(path, verdict.artifact, verdict.reason, ARM64, timeout=10,
                             runs=Runs, predicted=20.0)
    assert not started and list(runs.values()) == [next(iter(runs.values()))]
    with pytest.raises(emulate.NotEmulated, match="started"):   # under the limit: it runs
        emulate.validate(path, verdict.artifact, verdict.reason, ARM64, timeout=10, predicted=5.0)
    assert started


def test_a_crash_of_qemu_itself_is_not_the_artifacts(mlp, tmp_path, monkeypatch):
    """qemu 7.2's RISC-V translator aborts on some vector code (qemu issue 1441): an assertion of
    qemu's own on stderr says the run proved nothing either way, so the artifact is listed as
    not validated with that reason instead of dead on arrival. A fake qemu plays the crash."""
    path = str(mlp[0])
    from mlpack.runtime import load

    with load(path) as model:
        verdict = model.verdicts[AARCH64]
    fake = tmp_path / "bin" / ARM64.qemu
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho \"qemu-aarch64: ../../target/arm/translate.c:213: f: "
                    "Assertion \\`ctx->insn_start != NULL' failed.\" >&2\nkill -SEGV $$\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(emulate.NotEmulated, match=r"qemu-aarch64 itself failed .*Assertion"):
        emulate.validate(path, verdict.artifact, verdict.reason, ARM64)
