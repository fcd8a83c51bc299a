"""Affine reads as strided views (spec/ir/views.py) give what the general path gathers."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from mlpack.spec.ir import parse_graph, run_graph, views
from mlpack.spec.ir import expr as ex

RNG = np.random.default_rng(3)


def _both(monkeypatch, g, **inputs):
    """(outputs with the views, outputs with every read gathered by the general path)."""
    fast = run_graph(g, inputs)
    with monkeypatch.context() as m:
        m.setattr(views, "affine", lambda e, syms: None)
        slow = run_graph(g, inputs)
    return fast, slow


def test_affine_forms():
    x, k = ex.var("x"), ex.var("kx")
    assert views.affine(2 * x + k - 1, {}) == (-1, {"x": 2, "kx": 1})
    assert views.affine(ex.sym("h") - x, {"h": 7}) == (7, {"x": -1})
    assert views.affine(x * 3 - x * 3, {}) == (0, {})
    assert views.affine(x // 2, {}) is None
    assert views.affine(x * x, {}) is None


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f8e5m2"])
def test_strided_padded_window_equals_the_gather(monkeypatch, dtype):
    """A stride-2 padded 3x3 window (a convolution's read), in an ml_dtypes type too."""
    g = parse_graph(f'''graph "win" {{
      in %x: {dtype}{{c=3, h=9, w=8}} (c, h, w)
      %y: {dtype}{{c=3, oh=5, ow=4, kh=3, kw=3}} = %x[c=c, h=2 * oh + kh - 1, w=2 * ow + kw - 1; pad=0.0]
      out %y (c, oh, ow, kh, kw)
    }}''')
    np_dtype = {"f32": np.float32, "bf16": ml_dtypes.bfloat16,
                "f8e5m2": ml_dtypes.float8_e5m2}[dtype]
    x = RNG.standard_normal((3, 9, 8)).astype(np_dtype)
    fast, slow = _both(monkeypatch, g, x=x)
    np.testing.assert_array_equal(fast["y"].astype(np.float32), slow["y"].astype(np.float32))
    padded = np.pad(x.astype(np.float32), ((0, 0), (1, 1), (1, 1)))
    assert float(fast["y"][1, 2, 3, 0, 2]) == padded[1, 4, 8]


def test_reversed_diagonal_and_constant_indices(monkeypatch):
    """A var read backwards, one var indexing two dims (a diagonal), a constant index."""
    g = parse_graph('''graph "odd" {
      in %x: f32{a=5, b=5, c=4} (a, b, c)
      %y: f32{i=5} = %x[a=4 - i, b=4 - i, c=2]
      %z: f32{i=5, j=3} = %x[a=i, b=i, c=j + 1]
      out %y (i)
      out %z (i, j)
    }''')
    x = RNG.standard_normal((5, 5, 4)).astype(np.float32)
    fast, slow = _both(monkeypatch, g, x=x)
    np.testing.assert_array_equal(fast["y"], x[::-1, ::-1, 2].diagonal())
    np.testing.assert_array_equal(fast["z"], slow["z"])
    np.testing.assert_array_equal(fast["z"], np.stack([x[i, i, 1:4] for i in range(5)]))


def test_an_unpadded_read_out_of_range_still_raises():
    g = parse_graph('''graph "oob" {
      in %x: f32{h=4} (h)
      %y: f32{o=3} = %x[h=2 * o]
      out %y (o)
    }''')
    from mlpack.spec.errors import IndexRangeError
    with pytest.raises(IndexRangeError, match="4"):
        run_graph(g, {"x": np.zeros(4, np.float32)})


def test_a_copy_shares_its_source_and_outputs_stay_writable():
    g = parse_graph('''graph "copy" {
      in %x: f32{a=2, b=3} (a, b)
      %y: f32{a=2, b=3} = %x[a=a, b=b]
      out %y (a, b)
    }''')
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    y = run_graph(g, {"x": x})["y"]
    np.testing.assert_array_equal(y, x)
    y[0, 0] = 7.0     # the caller's own array, not a read-only view of the input
    assert x[0, 0] != 7.0
