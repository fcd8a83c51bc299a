"""spec/accuracy.py: the error measures, the per-precision bound and the blind-spot check, on
arrays whose errors are known."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mlpack.spec import accuracy as acc

FP32 = acc.TOLERANCES["fp32"]


def _logits(scale: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A float64 reference of class scores at ``scale`` and its fp32 rounding (a baseline)."""
    ref = np.random.default_rng(seed).standard_normal((4, 1000)) * scale
    return ref, ref.astype(np.float32)


@pytest.mark.parametrize("scale", [1.5e5, 3e-5])
def test_errors_are_relative_to_the_output_scale(scale):
    ref, base = _logits(scale)
    e = acc.measure(base, ref)
    # fp32 rounding of each element: at most half an ulp, whatever the scale
    assert 0 < e.max_error <= 2.0 ** -24 and 0 < e.rel_l2 <= 2.0 ** -24
    assert e.max_abs_error == pytest.approx(e.max_error * np.abs(ref).max())
    assert e.top1 == 1.0


@pytest.mark.parametrize("scale", [1.5e5, 3e-5])
def test_reordered_sum_passes_and_a_planted_defect_fails(scale):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((8, 512)) * scale
    w = rng.standard_normal((512, 100))
    ref = a @ w
    a32, w32 = a.astype(np.float32), w.astype(np.float32)
    base = a32 @ w32  # one summation order (BLAS)
    # another: the terms summed from the last to the first, in fp32
    reordered = np.zeros((8, 100), np.float32)
    for k in reversed(range(512)):
        reordered += a32[:, k:k + 1] * w32[k]
    errs = lambda got: acc.measure(got, ref, base)
    baseline = acc.measure(base, ref)
    assert not np.array_equal(reordered, base)
    assert acc.judge("y", errs(reordered), baseline, FP32).ok

    off_channel = base.copy()
    off_channel[:, int(np.argmax(np.abs(ref).max(axis=0)))] *= 1 + 1e-3
    assert not acc.judge("y", errs(off_channel), baseline, FP32).ok
    off_small_channel = base.copy()
    off_small_channel[:, 17] *= 1 + 1e-3  # any channel: the L2 measure sees it
    assert not acc.judge("y", errs(off_small_channel), baseline, FP32).ok
    # the model adds a bias; the artifact dropped it
    bias = rng.standard_normal(100) * scale
    with_bias = ref + bias
    baseline = acc.measure(base + bias.astype(np.float32), with_bias)
    assert not acc.judge("y", acc.measure(base, with_bias), baseline, FP32).ok


def test_bound_is_a_multiple_of_the_baseline_with_a_floor():
    assert FP32.allowed(0.0) == FP32.floor
    assert FP32.allowed(1e-3) == pytest.approx(FP32.multiple * 1e-3)
    recorded = {"precision": "fp32", "multiple": 4, "floor": 1e-9}
    assert acc.tolerance_for("fp32", recorded) == acc.Tolerance("fp32", 4.0, 1e-9)
    assert acc.tolerance_for("fp32", {"bad": 1}) == FP32
    with pytest.raises(KeyError):
        acc.tolerance_for("fp7")


def test_exact_outputs_match_either_reference():
    ref = np.array([0, 1, 2, 3], np.int64)
    base = np.array([0, 1, 2, 4], np.int64)  # a near tie resolved the other way
    assert acc.measure(np.array([0, 1, 2, 4]), ref, base).mismatches == 0
    assert acc.measure(np.array([0, 1, 2, 3]), ref, base).mismatches == 0
    assert acc.measure(np.array([1, 1, 2, 3]), ref, base).mismatches == 1


def test_non_finite_elements_must_match():
    ref = np.array([1.0, np.inf, np.nan, 2.0])
    good = np.array([1.0, np.inf, np.nan, 2.0], np.float32)
    assert acc.measure(good, ref).mismatches == 0
    assert acc.measure(np.array([1.0, 5.0, np.nan, 2.0]), ref).mismatches == 1
    assert acc.measure(np.array([1.0, np.inf, 0.0, 2.0]), ref).mismatches == 1
    # a nan where the reference is finite is an infinite error, not a skipped element
    assert math.isinf(acc.measure(np.array([np.nan, np.inf, np.nan, 2.0]), ref).max_error)


def test_shape_mismatch_and_zero_reference():
    e = acc.measure(np.zeros((2, 3)), np.zeros((3, 2)))
    assert e.note.startswith("shape") and not acc.judge("y", e, acc.Errors(), FP32).ok
    # an all-zero reference has no scale: the errors are absolute
    assert acc.measure(np.full(4, 1e-3), np.zeros(4)).max_error == pytest.approx(1e-3)


def test_worst_folds_cases():
    a = acc.Errors(1e-7, 2e-7, 1.0, 0, 1.0)
    b = acc.Errors(3e-7, 1e-7, 0.5, 2, 0.75)
    w = a.worst(b)
    assert (w.max_error, w.rel_l2, w.max_abs_error, w.mismatches, w.top1) == (3e-7, 2e-7, 1.0, 2,
                                                                               0.75)


def test_blind_spots():
    rng = np.random.default_rng(0)
    constant = [{"prob": np.full((1, 1000), 1e-3, np.float32)} for _ in range(2)]
    [note] = acc.blind_spots(constant)
    assert "'prob'" in note and "every element of every case" in note and "--inputs" in note
    same = [{"y": np.arange(6.0)} for _ in range(2)]
    assert "same for every test case" in acc.blind_spots(same)[0]
    varied = [{"y": rng.standard_normal(6)} for _ in range(2)]
    assert acc.blind_spots(varied) == []
    # one case of varied values, and a scalar output, are not blind spots
    assert acc.blind_spots([{"y": rng.standard_normal(6), "n": np.float32(3)}]) == []
