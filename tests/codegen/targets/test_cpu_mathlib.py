"""Accuracy of the cpu target's exp/log/tanh/sigmoid/erf against float64 references.

Each function runs through a real kernel (a one-op graph compiled for each x86-64 level the
host runs) over a dense grid plus special values; the bounds are the ones mathlib.py's
docstring states.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from mlpack.codegen.targets.cpu import compile_cpu
from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.graph import Comprehension, Graph, Port, TensorType
from plan_runner import HOST_TARGETS, NARROW_AND_WIDE, run_plan


def unary_graph(op: str, n: int) -> Graph:
    g = Graph("math")
    g.add_input("x", TensorType("f32", {"i": n}), ("i",))
    body = ex.unary(op, ex.read("x", {"i": ex.var("i")}, "f32"))
    g.add_op(Comprehension("y", TensorType("f32", {"i": n}), body))
    g.outputs.append(Port("y", ("i",)))
    return g


def run_unary(op: str, x: np.ndarray, target: str) -> np.ndarray:
    g = unary_graph(op, x.size)
    return run_plan(compile_cpu(g, target), g, {"x": x.astype(np.float32)})["y"]


def _erf(x):
    return np.vectorize(math.erf)(x.astype(np.float64))


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x.astype(np.float64)))


# (reference, grid, max abs error, max relative error) per mathlib.py's table
CASES = {
    "exp": (np.exp, np.linspace(-87, 88, 200001), None, 1.5e-7),
    "log": (np.log, np.concatenate([np.geomspace(1e-38, 3e38, 100001),
                                    np.linspace(0.5, 2.0, 100001)]), 1.5e-8, 1.5e-7),
    "tanh": (np.tanh, np.linspace(-12, 12, 200001), 1.5e-7, 2e-7),
    "sigmoid": (_sigmoid, np.linspace(-80, 30, 200001), 1.5e-7, 2e-7),
    "erf": (_erf, np.linspace(-6, 6, 200001), 5e-7, 5e-7),
}


@pytest.mark.parametrize("target", HOST_TARGETS)
@pytest.mark.parametrize("name", list(CASES))
def test_accuracy(name, target):
    ref_fn, grid, abs_bound, rel_bound = CASES[name]
    x = grid.astype(np.float32)
    got = run_unary(name, x, target).astype(np.float64)
    ref = ref_fn(x.astype(np.float64))
    err = np.abs(got - ref)
    if rel_bound is not None:
        # relative where the value is not tiny (log near 1 is bounded absolutely)
        big = np.abs(ref) >= (0.05 if name == "log" else 1e-30)
        if name == "erf":
            big = np.abs(ref) >= 1e-30
        assert (err[big] / np.abs(ref[big])).max() <= rel_bound, name
    if abs_bound is not None:
        small = np.abs(ref) < (0.05 if name == "log" else np.inf)
        assert err[small].max() <= abs_bound, name


@pytest.mark.parametrize("target", NARROW_AND_WIDE)
@pytest.mark.parametrize("name", ["exp", "sigmoid"])
def test_no_denormal_comes_out(name, target):
    """Where e^x (or sigmoid(x)) is below the smallest normal f32, the result is 0 (a denormal
    costs Intel cores a microcode assist wherever it is produced or read); just above, it is
    the value, a normal one. Sigmoid's far side (x > 87, where e^-x is that small) is 1."""
    tiny = np.finfo(np.float32).tiny
    x = np.linspace(-120.0, -80.0, 40001).astype(np.float32)
    if name == "sigmoid":
        x = np.concatenate([x, -x])
    got = run_unary(name, x, target)
    ref = (np.exp if name == "exp" else _sigmoid)(x.astype(np.float64))
    assert not ((got != 0) & (np.abs(got) < tiny)).any()   # no denormal at all
    assert (got[ref < tiny * 0.9999] == 0).all()
    normal = ref >= tiny * 1.0001
    assert (np.abs(got[normal] - ref[normal]) / ref[normal]).max() < 1.5e-7


@pytest.mark.parametrize("target", NARROW_AND_WIDE)
def test_erf_of_a_quotient_multiplies(target, monkeypatch):
    """GELU's erf(x / sqrt(2)): the quotient by a constant is a product by its reciprocal (one
    division left in the kernel, erf's own), within erf's bound of the float64 value."""
    from mlpack.codegen.targets.cpu import compile as cpu_compile
    from mlpack.codegen.targets.cpu import module

    n, c = 20001, np.float32(1.4142135)
    g = Graph("gelu_erf")
    g.add_input("x", TensorType("f32", {"i": n}), ("i",))
    q = ex.binary("div", ex.read("x", {"i": ex.var("i")}, "f32"), ex.const(float(c), "f32"))
    g.add_op(Comprehension("y", TensorType("f32", {"i": n}), ex.unary("erf", q)))
    g.outputs.append(Port("y", ("i",)))
    texts = []
    build = module.build_module
    monkeypatch.setattr(cpu_compile, "build_module",
                        lambda *a, **k: texts.extend(build(*a, **{**k, "parts": 1})) or texts)
    x = np.linspace(-8, 8, n).astype(np.float32)
    got = run_plan(compile_cpu(g, target), g, {"x": x})["y"].astype(np.float64)
    ref = _erf(x.astype(np.float64) / np.float64(c))
    assert np.abs(got - ref).max() <= 5e-7
    assert len(re.findall(r"= fdiv ", texts[0])) == 1, "one division: erf's p / q"


def test_small_arguments_keep_relative_accuracy():
    x = np.geomspace(1e-30, 0.5, 2001).astype(np.float32)
    for name, fn in (("tanh", np.tanh), ("erf", _erf)):
        got = run_unary(name, x, "x86_64-v3").astype(np.float64)
        ref = fn(x.astype(np.float64))
        assert (np.abs(got - ref) / ref).max() < 4e-7, name


@pytest.mark.parametrize("target", NARROW_AND_WIDE)
def test_special_values(target):
    """nan, infinities, signed zeros and the ends of exp's range, with and without FMA (sigmoid
    and tanh round n with an added constant, which a fused multiply-add rounds once)."""
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 89.0, -110.0, -1.0, 1e-45, 88.0, -88.0,
                  88.7, -88.7, 89.5, -89.5, 44.0, -44.0], np.float32)
    with np.errstate(all="ignore"):
        for name, fn in (("exp", np.exp), ("log", np.log), ("tanh", np.tanh), ("erf", _erf),
                         ("sigmoid", _sigmoid)):
            got = run_unary(name, x, target)
            ref = fn(x.astype(np.float64)).astype(np.float32)
            # (exp and sigmoid are 0 where their value would be a denormal, as documented)
            atol = np.finfo(np.float32).tiny if name in ("exp", "sigmoid") else 1e-40
            np.testing.assert_allclose(got, ref, rtol=3e-7, atol=atol, equal_nan=True, err_msg=name)
