"""What the DSL tests share: seeded data, the float64 comparison, the example modules.

(A module of its own, not conftest.py: tests import it by name, and ``conftest`` is the name
of tests/conftest.py too.)
"""

from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
CAPSULES = os.path.join(ROOT, "examples", "capsules")
# fp32 results against a float64 NumPy reference, relative to the output's largest magnitude:
# sums of at most a few thousand O(1) products stay within some 1e-6 of it
RTOL = 1e-5


def rand(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def assert_close(got, want, rtol=RTOL):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    err = np.abs(got - want).max() / max(np.abs(want).max(), 1e-30)
    assert err <= rtol, f"max error {err:.3g} of the largest magnitude, allowed {rtol:g}"


def example(name: str):
    """examples/capsules/NAME.py as a module (imported once: model.py registers a torch op)."""
    key = f"mlpack_example_capsules_{name}"
    if key not in sys.modules:
        if CAPSULES not in sys.path:
            sys.path.insert(0, CAPSULES)   # build_and_run imports its neighbours by name
        spec = importlib.util.spec_from_file_location(key, os.path.join(CAPSULES, f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


def em_routing_graph(c: int = 16, n: int = 1, tiles: bool = True):
    """examples/capsules' EM routing (3 iterations) as an optimized graph, small: ``n`` images
    of a 9x9 grid of ``c`` capsule types in and out, 4x4 poses, a 3x3 kernel (the cpu target's
    tests of row blocks, of the arena and of point tiles use it). ``tiles=False``: the graph
    the ``recompute`` pass makes where no point tile can hold the votes (points.py), each
    vote recomputed in each reader."""
    from mlpack.codegen import dsl
    from mlpack.codegen.passes import points

    caps = example("capsules")
    held, points.POINT_BYTES = points.POINT_BYTES, points.POINT_BYTES if tiles else 0
    try:
        return dsl.to_graph(
            lambda P, A, W, beta_v, beta_a: caps.em_routing(P, A, W, beta_v, beta_a,
                                                            inverse_temperature=0.01),
            inputs={"P": dsl.f32(n=n, x=9, y=9, ci=c, i=4, k=4),
                    "A": dsl.f32(n=n, x=9, y=9, ci=c),
                    "W": dsl.f32(kx=3, ky=3, ci=c, k=4, j=4, co=c), "beta_v": dsl.f32(co=c),
                    "beta_a": dsl.f32(co=c)},
            name="em", layouts={"mu": "n x y i j co", "a": "n x y co"}, optimize=True)
    finally:
        points.POINT_BYTES = held
