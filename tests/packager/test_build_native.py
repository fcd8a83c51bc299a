"""``mlpack build`` with the cpu targets: x86_64-v2/v3/v4 and aarch64 artifacts beside the portable.

Each cpu artifact carries its ELF kernels, a plan, a weights archive and the portable artifact's
test vectors; every one this host can run is validated through the C engine before the file is
written. A target that cannot lower an op of the model is skipped with a warning (or refused when
named), and the container still runs through its portable artifact. Native execution needs
libmlpack; tests that run native code skip where it is not built or the host is below x86-64
v3, and expect the host's level (v4 with AVX-512, else v3) to be validated and chosen, the levels
above it passed over.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from support import cli, emulated, host_lacks, load_light, patient_emulation

import mlpack
from mlpack.codegen.targets.cpu.target import TARGETS as CPU_TARGETS
from mlpack.codegen.targets import registry
from mlpack.packager import build as build_mod
from mlpack.packager.build import BuildError, DeadOnArrivalError, SkippedTargetWarning, build
from mlpack.runtime import detect_host, engine
from mlpack.spec import media
from mlpack.spec.container import open_container

ort = pytest.importorskip("onnxruntime")

MODELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models")
MLP = os.path.join(MODELS, "mlp.onnx")
BERT = os.path.join(MODELS, "bert_block.onnx")
RTOL, ATOL = 1e-4, 1e-5
ALL = ["portable", "x86_64-v2", "x86_64-v3", "x86_64-v4", "aarch64", "riscv64"]
LEVEL = min(detect_host().x86_level or 0, 4)
HOST_TARGET = f"x86_64-v{LEVEL}"   # what the engine picks from a default build here
NATIVE_HERE = engine.available() and detect_host().arch == "amd64" and LEVEL >= 3
needs_native = pytest.mark.skipif(not NATIVE_HERE,
                                  reason="needs libmlpack on an x86-64 v3 or v4 host")

light = load_light()


def _ort(model, feeds):
    model = model if isinstance(model, onnx.ModelProto) else onnx.load(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def _quiet_load(path, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mlpack.PortableFallbackWarning)
        return mlpack.load(path, **kw)


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    out = tmp_path_factory.mktemp("native") / "mlp.mlpack"
    lines = []
    with patient_emulation():   # (the tests below assert the emulated ones ran)
        report = build(MLP, out, progress=lines.append, cache=False)   # every target compiled
    return out, report, lines


# ---------------------------------------------------------------- what the container holds


def test_every_default_target_is_built_by_default(mlp):
    _, report, lines = mlp
    assert [a.target for a in report.artifacts] == ALL == [
        t for t in build_mod.DEFAULT_TARGETS if "fp32" in registry.get(t).precisions]
    assert report.skipped == []
    assert set(report.target_seconds) == set(ALL[1:])
    assert all(report.artifacts[i].seconds == report.target_seconds[t] for i, t in enumerate(ALL) if i)
    # one progress line for the lowering (targets compile side by side), then one per target
    assert f"lower {', '.join(ALL[1:])} fp32..." in lines
    for target in ALL[1:]:
        assert any(line.strip().startswith(f"{target}: ") and "llvm" in line for line in lines)


def test_cpu_artifacts_have_platform_features_plan_and_layers(mlp):
    out, _, _ = mlp
    with open_container(out) as c:
        portable, *cpu = c.artifacts
        vectors = portable.layer(media.TESTVECTORS).digest
        for art, target in zip(cpu, ALL[1:]):
            cfg = art.config["artifact"]
            assert (art.device, cfg["target"], cfg["precision"]) == ("cpu", target, "fp32")
            assert art.platform == media.platform_for(target)
            assert art.annotations[media.ANN_CPU_FEATURES] == ",".join(cfg["cpu_features"])
            assert [layer.media_type for layer in art.layers] == [
                media.CODE_ELF, media.WEIGHTS, media.TESTVECTORS]
            assert art.layer(media.TESTVECTORS).digest == vectors  # one blob for every artifact
            assert bytes(c.blob(art.layers[0].digest))[:4] == b"\x7fELF"
            plan = art.config["plan"]
            assert plan["abi"] == 1 and plan["dispatches"] and plan["symbols"] == ["batch"]
        # every level's features are a superset of the level below, in the spelling hosts use
        v2, v3, v4 = (set(a.config["artifact"]["cpu_features"]) for a in cpu[:3])
        assert v2 < v3 < v4 and "bmi1" in v3 and "avx512f" in v4 and "avx2" not in v2
        assert cpu[3].config["artifact"]["cpu_features"] == ["asimd"]
        # the weights archives are equal in content here, so stored once
        assert len({a.layer(media.WEIGHTS).digest for a in cpu}) == 1


def test_features_match_the_codegen_targets_up_to_spelling():
    for t in CPU_TARGETS.values():
        got = media.config_cpu_features(t.features, t.arch)
        assert len(got) == len(t.features) - ("fp-armv8" in t.features)
        assert "bmi" not in got and "fp-armv8" not in got and "neon" not in got


def test_the_host_reports_every_feature_of_the_levels_it_runs():
    # the config's names are what both runtimes' host detection reports (cpuinfo spellings)
    host = detect_host()
    for t in CPU_TARGETS.values():
        level = int(t.name.split("-")[1][1:]) if t.arch == "amd64" else 0
        if t.amx and "amx_tile" not in host.cpu_features:
            continue
        if t.arch == host.arch and host.x86_level and level <= host.x86_level:
            assert set(media.config_cpu_features(t.features, t.arch)) <= host.cpu_features


@needs_native
def test_every_x86_artifact_was_validated_here(mlp):
    _, report, _ = mlp
    for a in report.artifacts:
        arch = (media.platform_for(a.target) or {}).get("architecture", "amd64")
        if host_lacks(a.target) is None or emulated(a.target):  # qemu-user: test_emulate.py
            assert a.validated and a.cases == 2 and a.max_abs_error < ATOL, a
            assert a.emulator == emulated(a.target), a
        elif arch == "amd64":   # a level above the host's
            assert not a.validated and f"this host is x86-64 v{LEVEL}" in a.reason, a
        else:
            assert not a.validated and f"{arch}, this host is amd64" in a.reason, a


@needs_native
def test_validate_command_passes_every_runnable_artifact(mlp):
    out, _, _ = mlp
    result = cli("validate", out)
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.stdout.splitlines()[1:6]]
    assert [r[-1] for r in rows] == ["ok", "ok", "ok", "ok" if LEVEL >= 4 else "skipped",
                                     "ok" if emulated("aarch64") else "skipped"]


@needs_native
def test_build_command_prints_times_and_validation(tmp_path, patient_emulation):
    result = cli("build", MLP, "-o", tmp_path / "m.mlpack", "-t", "x86_64-v3", "-t", "aarch64")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "3 artifacts" in out and "portable fp32: validated on 2 cases" in out
    assert "x86_64-v3 fp32: built in " in out and "s, validated on 2 cases" in out
    assert "aarch64 fp32: built in" in out
    if emulated("aarch64"):
        assert "s, validated under qemu-aarch64 on 2 cases" in out
    else:
        assert "not validated: arm64, this host is amd64" in out


def test_only_named_targets_are_built_and_portable_always(tmp_path):
    report = build(MLP, tmp_path / "m.mlpack", targets=["x86_64-v2"])
    assert [a.target for a in report.artifacts] == ["portable", "x86_64-v2"]


# ---------------------------------------------------------------- models


@needs_native
def test_bert_block_all_targets_match_onnxruntime(tmp_path, patient_emulation):
    out = tmp_path / "bert.mlpack"
    report = build(BERT, out)
    assert [a.validated for a in report.artifacts] == [
        host_lacks(t) is None or bool(emulated(t)) for t in ALL]
    ids = np.random.default_rng(3).integers(0, 100, (2, 7)).astype(np.int64)
    with mlpack.load(out) as m:
        assert m.artifact.target == HOST_TARGET
        got = m.run({"ids": ids})
    for name, want in _ort(BERT, {"ids": ids}).items():
        np.testing.assert_allclose(got[name], want, rtol=RTOL, atol=ATOL, err_msg=name)


def _light_case(tmp_path, name):
    model = light.random_weight_model(name, 0)
    out = tmp_path / f"{name}.mlpack"
    try:
        report = build(model, out, cases=1, name=name)
        assert [a.target for a in report.artifacts] == ALL, report.skipped
        assert all(a.validated for a in report.artifacts[:ALL.index(HOST_TARGET) + 1])
        feeds = light.random_inputs(model, seed=1)
        with mlpack.load(out) as m:
            assert m.artifact.target == HOST_TARGET
            got = m.run(feeds)
        rtol, atol = light.tolerances(name)
        for key, want in _ort(model, feeds).items():
            np.testing.assert_allclose(got[key], want, rtol=max(rtol, RTOL), atol=max(atol, ATOL))
        return report
    finally:  # pytest keeps old tmp folders; these files are big
        out.unlink(missing_ok=True)


@needs_native
def test_squeezenet_all_targets(tmp_path):
    _light_case(tmp_path, "squeezenet")


@needs_native
def test_resnet50_all_targets(tmp_path):
    # how long it takes is measured by the benchmark (benchmarks/RESULTS.md, "build s"), not here
    report = _light_case(tmp_path, "resnet50")
    assert set(report.target_seconds) == set(ALL[1:])


# ---------------------------------------------------------------- ops the cpu target cannot lower


def _topk_model():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6])
    outs = [helper.make_tensor_value_info("v", TensorProto.FLOAT, ["batch", 2]),
            helper.make_tensor_value_info("i", TensorProto.INT64, ["batch", 2])]
    k = helper.make_tensor("k", TensorProto.INT64, [1], [2])
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1)
    graph = helper.make_graph([node], "topk", [x], outs, [k])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


# every importable op lowers to the cpu target now, so the refusal is simulated where the
# packager meets it: compile_cpu raising UnsupportedTargetError, as it does for a part it cannot
# lower (an unsupported dtype, a procedure with unbounded sizes)
_REFUSAL = "cpu: %v is computed by an op the cpu target does not lower (simulated)"


@pytest.fixture
def unlowerable(monkeypatch):
    from mlpack.codegen.errors import UnsupportedTargetError
    from mlpack.codegen.targets.cpu import compile as cpu_compile

    def refuse(graph, target, disabled=frozenset()):
        raise UnsupportedTargetError(_REFUSAL)
    monkeypatch.setattr(cpu_compile, "compile_cpu", refuse)


def test_unlowerable_op_builds_portable_only_with_a_warning(tmp_path, unlowerable):
    model, fragment = _topk_model(), "does not lower (simulated)"
    lines = []
    with pytest.warns(SkippedTargetWarning) as rec:
        report = build(model, tmp_path / "m.mlpack", progress=lines.append, name="m")
    line = ", ".join(ALL[1:]) + ": skipped: "
    assert str(rec[0].message).startswith(line) and fragment in str(rec[0].message)
    assert str(rec[0].message).endswith("the container still runs through the portable artifact")
    assert any(x.startswith("warning: " + line) for x in lines)
    assert [a.target for a in report.artifacts] == ["portable"]
    assert [t for t, _ in report.skipped] == ALL[1:]
    width = model.graph.input[0].type.tensor_type.shape.dim[1].dim_value
    feeds = {"x": np.random.default_rng(0).standard_normal((3, width)).astype(np.float32)}
    with pytest.warns(mlpack.PortableFallbackWarning, match="no native artifact"):
        m = mlpack.load(tmp_path / "m.mlpack")
    with m:
        got = m.run(feeds)
    for name, want in _ort(model, feeds).items():
        np.testing.assert_allclose(got[name], want, rtol=RTOL, atol=ATOL)


def test_unlowerable_op_on_a_named_target_is_an_error(tmp_path, unlowerable):
    with pytest.raises(BuildError, match=r"x86_64-v3: .*simulated.*--target x86_64-v3"):
        build(_topk_model(), tmp_path / "m.mlpack", targets=["x86_64-v3"])
    assert os.listdir(tmp_path) == []


def test_cli_prints_the_skip_warning(tmp_path, unlowerable):
    onnx.save(_topk_model(), tmp_path / "topk.onnx")
    result = cli("build", tmp_path / "topk.onnx", "-o", tmp_path / "topk.mlpack")
    assert result.exit_code == 0, result.output
    assert "warning: " + ", ".join(ALL[1:]) + ": skipped: " in result.stderr
    assert "simulated" in result.stderr
    assert "portable artifact" in result.stderr and "1 artifact," in result.stdout


def test_refused_targets_and_precisions_name_what_is_available(tmp_path):
    with pytest.raises(BuildError, match="unknown target 'cuda-sm70'; targets are: portable, x86_64-v2"):
        build(MLP, tmp_path / "m.mlpack", targets=["x86_64-v4", "cuda-sm70"])
    with pytest.raises(BuildError, match="target portable builds fp32, not bf16, int8"):
        build(MLP, tmp_path / "m.mlpack", targets=["portable"], precisions=["bf16", "int8"])
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------- dead on arrival


@needs_native
def test_native_artifact_with_wrong_answers_is_dead_on_arrival(tmp_path, monkeypatch):
    real = engine.NativeExecutor.run
    monkeypatch.setattr(engine.NativeExecutor, "run",
                        lambda self, feeds: {k: v + 1 for k, v in real(self, feeds).items()})
    with pytest.raises(DeadOnArrivalError, match=r"artifact 1 \(x86_64-v2, fp32\) fails its test"):
        build(MLP, tmp_path / "m.mlpack", targets=["x86_64-v2"])
    assert os.listdir(tmp_path) == []


@needs_native
def test_native_code_that_cannot_load_is_dead_on_arrival(tmp_path, monkeypatch):
    real = build_mod.artifact_spec

    def broken(name, target, *args, **kw):
        spec = real(name, target, *args, **kw)
        if target == "x86_64-v3":
            spec.layers[0].data = b"\x7fELF not really"
        return spec

    monkeypatch.setattr(build_mod, "artifact_spec", broken)
    with pytest.raises(DeadOnArrivalError, match=r"artifact 1 \(x86_64-v3, fp32\) cannot run"):
        build(MLP, tmp_path / "m.mlpack", targets=["x86_64-v3"])
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("beside", [True, False])
def test_validation_holds_one_artifact_loaded_at_a_time(tmp_path, monkeypatch, beside):
    # a model's packed weights are as big as its file: the chosen artifact, held while each
    # other one was validated, made GPT-2's build peak 1 GB higher. The portable interpreter
    # goes beside one native artifact where the model is small (validation.BESIDE_BYTES), else
    # it too runs alone
    from mlpack.codegen import cores
    from mlpack.packager import validation
    from mlpack.runtime import model as model_mod

    live = {"native": 0, "portable": 0}
    most = {"native": 0, "portable": 0, "all": 0}

    def counted(cls, kind):
        class Counted(cls):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                live[kind] += 1
                most[kind] = max(most[kind], live[kind])
                most["all"] = max(most["all"], sum(live.values()))

            def close(self):
                live[kind] -= 1
                super().close()
        return Counted
    monkeypatch.setattr(engine, "NativeExecutor", counted(engine.NativeExecutor, "native"))
    monkeypatch.setitem(model_mod.EXECUTORS, media.PROGRAM_PORTABLE,
                        counted(model_mod.EXECUTORS[media.PROGRAM_PORTABLE], "portable"))
    monkeypatch.setattr(cores, "machine", lambda: 2)
    if not beside:
        monkeypatch.setattr(validation, "BESIDE_BYTES", 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = build(MLP, tmp_path / "m.mlpack", cache=False)
    validated = [a for a in report.artifacts if a.validated]
    assert len(validated) >= 3   # portable, x86-64 v2 and the levels up to the host's
    assert most["native"] == most["portable"] == 1 and sum(live.values()) == 0
    assert most["all"] <= (2 if beside else 1)
