"""spec/ir/erf.py: the interpreter's erf against Python's math.erf, element by element."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mlpack.spec.ir import erf as erf_module
from mlpack.spec.ir.erf import erf

REFERENCE = np.vectorize(math.erf, otypes=[np.float64])


def test_erf_agrees_with_math_erf_to_a_few_ulp():
    # dense over both series and past their ends, the boundaries themselves, and tiny values
    # (erf(x) ~ 2x/sqrt(pi) down to the subnormals)
    edges = [erf_module.NEAR, erf_module.FAR]
    x = np.concatenate([np.linspace(-7, 7, 1_400_001), np.geomspace(1e-310, 7, 50_001),
                        -np.geomspace(1e-310, 7, 5_001), edges, np.negative(edges),
                        np.nextafter(edges, 0), np.nextafter(edges, 10)])
    got, want = erf(x), REFERENCE(x)
    assert got.dtype == np.float64 and got.shape == x.shape
    # (atol: a subnormal result's last place, 5e-324, is a large relative step)
    np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-300)
    assert np.all(np.abs(got) <= 1) and np.all(np.sign(got) == np.sign(x))


def test_erf_special_values():
    got = erf(np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e300, -1e300]))
    assert got[0] == 0 and not np.signbit(got[0])
    assert got[1] == 0 and np.signbit(got[1])
    assert list(got[2:4]) == [1.0, -1.0] and np.isnan(got[4])
    assert list(got[5:]) == [1.0, -1.0]


@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (5,), (2, 3, 4),
                                   (erf_module.CHUNK + 7,), (3, erf_module.CHUNK // 2 + 1)])
def test_erf_keeps_the_shape_across_chunks(shape):
    rng = np.random.default_rng(len(shape))
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    got = erf(x)
    assert got.shape == x.shape and got.dtype == np.float64
    np.testing.assert_allclose(got, REFERENCE(x.astype(np.float64)), rtol=1e-14, atol=0)


def test_erf32_is_the_cpu_targets_approximation_in_float32():
    """The portable interpreter's erf on f32 values: within the cpu target's documented 4.5e-7
    (codegen/llvm/mathlib.py) of math.erf, in float32, its special values as erf's; the f64
    rule stays the exact one (the float64 reference's)."""
    from mlpack.spec.ir.erf import erf32
    from mlpack.spec.ir.scalarops import apply_op

    x = np.concatenate([np.linspace(-7, 7, 1_400_001), np.geomspace(1e-37, 7, 20_001),
                        -np.geomspace(1e-37, 7, 2_001)]).astype(np.float32)
    got = erf32(x)
    want = REFERENCE(x.astype(np.float64))
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_allclose(got, want, rtol=4.5e-7, atol=4.5e-7)
    special = erf32(np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3e38], np.float32))
    assert special[0] == 0 and not np.signbit(special[0]) and np.signbit(special[1])
    assert list(special[[2, 3, 5]]) == [1.0, -1.0, 1.0] and np.isnan(special[4])
    # the interpreter's rule by operand dtype: f32 (and narrower, widened) the cpu target's,
    # f64 the exact series
    np.testing.assert_array_equal(apply_op("erf", [x[:999]], "f32", ["f32"]), got[:999])
    wide = x[:999].astype(np.float64)
    np.testing.assert_array_equal(apply_op("erf", [wide], "f64", ["f64"]), erf(wide))
    half = x[:999].astype(np.float16)
    np.testing.assert_array_equal(apply_op("erf", [half], "f16", ["f16"]),
                                  erf32(half).astype(np.float16))
