"""proc.py: sequential procedures (a scan, a data-dependent size), run on the interpreter and
printed and parsed back through the IR's text form."""

from __future__ import annotations

import numpy as np
import pytest

from mlpack.codegen import dsl
from mlpack.spec.ir.graph import Procedure
from mlpack.spec.ir.interp import run_graph
from mlpack.spec.ir.parser import parse_graph
from dsl_support import assert_close, rand


def cumsum(x):
    with dsl.procedure() as p:
        out = p.output(x.dtype, n=x.size("n"))
        acc = p.local("acc", 0.0)
        with p.loop("n"):
            p.assign(acc, acc + x)       # x read at the loop variable n: its own dim
            p.store(out, acc)
    return out


def positives(x):
    """The indices of x's positive elements: a size the data decides."""
    with dsl.procedure() as p:
        count = p.size("count", bound=x.size("n"))
        idx = p.output("i64", k=count)
        c = p.local("c", 0, dtype="i64")
        with p.loop(x.dim("n")) as n:
            with p.if_(x > 0.0):
                p.store(idx, n, k=c)
                p.assign(c, c + 1)
        p.set_size("count", c)
    return idx


def test_scan(rng):
    g = dsl.to_graph(cumsum, {"x": dsl.f32(n="len")})
    (op,) = g.ops
    assert isinstance(op, Procedure)
    assert parse_graph(str(g)) == g
    x = rand(rng, 9)
    assert_close(run_graph(g, {"x": x})["out"], np.cumsum(x.astype(np.float64)))


def test_data_dependent_size(rng):
    g = dsl.to_graph(positives, {"x": dsl.f32(n=12)})
    assert parse_graph(str(g)) == g
    x = rand(rng, 12)
    np.testing.assert_array_equal(run_graph(g, {"x": x})["out"], np.flatnonzero(x > 0))


def test_a_dim_outside_the_loops_is_named():
    def bad(x):
        with dsl.procedure() as p:
            out = p.output(x.dtype, n=x.size("n"))
            p.store(out, x)             # no loop over n
        return out
    with pytest.raises(dsl.DimError, match="store to .*: dim n is not a loop variable here"):
        dsl.to_graph(bad, {"x": dsl.f32(n=4)})
