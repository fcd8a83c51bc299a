"""int8 artifacts (codegen/precisions/int8.py): calibrated at build time (seeded random inputs,
or ``--calibration DIR`` of .npz files), built for every cpu target and validated on this host
or under qemu against the float64 reference within int8's tolerance, their contraction weights
in a quarter of the bytes, and chosen under an accuracy budget only when it allows their error.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import support
from support import emulated, patient_emulation
from support import runs_native as _runs_here

import mlpack
from mlpack.packager.build import BuildError, build
from mlpack.runtime import engine
from mlpack.spec import accuracy, media
from mlpack.spec.container import open_container

MODELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models")
MLP = os.path.join(MODELS, "mlp.onnx")
# v3 as well as v2: two x86 levels validate on every x86-64 host (v4 needs AVX-512, vnni more)
CPU = ["x86_64-v2", "x86_64-v3", "x86_64-v4", "x86_64-v4-vnni", "aarch64", "aarch64-dotprod",
       "aarch64-i8mm"]


@pytest.fixture(scope="module")
def mlp8(tmp_path_factory):
    path = tmp_path_factory.mktemp("p") / "mlp.mlpack"
    with patient_emulation():   # (the tests assert the emulated ones ran)
        return path, build(MLP, path, targets=CPU, precisions=["fp32,bf16,int8"])


def test_int8_builds_for_every_cpu_target_and_validates_where_it_can(mlp8):
    _, report = mlp8
    made = [(a.target, a.precision) for a in report.artifacts if a.precision == "int8"]
    assert made == [(t, "int8") for t in CPU]
    for a in report.artifacts:
        if a.precision != "int8":
            continue
        assert a.integer_sums == 3, a   # the MLP's three layers sum bytes
        if _runs_here(a.target) or emulated(a.target):
            assert a.validated, f"{a.target}: {a.reason}"
        if a.validated:
            tol = accuracy.TOLERANCES["int8"]
            # 8 bits show (more than bf16's rounding), within the tolerance, the class kept
            assert 2 ** -10 < a.max_error <= tol.allowed(a.baseline_max_error), a.target
            assert a.top1 >= 0.9, a.target
    # the sums are exact integers on every level, with or without dot-product instructions
    # (qemu runs aarch64-i8mm's USDOT): the errors differ by the f32 epilogues' rounding only
    errors = [a.max_error for a in report.artifacts if a.precision == "int8" and a.validated]
    assert len(errors) >= 2 and max(errors) <= min(errors) * (1 + 1e-3)


def test_int8_weights_take_a_quarter_of_the_bytes(mlp8):
    path, _ = mlp8
    sizes = {}
    for art in open_container(str(path)).artifacts:
        weights = [layer.size for layer in art.layers if layer.media_type == media.WEIGHTS]
        sizes[art.config["artifact"]["target"], art.precision] = weights[0]
    for t in ("x86_64-v2", "x86_64-v4", "aarch64"):
        assert sizes[t, "int8"] < 0.3 * sizes[t, "fp32"], t


@pytest.mark.skipif(not engine.available(), reason="libmlpack is not built")
def test_a_budget_tighter_than_int8s_error_never_picks_it(mlp8):
    path, report = mlp8
    errors = {(a.target, a.precision): a.max_error for a in report.artifacts if a.validated}
    host = [t for t in CPU if (t, "int8") in errors and _runs_here(t)]
    if not host:
        pytest.skip("no int8 artifact runs here")
    worst8 = max(errors[t, "int8"] for t in host)
    best8 = min(errors[t, "int8"] for t in host)
    with mlpack.load(str(path), accuracy_budget=best8 / 2) as m:
        assert m.artifact.precision in ("fp32", "bf16")
    with mlpack.load(str(path), accuracy_budget=2 * worst8) as m:   # allowed: the measured
        # fastest wins, and what this host cannot run never does
        assert _runs_here(m.artifact.target)
    with mlpack.load(str(path), precision="int8") as m:
        assert m.artifact.precision == "int8" and _runs_here(m.artifact.target)
        x = np.random.default_rng(3).standard_normal((4, 784)).astype(np.float32)
        got = m.run({"x": x})["y"]
        want = mlpack.load(str(path), precision="fp32").run({"x": x})["y"]
        assert np.abs(got - want).max() <= 0.1 * np.abs(want).max()


def test_calibration_inputs_come_from_a_directory(tmp_path):
    folder = tmp_path / "calib"
    folder.mkdir()
    rng = np.random.default_rng(5)
    for i in range(3):
        np.savez(folder / f"{i}.npz", x=rng.standard_normal((1, 784)).astype(np.float32) * 3)
    report = build(MLP, tmp_path / "a.mlpack", targets=["x86_64-v2"], precisions=["int8"],
                   calibration=folder)
    assert "calibrate" in report.timings
    a = [a for a in report.artifacts if a.precision == "int8"][0]
    if _runs_here("x86_64-v2"):
        assert a.validated, a.reason
    with pytest.raises(BuildError, match="no .npz files"):
        build(MLP, tmp_path / "b.mlpack", targets=["x86_64-v2"], precisions=["int8"],
              calibration=tmp_path)
    np.savez(folder / "bad.npz", y=np.zeros(3))
    with pytest.raises(mlpack.Error, match="has no array for input 'x'"):
        build(MLP, tmp_path / "c.mlpack", targets=["x86_64-v2"], precisions=["int8"],
              calibration=folder)
    assert not (tmp_path / "c.mlpack").exists()


def test_cli_builds_int8_with_a_calibration_directory(tmp_path):
    folder = tmp_path / "calib"
    folder.mkdir()
    np.savez(folder / "0.npz", x=np.random.default_rng(1).standard_normal((2, 784)).astype(
        np.float32))
    out = tmp_path / "m.mlpack"
    r = support.cli("build", MLP, "-o", out, "-t", "x86_64-v2", "-p", "int8",
                    "--calibration", folder)
    assert r.exit_code == 0, r.stdout
    assert "x86_64-v2 int8" in r.stdout and "nothing quantized" not in r.stdout


def test_an_int8_artifact_that_quantizes_nothing_says_so(tmp_path):
    """A model whose one contraction is too shallow for 8-bit sums (K = 8): its int8 artifact
    computes in f32, which the report counts and the CLI says."""
    from onnx import TensorProto, helper

    w = np.random.default_rng(5).standard_normal((8, 16)).astype(np.float32)
    path = tmp_path / "shallow.onnx"
    path.write_bytes(support.one_output_model(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", TensorProto.FLOAT, ["n", 8])],
        [("w", w)]).SerializeToString())
    report = build(str(path), tmp_path / "s.mlpack", targets=["x86_64-v2"], precisions=["int8"])
    [art] = [a for a in report.artifacts if a.precision == "int8"]
    assert art.integer_sums == 0 and art.validated
    assert [a.integer_sums for a in report.artifacts if a.precision != "int8"] == [None]
    r = support.cli("build", path, "-o", tmp_path / "c.mlpack", "-t", "x86_64-v2", "-p", "int8")
    assert r.exit_code == 0, r.stdout
    assert "x86_64-v2 int8" in r.stdout and "nothing quantized" in r.stdout


def test_a_quantized_model_builds_int8_by_default_and_runs_its_own_integers(tmp_path):
    """ONNX Runtime's QDQ model: no --precision gives int8 (its own precision), its deep
    contractions as the model's integers summed in i32, judged with int8's tolerance, and the
    native artifact's outputs are ONNX Runtime's for the same model (its exact int8 kernels:
    support.oracle_outputs) within an output step."""
    import onnx
    quantized = support.load_models_module("quantized")
    qdq = quantized.qdq_convnet(str(tmp_path))
    out = tmp_path / "q.mlpack"
    report = build(qdq, out, targets=["x86_64-v2"])
    assert [(a.target, a.precision) for a in report.artifacts] == [
        ("portable", "fp32"), ("x86_64-v2", "int8")]
    assert all(a.validated for a in report.artifacts), report.artifacts
    with open_container(str(out)) as c:
        assert [a.config["accuracy"]["tolerance"]["precision"] for a in c.artifacts] == ["int8"] * 2
    model = onnx.load(qdq)
    step = float(onnx.numpy_helper.to_array(next(
        t for t in model.graph.initializer if t.name == "y_scale")))
    with mlpack.load(str(out), device="cpu") as m:
        assert m.artifact.precision == "int8"
        for feed in quantized.feeds(3, 21):
            [want] = support.oracle_outputs(model, feed, "ort-exact")
            np.testing.assert_allclose(m(**feed)["y"], want, rtol=0, atol=2 * step)


@pytest.mark.parametrize("op", ["QLinearConv", "MatMulInteger"])
def test_a_model_of_integer_operators_builds_int8_and_computes_onnxs_integers(tmp_path, op):
    """QLinearConv (u8 x s8, requantized) and MatMulInteger (u8 x u8 with zero points, i32
    out): int8 by default, their sums on the integer kernels (qlinear.py), and the native
    artifact's outputs are ONNX's reference evaluator's bit for bit."""
    import onnx
    quantized = support.load_models_module("quantized")
    model, feeds = (quantized.qlinear_conv() if op == "QLinearConv"
                    else quantized.matmul_integer(np.uint8, 3))
    onnx.save(model, tmp_path / "m.onnx")
    report = build(tmp_path / "m.onnx", tmp_path / "m.mlpack", targets=["x86_64-v2"])
    assert [(a.target, a.precision) for a in report.artifacts] == [
        ("portable", "fp32"), ("x86_64-v2", "int8")]
    assert all(a.validated for a in report.artifacts), report.artifacts
    [want] = support.oracle_outputs(model, feeds, "reference")
    with mlpack.load(str(tmp_path / "m.mlpack"), device="cpu") as m:
        np.testing.assert_array_equal(m(**feeds)["y"], want)


def test_an_int8_artifact_that_misses_keeps_its_most_sensitive_activations_in_f32(tmp_path):
    """A hidden layer whose one channel sits at 1000 (a bias) leaves 8 bits no steps for the
    others, which the next layer reads: quantizing it misses int8's tolerance. The build keeps
    that activation in f32, found by measuring each one's effect, and the artifact validates;
    so does a rebuild whose int8 code comes from the kernel cache."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(3)
    w1 = (rng.standard_normal((64, 64)) / 8).astype(np.float32)
    b1 = np.zeros(64, np.float32)
    b1[5] = 1000.0
    w2 = (rng.standard_normal((64, 64)) / 8).astype(np.float32)
    w2[5] = 0.0   # the outlier channel does not reach the output
    model = support.one_output_model(
        [helper.make_node("MatMul", ["x", "w1"], ["h0"]), helper.make_node("Add", ["h0", "b1"], ["h"]),
         helper.make_node("MatMul", ["h", "w2"], ["y"])],
        [("x", TensorProto.FLOAT, ["n", 64])], [("w1", w1), ("b1", b1), ("w2", w2)])
    path = tmp_path / "outlier.onnx"
    path.write_bytes(model.SerializeToString())
    for run in ("cold", "warm"):   # warm: the retry's code from the kernel cache, its f32
        # contraction's weights still in the archive
        lines = []
        report = build(str(path), tmp_path / "o.mlpack", targets=["x86_64-v2"],
                       precisions=["int8"], progress=lines.append, cache=tmp_path / "kernels")
        [art] = [a for a in report.artifacts if a.precision == "int8"]
        assert art.f32_activations == 1 and art.validated, (run, art)
        assert any("most sensitive of 2 quantized activations in f32" in line for line in lines)
        assert art.max_error <= accuracy.TOLERANCES["int8"].allowed(art.baseline_max_error)
    assert report.cache["hits"] > 0


def test_a_max_pooling_of_bytes_builds_for_x86_and_aarch64(tmp_path, patient_emulation):
    """A convolution, a max pooling and a convolution: int8 quantizes before the pooling, so the
    cpu kernels take the max of u8 values over a padded window; validated where they run."""
    path = tmp_path / "stem.onnx"
    path.write_bytes(support.conv_pool_conv_model(np.random.default_rng(4)).SerializeToString())
    targets = ["x86_64-v2", "x86_64-v3", "aarch64-dotprod"]
    report = build(str(path), tmp_path / "s.mlpack", targets=targets, precisions=["int8"])
    arts = [a for a in report.artifacts if a.precision == "int8"]
    assert [a.target for a in arts] == targets
    for a in arts:
        if _runs_here(a.target) or emulated(a.target):
            assert a.validated and a.f32_activations == 0, a
            assert a.max_error <= accuracy.TOLERANCES["int8"].allowed(a.baseline_max_error)
