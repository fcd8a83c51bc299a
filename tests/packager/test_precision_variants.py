"""fp16 and bf16 artifacts beside fp32 ones (codegen/precisions/): built for every cpu target,
validated on this host (x86-64 levels it has) or under qemu (aarch64, riscv64) against the
float64 reference within their precision's tolerance, their weights in half the bytes, and
loaded and run by precision like any artifact.

The 16-bit weights are packed into the GEMM panels as they are and widened by the micro-kernel
per vector (SSE, AVX2 and AVX-512 lanes on x86, NEON, RVV), so each target's validation is a
test of that code on a real model against ONNX Runtime's fp32 result as well: the vectors'
baseline.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import support
from support import best_host_target, emulated, patient_emulation
from support import runs_native as _runs_here

import mlpack
from mlpack.packager.build import build
from mlpack.runtime import engine
from mlpack.spec import accuracy, media
from mlpack.spec.container import open_container

ort = pytest.importorskip("onnxruntime")

MODELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models")
MLP = os.path.join(MODELS, "mlp.onnx")
BERT = os.path.join(MODELS, "bert_block.onnx")
CPU = ["x86_64-v2", "x86_64-v3", "x86_64-v4", "aarch64", "riscv64"]


@pytest.fixture(scope="module")
def mlp16(tmp_path_factory):
    path = tmp_path_factory.mktemp("p") / "mlp.mlpack"
    with patient_emulation():   # (the tests assert the emulated ones ran)
        return path, build(MLP, path, targets=CPU, precisions=["fp32,fp16", "bf16"])


def test_every_cpu_target_builds_each_precision_and_validates_where_it_can(mlp16):
    _, report = mlp16
    made = [(a.target, a.precision) for a in report.artifacts]
    assert made == [("portable", "fp32")] + [(t, p) for t in CPU for p in ("fp32", "fp16", "bf16")]
    for a in report.artifacts:
        where = f"{a.target} {a.precision}"
        if _runs_here(a.target) or emulated(a.target):
            assert a.validated, f"{where}: {a.reason}"
        if not a.validated:
            continue
        tol = accuracy.TOLERANCES[a.precision]
        assert a.max_error <= tol.allowed(a.baseline_max_error), where
        if a.precision != "fp32":   # the weights' rounding shows, and stays within its type's
            assert 1e-5 < a.max_error < (2 ** -6 if a.precision == "bf16" else 2 ** -9), where
        assert a.top1 == 1.0, where


def test_16_bit_artifacts_carry_half_the_weight_bytes(mlp16):
    path, _ = mlp16
    c = open_container(str(path))
    sizes = {}
    for art in c.artifacts:
        weights = [layer.size for layer in art.layers if layer.media_type == media.WEIGHTS]
        sizes[art.config["artifact"]["target"], art.precision] = weights[0]
    for t in CPU:
        fp32 = sizes[t, "fp32"]
        # 16-bit weights on every target: one without F16C widens its f16 panels when the
        # engine opens the artifact (they are packed then), not in the file
        assert sizes[t, "bf16"] < 0.51 * fp32 and sizes[t, "fp16"] < 0.51 * fp32, t
    digests = {}
    for art in c.artifacts:   # and each precision's weights are one blob every target shares
        for layer in art.layers:
            if layer.media_type == media.WEIGHTS:
                digests.setdefault(art.precision, set()).add(layer.digest)
    assert all(len(d) == 1 for d in digests.values()), digests


@pytest.mark.skipif(not engine.available(), reason="libmlpack is not built")
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_load_by_precision_runs_it_within_its_tolerance_of_onnxruntime(mlp16, precision):
    path, _ = mlp16
    x = np.random.default_rng(7).standard_normal((3, 784)).astype(np.float32)
    want = ort.InferenceSession(MLP, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    fp32 = mlpack.load(str(path), precision="fp32").run({"x": x})["y"]
    model = mlpack.load(str(path), precision=precision)
    assert model.artifact.precision == precision and model.artifact.device == "cpu"
    got = model.run({"x": x})["y"]
    err = np.abs(got - want).max() / np.abs(want).max()
    err32 = np.abs(fp32 - want).max() / np.abs(want).max()
    assert err32 < 1e-5 < err < accuracy.TOLERANCES[precision].floor
    assert (got.argmax(1) == want.argmax(1)).all()


def test_bf16_products_build_and_validate_on_x86_and_arm(tmp_path, patient_emulation):
    """The targets that multiply bf16 pairs: validated here (AVX512_BF16) or under qemu (its
    default aarch64 CPU has BF16), with the activations rounded (no pass dropped)."""
    report = build(MLP, tmp_path / "m.mlpack", targets=["x86_64-v4-bf16", "aarch64-bf16"],
                   precisions=["bf16"])
    runs = {"x86_64-v4-bf16": _runs_here("x86_64-v4-bf16"),
            "aarch64-bf16": bool(emulated("aarch64-bf16"))}
    for a in report.artifacts[1:]:
        assert a.precision == "bf16" and a.dropped_passes == (), a.target
        if runs[a.target]:
            assert a.validated, f"{a.target}: {a.reason}"
            assert 1e-4 < a.max_error < 2 ** -6 and a.top1 >= 0.95


def test_bert_block_in_bf16_is_validated(tmp_path):
    target = best_host_target("x86_64-v2", "x86_64-v3", "x86_64-v4")
    report = build(BERT, tmp_path / "bert.mlpack", targets=[target], precisions=["bf16"])
    (a,) = [a for a in report.artifacts if a.precision == "bf16"]
    if _runs_here(target):
        assert a.validated, a.reason
        assert a.max_error < 2 ** -6


@pytest.mark.skipif(not engine.available(), reason="libmlpack is not built")
def test_an_accuracy_budget_picks_the_measured_fastest_within_it(mlp16):
    path, report = mlp16
    errors = {(a.target, a.precision): a.max_error for a in report.artifacts if a.validated}
    with mlpack.load(str(path), precision="fp32") as m:
        host = m.artifact.target
    # the build (of several precisions) timed every artifact it ran natively, and only those
    c = open_container(str(path))
    latency = {}
    for art in c.artifacts:
        target = art.config["artifact"]["target"]
        if _runs_here(target):
            assert art.config["latency"]["seconds"] > 0 and art.config["latency"]["threads"] == 1
            assert art.annotations[media.ANN_LATENCY] == repr(art.config["latency"]["seconds"])
            latency[target, art.precision] = art.config["latency"]["seconds"]
        else:
            assert "latency" not in art.config, target
    shown = support.cli("inspect", path).stdout   # inspect says what each run took at build
    assert shown.count("ms a run at build (1 thread)") == len(latency)
    with mlpack.load(str(path), accuracy_budget=errors[host, "fp32"] * 2) as m:
        assert m.artifact.precision == "fp32"
        reasons = {v.artifact.precision: v.reason for v in m.verdicts
                   if v.artifact.config["artifact"]["target"] == host}
        assert "exceeds the accuracy budget" in reasons["bf16"]
    # a loose budget: the one measured fastest of every artifact timed here, whatever its level
    # (selection ranks whole nanoseconds, then the most specific target: two artifacts measured
    # within the same nanosecond are a tie, which the higher level wins)
    loose = 2 * max(errors[k] for k in latency)
    fastest = min(int(s * 1e9) for s in latency.values())
    with mlpack.load(str(path), accuracy_budget=loose) as m:
        assert int(latency[m.artifact.target, m.artifact.precision] * 1e9) == fastest, latency
        assert "fastest artifact within the accuracy budget" in m.artifact.reason
    # no budget: the fastest too (every artifact here passed its precision's tolerance)
    with mlpack.load(str(path)) as m:
        assert int(latency[m.artifact.target, m.artifact.precision] * 1e9) == fastest, latency
