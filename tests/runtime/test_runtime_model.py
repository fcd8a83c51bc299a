"""mlpack.load: fallback warnings, input checks, dynamic batch, layouts, test vectors, validate."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from runtime_helpers import AVX512, OLD_X86, artifact, every_target, write

import mlpack
from mlpack.spec.errors import (Error, InputError, NoRunnableArtifactError, PortableFallbackError,
                                PortableFallbackWarning)

RNG = np.random.default_rng(0)


def _x(n):
    return RNG.standard_normal((n, 4)).astype(np.float32)


def _two_feeds(batch=2, seq=5):
    return {"ids": RNG.integers(0, 9, (batch, seq)), "mask": np.ones((batch, seq), np.float32),
            "scale": np.array([1, 2, 3], np.float32)}


@pytest.fixture
def only_portable(tmp_path, tiny):
    cases = [{"x": _x(1)}, {"x": _x(3)}]
    return write(tmp_path / "p.mlpack", tiny, [artifact(tiny, cases=cases)])


@pytest.fixture
def two_model(tmp_path, two):
    # the signature lists y as (batch, seq, c); the program's layout is (c, batch, seq)
    spec = artifact(two, out_order={"y": ("batch", "seq", "c")}, cases=[_two_feeds()])
    path = write(tmp_path / "two.mlpack", two, [spec])
    with pytest.warns(PortableFallbackWarning):
        with mlpack.load(path) as m:
            yield m


# ---------------------------------------------------------------- the portable fallback


def test_only_portable_warns_with_the_reason_and_strict_raises(only_portable):
    with pytest.warns(PortableFallbackWarning, match="this container has no native artifact"):
        m = mlpack.load(only_portable)
    m.close()
    with pytest.raises(PortableFallbackError, match="strict=True"):
        mlpack.load(only_portable, strict=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # asking for portable is not a fallback
        mlpack.load(only_portable, device="portable", strict=True).close()


def test_native_artifacts_that_do_not_fit_are_named_in_the_warning(tmp_path, tiny):
    path = write(tmp_path / "all.mlpack", tiny, every_target(tiny))
    with pytest.warns(PortableFallbackWarning) as rec:
        m = mlpack.load(path, host=OLD_X86)
    msg = str(rec[0].message)
    assert "no native artifact fits" in msg
    assert "x86-64 v2 cpu fp32 (artifact 1): needs x86-64 v2, this host is x86-64 v1" in msg
    assert "arm64 cpu fp32 (artifact 4): arm64, this host is amd64" in msg
    assert m.artifact.device == "portable" and m.artifact.index == 0
    assert len(m.verdicts) == 8
    np.testing.assert_array_equal(m(x=np.ones((2, 4), np.float32))["y"], [[1, 2, 3, 4]] * 2)
    with pytest.raises(PortableFallbackError, match="needs x86-64 v2"):
        mlpack.load(path, host=OLD_X86, strict=True)
    with pytest.raises(NoRunnableArtifactError, match="device 'cpu' was requested"):
        mlpack.load(path, host=AVX512, device="cpu")  # the fake ELF code cannot run in Python


# ---------------------------------------------------------------- signature and running


def test_signature_and_dynamic_batch(only_portable):
    with pytest.warns(PortableFallbackWarning), mlpack.load(only_portable) as m:
        assert [str(i) for i in m.inputs] == ["x: f32[batch, c=4]"]
        assert m.inputs[0].shape == ("batch", 4) and m.outputs[0].dims == ("batch", "c")
        for n in (1, 4):
            x = _x(n)
            y = m.run({"x": x})["y"]
            assert y.shape == (n, 4)
            np.testing.assert_array_equal(y, np.maximum(x + np.arange(4, dtype=np.float32), 0))
        assert m(x=_x(2))["y"].shape == (2, 4)
    with pytest.raises(Error, match="closed"):
        m.run({"x": _x(1)})


def test_outputs_come_in_the_signature_axis_order(two_model):
    feeds = _two_feeds(batch=2, seq=5)
    y = two_model.run(feeds)["y"]
    assert y.shape == (2, 5, 3)
    want = feeds["ids"][..., None].astype(np.float32) * feeds["scale"]
    np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize("change, fragment", [
    (lambda f: f.pop("mask"), "missing input 'mask' (mask: f32[batch, seq])"),
    (lambda f: f.update(extra=np.ones(1)), "unknown input 'extra'; the model's inputs are ids, mask"),
    (lambda f: f.update(mask=f["mask"].astype(np.float64)),
     "input 'mask' is float64, the model takes f32 (float32)"),
    (lambda f: f.update(ids=f["ids"].astype(np.int32)), "input 'ids' is int32, the model takes i64"),
    (lambda f: f.update(mask=np.ones((2, 5, 1), np.float32)), "input 'mask' has rank 3"),
    (lambda f: f.update(scale=np.ones(4, np.float32)),
     "input 'scale' dim 'c' (axis 0) is 4, the model takes 3"),
    (lambda f: f.update(mask=np.ones((2, 9), np.float32)),
     "input 'mask' dim 'seq' (axis 1) is 9, but input 'ids' bound seq=5"),
    (lambda f: f.update(mask=np.ones((3, 5), np.float32)),
     "input 'mask' dim 'batch' (axis 0) is 3, but input 'ids' bound batch=2"),
    (lambda f: f.update(scale=[1.0, 2.0, 3.0]), "input 'scale' is float64"),
])
def test_bad_inputs_are_named(two_model, change, fragment):
    two_model.run(_two_feeds(batch=2, seq=5))   # the good signature passed (and is kept)
    feeds = _two_feeds(batch=2, seq=5)
    change(feeds)
    with pytest.raises(InputError) as info:
        two_model.run(feeds)
    assert fragment in str(info.value)


def test_feeds_must_be_a_dict(two_model):
    with pytest.raises(InputError, match="must be a dict"):
        two_model.run([np.ones(3)])


# ---------------------------------------------------------------- test vectors and validate


def test_test_vectors_and_validate(only_portable, two_model):
    with pytest.warns(PortableFallbackWarning), mlpack.load(only_portable) as m:
        cases = m.test_vectors()
        assert [tuple(c[0]["x"].shape) for c in cases] == [(1, 4), (3, 4)]
        assert set(cases[0][1]) == {"y"}
        result = m.validate()
        assert result.ok and result.cases == 2 and result.artifact.index == 0
        (check,) = result.outputs
        assert check.name == "y" and check.max_abs_error == 0.0 and check.atol == 1e-6
    assert two_model.validate().ok


def test_validate_reports_errors_beyond_tolerance(tmp_path, tiny):
    spec = artifact(tiny, cases=[{"x": _x(2)}])
    # tamper with the expected output (before writing) so the check must fail
    from mlpack.spec.tensorfile import read_tensors, write_tensors
    vectors = {k: np.array(v) for k, v in read_tensors(spec.layers[2].data).items()}
    vectors["case0/output/y"] = vectors["case0/output/y"] + 0.5
    spec.layers[2].data = write_tensors(vectors, {"cases": 1})
    path = write(tmp_path / "bad.mlpack", tiny, [spec])
    with pytest.warns(PortableFallbackWarning), mlpack.load(path) as m:
        result = m.validate()
        assert not result.ok and result.outputs[0].max_abs_error == pytest.approx(0.5)
        with pytest.raises(Error, match="there is no artifact 7"):
            m.validate(7)


def test_validate_another_runnable_artifact(tmp_path, tiny):
    # two portable artifacts: fp32 and a (pretend) fp16 with a looser tolerance
    path = write(tmp_path / "v.mlpack", tiny, [
        artifact(tiny, cases=[{"x": _x(2)}]),
        artifact(tiny, precision="fp16", cases=[{"x": _x(2)}], err=1e-3, rtol=1e-2, atol=1e-3)])
    with pytest.warns(PortableFallbackWarning), mlpack.load(path, precision="fp32") as m:
        assert m.artifact.precision == "fp32"
        other = m.validate(1)
        assert other.ok and other.artifact.precision == "fp16" and other.outputs[0].rtol == 1e-2


def test_bad_arguments_are_errors(only_portable):
    with pytest.raises(Error, match="threads"):
        mlpack.load(only_portable, threads=0)
    with pytest.raises(Error, match="precision 'fp64' is not one of"):
        mlpack.load(only_portable, precision="fp64")
