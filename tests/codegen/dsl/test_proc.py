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


# ---------------------------------------------------------------- lifted, and on the cpu target


@dsl.op(x="n")
def running_sum(x):
    return cumsum(x)


def test_a_procedure_is_lifted_over_the_dims_it_is_not_about(rng):
    """Applied to {b, t, n}, the scan runs once per (b, t): its statements inside loops over
    them, its output {b, t, n}, its local started afresh for each."""
    def video(x):
        return running_sum(x)
    g = dsl.to_graph(video, {"x": dsl.f32(b=2, t=3, n=5)})
    (op,) = g.ops
    assert list(op.results["out"].dims) == ["b", "t", "n"]
    x = rand(rng, 2, 3, 5)
    assert_close(run_graph(g, {"x": x})["out"], np.cumsum(x.astype(np.float64), axis=2))


def test_a_lifted_data_dependent_size_is_refused():
    @dsl.op(x="n")
    def lifted_positives(x):
        return positives(x)
    with pytest.raises(dsl.DslError, match="size count: a data-dependent size cannot be lifted "
                                           "over b"):
        dsl.to_graph(lambda x: lifted_positives(x), {"x": dsl.f32(b=2, n=4)})


def test_custom_op_procedures_build_and_run_on_the_cpu_target(tmp_path, rng):
    """Two custom ONNX ops written as procedures, a scan lifted over the node's batch axis and
    a data-dependent size, built for the portable and this host's baseline cpu target,
    validated there and run natively."""
    import warnings

    import onnx
    from onnx import TensorProto, helper

    import mlpack
    from mlpack.packager.build import build
    from test_targets import baseline_target

    dsl.register("test.procs", "RunningSum", cumsum, inputs={"x": "n"}, outputs={"y": "n"})
    dsl.register("test.procs", "Positives", positives, inputs={"x": "n"}, outputs={"y": "k"})
    nodes = [helper.make_node("RunningSum", ["x"], ["y"], domain="test.procs"),
             helper.make_node("Positives", ["v"], ["idx"], domain="test.procs")]
    graph = helper.make_graph(
        nodes, "procs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 16]),
                         helper.make_tensor_value_info("v", TensorProto.FLOAT, [12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 16]),
         helper.make_tensor_value_info("idx", TensorProto.INT64, ["k"])])
    path = tmp_path / "procs.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                      helper.make_opsetid("test.procs", 1)]),
              path)
    host = baseline_target()
    out = tmp_path / "procs.mlpack"
    report = build(path, out, targets=["portable", host], dims={"b": 3}, cache=False)
    assert [(a.target, a.validated) for a in report.artifacts] == [("portable", True),
                                                                   (host, True)]
    x, v = rand(rng, 5, 16), rand(rng, 12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # unsigned
        with mlpack.load(out, device="cpu") as m:
            got = m(x=x, v=v)
    assert_close(got["y"], np.cumsum(x.astype(np.float64), axis=1))
    np.testing.assert_array_equal(got["idx"], np.flatnonzero(v > 0))
