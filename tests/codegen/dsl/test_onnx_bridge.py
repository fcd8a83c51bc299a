"""registry.py and onnx_bridge.py: a node of a user's domain imports through the DSL function
registered for it, with its dims named by the registered axis order."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import mlpack
from mlpack.codegen import dsl
from mlpack.codegen.dsl.registry import unregister, used_by
from mlpack.spec.errors import Error
from mlpack.spec.ir.interp import run_graph
from dsl_support import assert_close, rand

DOMAIN = "test.dsl"


@pytest.fixture
def scaled_matmul():
    """Y[m, n] = scale * sum_k A[m, k] B[k, n], registered as test.dsl ScaledMatMul."""
    def fn(A, B, scale=1.0):
        k, = dsl.dims("k")
        return dsl.sum[k](A * B) * scale
    dsl.register(DOMAIN, "ScaledMatMul", fn, inputs={"A": "m k", "B": "k n"},
                 outputs={"Y": "m n"})
    yield fn
    unregister(DOMAIN, "ScaledMatMul")


def model(a_shape, b_shape, y_rank, transpose_a=False, scale=None):
    nodes, a_in = [], "A"
    if transpose_a:   # a view before the custom node folds into its reads
        nodes.append(helper.make_node("Transpose", ["A"], ["At"], perm=[1, 0]))
        a_in = "At"
    attrs = {} if scale is None else {"scale": scale}
    nodes.append(helper.make_node("ScaledMatMul", [a_in, "B"], ["Y"], domain=DOMAIN, **attrs))
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("A", TensorProto.FLOAT, a_shape)],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None] * y_rank)],
                          [numpy_helper.from_array(
                              np.random.default_rng(1).standard_normal(b_shape).astype(np.float32), "B")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                               helper.make_opsetid(DOMAIN, 1)])


def test_custom_node_imports_through_the_dsl(scaled_matmul, rng):
    m = model(["rows", 4], [4, 3], 2, scale=0.5)
    g = mlpack.compile_onnx(m)
    a = rand(rng, 5, 4)
    b = numpy_helper.to_array(m.graph.initializer[0])
    assert_close(run_graph(g, {"A": a})["Y"], 0.5 * a.astype(np.float64) @ b)
    assert [c.op_type for c in used_by(m)] == ["ScaledMatMul"]


def test_a_view_before_the_node_is_folded(scaled_matmul, rng):
    g = mlpack.compile_onnx(model([4, 5], [4, 3], 2, transpose_a=True))
    assert len(g.ops) == 1   # the transpose is in the read, not a copy
    a = rand(rng, 4, 5)
    b = numpy_helper.to_array(model([4, 5], [4, 3], 2).graph.initializer[0])
    assert_close(run_graph(g, {"A": a})["Y"], a.T.astype(np.float64) @ b)


def test_leading_axes_are_lifted(scaled_matmul, rng):
    g = mlpack.compile_onnx(model([2, 3, 5, 4], [4, 3], 4))
    a = rand(rng, 2, 3, 5, 4)
    b = numpy_helper.to_array(model([5, 4], [4, 3], 2).graph.initializer[0])
    assert_close(run_graph(g, {"A": a})["Y"], np.einsum("pqmk,kn->pqmn", a.astype(np.float64), b))


def test_errors_name_the_node_and_the_dim(scaled_matmul):
    with pytest.raises(dsl.DimError, match="ScaledMatMul node .*: input A has 1 axes; its "
                                           "dims m k need 2"):
        mlpack.compile_onnx(model([4], [4, 3], 1))
    with pytest.raises(dsl.DimError, match="dim k does not match: input A's k .* has size 5, "
                                           "input B's k .* has 4"):
        mlpack.compile_onnx(model([3, 5], [4, 3], 2))
    with pytest.raises(Error, match="domain 'test.dsl' is not supported"):
        unregister(DOMAIN, "ScaledMatMul")
        mlpack.compile_onnx(model([3, 4], [4, 3], 2))


def test_registration_is_checked():
    with pytest.raises(dsl.DslError, match="Bad: input X is not a parameter of <lambda>"):
        dsl.register(DOMAIN, "Bad", lambda A: A, inputs={"X": "i"}, outputs={"Y": "i"})
    with pytest.raises(dsl.DimError, match="input A names dim i twice"):
        dsl.register(DOMAIN, "Bad", lambda A: A, inputs={"A": "i i"}, outputs={"Y": "i"})
