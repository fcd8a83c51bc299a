"""values.py and sizes.py: re-indexing by name, broadcasting by name, sizes inferred and checked,
and the errors that name the dim at fault."""

from __future__ import annotations

import numpy as np
import pytest

from mlpack.codegen import dsl
from mlpack.spec.errors import Error
from mlpack.spec.ir.interp import run_graph
from mlpack.spec.ir.graph import Comprehension
from dsl_support import assert_close, rand


def test_reads_broadcast_by_name_whatever_the_order(rng):
    # a[i, j] + b[j]: b's only dim meets a's j by name; the input orders differ on purpose
    g = dsl.to_graph(lambda a, b: a + b, inputs={"a": dsl.f32(j=4, i=3), "b": dsl.f32(j=4)},
                     layouts={"out": "i j"})
    a, b = rand(rng, 4, 3), rand(rng, 4)
    assert_close(run_graph(g, {"a": a, "b": b})["out"], a.T + b[None, :])


def test_keyword_order_of_an_index_does_not_matter():
    def f1(P):
        x, y = dsl.dims("x y")
        return P(x=y, y=x)

    def f2(P):
        x, y = dsl.dims("x y")
        return P(y=x, x=y)

    spec = {"P": dsl.f32(x=3, y=5)}
    assert dsl.to_graph(f1, spec, name="t") == dsl.to_graph(f2, spec, name="t")


def test_transpose_by_renaming(rng):
    g = dsl.to_graph(lambda P: P.rename(x="y", y="x"), {"P": dsl.f32(x=3, y=5)},
                     layouts={"out": "x y"})
    p = rand(rng, 3, 5)
    np.testing.assert_array_equal(run_graph(g, {"P": p})["out"], p.T)


def test_strided_window_size_is_inferred_symbolically():
    def f(P, W):
        x, kx = dsl.dims("x kx")
        return dsl.sum[kx](P(x=2 * x + kx) * W)

    g = dsl.to_graph(f, {"P": dsl.f32(x="len"), "W": dsl.f32(kx=3)})
    (op,) = g.ops
    size = op.type.dims["x"]
    from mlpack.spec.ir.expr import index_value
    assert [index_value(size, {"len": n}) for n in (3, 4, 5, 9)] == [1, 1, 2, 4]


def test_padded_read_and_explicit_size(rng):
    def f(P, W):
        x = P.dim("x")
        kx, = dsl.dims("kx")
        return dsl.sum[kx](P(x=x + kx - 1, pad=0.0) * W)

    g = dsl.to_graph(f, {"P": dsl.f32(x=7), "W": dsl.f32(kx=3)})
    p, w = rand(rng, 7), rand(rng, 3)
    assert_close(run_graph(g, {"P": p, "W": w})["out"], np.convolve(p, w[::-1], mode="same"))


def test_padding_an_expression_materializes_it_first(rng):
    def f(P):
        x = P.dim("x")
        return (P * 2.0)(x=x - 1, pad=-1.0)      # a shift right, padded with -1

    g = dsl.to_graph(f, {"P": dsl.f32(x=5)})
    assert len(g.ops) == 2                      # the map, then the guarded read of it
    p = rand(rng, 5)
    np.testing.assert_array_equal(run_graph(g, {"P": p})["out"], np.r_[-1.0, 2 * p[:-1]])


def test_gather_reads_another_tensor(rng):
    g = dsl.to_graph(lambda E, ids: E(vocab=ids), {"E": dsl.f32(vocab=10, d=4),
                                                     "ids": dsl.i64(b=2, s=3)},
                     layouts={"out": "b s d"})
    e, ids = rand(rng, 10, 4), rng.integers(0, 10, (2, 3))
    np.testing.assert_array_equal(run_graph(g, {"E": e, "ids": ids})["out"], e[ids])


def test_elementwise_maths_maps_to_the_ir_ops(rng):
    def f(a):
        return dsl.sigmoid(a) * dsl.exp(-dsl.abs(a)) + dsl.sqrt(dsl.abs(a))

    g = dsl.to_graph(f, {"a": dsl.f32(i=16)})
    (op,) = g.ops
    assert isinstance(op, Comprehension) and op.reduce is None
    a = rand(rng, 16).astype(np.float64)
    want = 1 / (1 + np.exp(-a)) * np.exp(-np.abs(a)) + np.sqrt(np.abs(a))
    assert_close(run_graph(g, {"a": a.astype(np.float32)})["out"], want)


@pytest.mark.parametrize("fn, inputs, words", [
    # a dim two tensors size differently: both tensors and the dim are named
    (lambda a, b: a * b, {"a": dsl.f32(i=3, ci=32), "b": dsl.f32(ci=16)},
     ["dim ci does not match", "a's ci has size 32", "b's ci has 16"]),
    # re-indexing a dim the tensor does not have
    (lambda P: P(z=0), {"P": dsl.f32(x=3)}, ["P has no dim z", "its dims: x"]),
    # a reduction over a dim the summand lacks
    (lambda P: dsl.sum(P, over=["k"]), {"P": dsl.f32(x=3)}, ["sum over k", "has no dim k"]),
    # a float index
    (lambda P, f: P(x=f), {"P": dsl.f32(x=3), "f": dsl.f32(y=2)},
     ["index of P's x has dtype f32"]),
    # an output layout that misses a dim
    (None, None, None),
])
def test_errors_name_the_dim(fn, inputs, words):
    if fn is None:
        with pytest.raises(Error, match="output out: dim y is not in the layout"):
            dsl.to_graph(lambda P: P * 2.0, {"P": dsl.f32(x=3, y=4)}, layouts={"out": "x"})
        return
    with pytest.raises(dsl.DimError) as e:
        dsl.to_graph(fn, inputs)
    msg = str(e.value)
    assert "\n" not in msg and isinstance(e.value, Error)
    for w in words:
        assert w in msg, msg


def test_out_of_range_read_names_tensor_dim_and_range():
    def f(P):
        x, = dsl.dims("x")
        return P(x=x + 2) + P
    with pytest.raises(dsl.DimError, match=r"P's x has size 5, read at x \+ 2 from 2 to 6"):
        dsl.to_graph(f, {"P": dsl.f32(x=5)})


def test_a_dim_nothing_sizes_is_named():
    def f(P):
        x, = dsl.dims("x")
        return P(x=x - 1, pad=0.0)
    with pytest.raises(dsl.DimError, match=r"dim x of .* has no size.*dsl.dim\('x', size=...\)"):
        dsl.to_graph(f, {"P": dsl.f32(x=5)})


def test_truth_value_of_a_traced_value_is_refused():
    def f(P):
        return P if P > 0 else -P
    with pytest.raises(dsl.DslError, match="no truth value"):
        dsl.to_graph(f, {"P": dsl.f32(x=5)})
