"""reduce.py: reductions written as in the maths, against float64 NumPy; the paper's capsule
layer and its EM routing (examples/capsules) among them."""

from __future__ import annotations

import numpy as np
import pytest

from mlpack.codegen import dsl
from mlpack.spec.ir.graph import Comprehension
from mlpack.spec.ir.interp import run_graph
from dsl_support import assert_close, example, rand

capsules = example("capsules")
reference = example("reference")


def capsule_inputs(rng, n=2, size=9, ci=4, co=5):
    P = rand(rng, n, size, size, ci, 4, 4)
    W = rand(rng, 3, 3, ci, co, 4, 4, scale=1 / np.sqrt(36 * ci))
    return P, W


def test_capsule_conv_is_one_contraction_equal_to_einsum(rng):
    P, W = capsule_inputs(rng)
    g = dsl.to_graph(capsules.capsule_conv,
                     inputs={"P": dsl.f32(n="batch", x=9, y=9, ci=4, i=4, k=4),
                             "W": dsl.f32(kx=3, ky=3, ci=4, co=5, k=4, j=4)},
                     outputs="V", layouts={"V": "n x y co i j"})
    (op,) = g.ops   # the whole layer: one sum over (kx, ky, ci, k), nothing materialized
    assert isinstance(op, Comprehension) and op.reduce == "sum"
    assert set(op.rdims) == {"kx", "ky", "ci", "k"}
    assert set(op.type.dims) == {"n", "x", "y", "co", "i", "j"}
    assert_close(run_graph(g, {"P": P, "W": W})["V"], reference.capsule_conv(P, W))


def test_em_routing_matches_numpy(rng):
    n, size, ci, co = 2, 7, 4, 3
    P, W = capsule_inputs(rng, n, size, ci, co)
    A = rng.uniform(0.2, 1.0, (n, size, size, ci)).astype(np.float32)
    bv, ba = rand(rng, co, scale=0.1), rand(rng, co, scale=0.1)
    temp = 0.005  # keeps the activations off the sigmoid's flat ends, so they test something

    def routing(P, A, W, beta_v, beta_a):
        return capsules.em_routing(P, A, W, beta_v, beta_a, inverse_temperature=temp)

    g = dsl.to_graph(routing, inputs={"P": dsl.f32(n=n, x=size, y=size, ci=ci, i=4, k=4),
                                      "A": dsl.f32(n=n, x=size, y=size, ci=ci),
                                      "W": dsl.f32(kx=3, ky=3, ci=ci, co=co, k=4, j=4),
                                      "beta_v": dsl.f32(co=co), "beta_a": dsl.f32(co=co)},
                     layouts={"mu": "n x y co i j", "a": "n x y co"})
    got = run_graph(g, {"P": P, "A": A, "W": W, "beta_v": bv, "beta_a": ba})
    mu, a = reference.em_routing(P, A, W, bv, ba, inverse_temperature=temp)
    assert 0.05 < a.min() and a.max() < 0.95
    assert_close(got["mu"], mu)
    assert_close(got["a"], a)


def test_softmax_max_argmax_mean(rng):
    def f(a):
        j, = dsl.dims("j")
        e = dsl.exp(a - dsl.max[j](a))
        return {"soft": e / dsl.sum[j](e), "arg": dsl.argmax[j](a),
                "mean": dsl.mean(a, over=[j]), "low": dsl.min[j](a), "prod": dsl.prod[j](a)}

    g = dsl.to_graph(f, {"a": dsl.f32(i=3, j=6)})
    a = rand(rng, 3, 6)
    out = run_graph(g, {"a": a})
    e = np.exp(a - a.max(1, keepdims=True))
    assert_close(out["soft"], e / e.sum(1, keepdims=True))
    np.testing.assert_array_equal(out["arg"], a.argmax(1))
    assert_close(out["mean"], a.astype(np.float64).mean(1))
    assert_close(out["low"], a.min(1))
    assert_close(out["prod"], a.astype(np.float64).prod(1))


def test_argmax_over_two_dims_is_refused():
    def f(a):
        return dsl.argmax(a, over=["i", "j"])
    with pytest.raises(dsl.DimError, match="exactly one dim, not i, j"):
        dsl.to_graph(f, {"a": dsl.f32(i=3, j=6)})
