"""A build's validation (packager/validation.py): the portable interpreter's run goes beside
the native artifacts' runs once the first of them (the one that times the emulated runs'
predictions) has run, in a thread with its own open of the file, and is judged as it was in
line; a machine of one core runs it in line."""

from __future__ import annotations

import os
import threading

import pytest
from support import best_host_target

from mlpack.codegen import cores
from mlpack.packager import validation
from mlpack.packager.build import build

MODELS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models")
MLP = os.path.join(MODELS, "mlp.onnx")
NATIVE = ("x86_64-v2", best_host_target("x86_64-v2", "x86_64-v3", "x86_64-v4"))


def _build(tmp_path, monkeypatch, machine: int):
    ran = []
    real = validation._interpreted

    def spy(*a, **k):
        ran.append(threading.current_thread().name)
        return real(*a, **k)
    monkeypatch.setattr(validation, "_interpreted", spy)
    monkeypatch.setattr(cores, "machine", lambda: machine)
    report = build(MLP, tmp_path / "mlp.mlpack", targets=["portable", *sorted(set(NATIVE))],
                   cache=False)
    return report, ran


@pytest.mark.parametrize("machine", [2, 1])
def test_the_interpreter_runs_beside_the_native_artifacts(tmp_path, monkeypatch, machine):
    report, ran = _build(tmp_path, monkeypatch, machine)
    assert ran == (["mlpack-qemu_0"] if machine > 1 else [])
    portable = [a for a in report.artifacts if a.target == "portable"]
    assert portable and all(a.validated for a in report.artifacts)


def test_a_wrong_interpreted_artifact_is_still_dead_on_arrival(tmp_path, monkeypatch):
    real = validation._interpreted

    def off(*a, **k):   # its outputs 1% off, as a wrong portable artifact's would be
        got, times = real(*a, **k)
        return [{n: v * v.dtype.type(1.01) for n, v in case.items()} for case in got], times
    monkeypatch.setattr(validation, "_interpreted", off)
    monkeypatch.setattr(cores, "machine", lambda: 2)
    with pytest.raises(validation.DeadOnArrivalError, match=r"artifact 0 \(portable, fp32\)"):
        build(MLP, tmp_path / "mlp.mlpack", targets=["portable", NATIVE[-1]], cache=False)
    assert os.listdir(tmp_path) == []
