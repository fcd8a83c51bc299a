"""The target registry (codegen/targets/registry.py) is the one list of targets: the spec's
platforms and devices agree with it, `mlpack build --help` and the build's refusals come from
it, and a target added to it alone (here a second portable target) is built, validated and
written like the others."""

from __future__ import annotations

import os

import pytest

from mlpack.codegen.targets import registry
from mlpack.codegen.targets.base import OPT_IN, PLANNED, Target
from mlpack.packager import build as b
from mlpack.spec import media
from mlpack.spec.container import open_container

from support import cli

MLP = os.path.join(os.path.dirname(__file__), "..", "..", "models", "mlp.onnx")


def test_spec_platforms_and_devices_agree_with_the_registry():
    for t in registry.TARGETS.values():
        assert t.device in media.DEVICES, t
        assert media.platform_for(t.name) == t.platform, t.name
        assert set(t.precisions) <= set(media.PRECISIONS), t.name
    assert set(media.PLATFORMS) == {t.name for t in registry.TARGETS.values() if t.platform}


def test_defaults_and_refusals_come_from_the_registry():
    assert registry.defaults()[0] == registry.ALWAYS == "portable"
    assert "x86_64-v4-amx" not in registry.defaults() and "x86_64-v4-amx" in registry.implemented()
    assert registry.expand(["cuda", "portable", "cuda-sm90"]) == ["cuda-sm80", "cuda-sm90", "portable"]
    assert [t for t, _ in b.plan_artifacts(["cuda"])] == ["portable", "cuda-sm80", "cuda-sm90"]
    with pytest.raises(b.BuildError, match=r"unknown target 'x86'; targets are: portable, x86_64-v2"):
        b.plan_artifacts(["x86"])
    # (x86_64-v4-bf16 is a default target of the bf16 precision only)
    assert b.plan_artifacts() == [(t, "fp32") for t in registry.defaults()
                                  if "fp32" in registry.get(t).precisions]
    assert ("x86_64-v4-bf16", "bf16") in b.plan_artifacts(precisions=["all"])
    assert ("x86_64-v4-vnni", "int8") in b.plan_artifacts(precisions=["all"])


def test_a_planned_target_is_refused_by_name(monkeypatch):
    planned = Target("tpu", "tpu", None, "tensor processing units", PLANNED)
    monkeypatch.setitem(registry.TARGETS, planned.name, planned)
    with pytest.raises(b.BuildError, match=r"target tpu is not implemented yet \(planned\); "
                                           r"available: portable, x86_64-v2"):
        b.plan_artifacts(["tpu"])


def test_build_help_lists_every_target_and_precision():
    result = cli("build", "--help")
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    for t in registry.TARGETS.values():
        assert f"{t.name}: " in text, t.name
    assert "x86_64-v4-amx: " in text and "[only when named]" in text and "cuda-sm90: " in text
    assert ("Precisions (--precision, repeatable or comma-separated, or all): fp32 (the "
            "default), fp16, bf16, int8.") in text


def test_a_target_added_to_the_registry_alone_is_built_and_validated(tmp_path, monkeypatch):
    portable = registry.TARGETS["portable"]
    extra = Target("portable-again", "portable", None, "a second portable target", OPT_IN,
                   compiler=portable.compiler)
    monkeypatch.setitem(registry.TARGETS, extra.name, extra)
    out = tmp_path / "m.mlpack"
    report = b.build(MLP, out, targets=["portable-again"])
    assert [(a.target, a.validated) for a in report.artifacts] == [("portable", True),
                                                                   ("portable-again", True)]
    with open_container(str(out)) as c:
        assert [a.config["artifact"]["target"] for a in c.artifacts] == ["portable", "portable-again"]


def test_every_implemented_target_names_a_compiler_that_exists():
    import importlib

    for t in registry.TARGETS.values():
        if t.implemented:
            module, function = t.compiler.split(":")
            assert callable(getattr(importlib.import_module(module), function)), t.name
        else:
            assert t.status == PLANNED, t.name
