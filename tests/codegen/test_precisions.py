"""The precisions (codegen/precisions/): every name of the spec's vocabulary is a module or
planned, fp32 the identity with a tolerance, the planned ones refused by name; every target's
precisions known. fp16 and bf16 store the contraction weights in 16 bits (weights16.py) and
nothing else: biases, scales and small constants stay f32, the expressions keep their dtypes,
and the interpreter's result moves by the weights' rounding only."""

from __future__ import annotations

import numpy as np
import pytest

from mlpack.codegen import precisions
from mlpack.codegen.errors import UnsupportedTargetError
from mlpack.codegen.targets import registry
from mlpack.spec import media
from support import parse_ir

GRAPH = """graph "g" {
  in %x: f32{n=4} (n)
  %y: f32{n=4} = %x[n=n] * 2.0
  out %y (n)
}"""


def test_every_precision_of_the_spec_is_a_module_or_planned():
    assert precisions.names() == media.PRECISIONS
    assert set(precisions.MODULES) <= set(media.PRECISIONS)
    for name in precisions.names():
        module = precisions.get(name)
        assert module.NAME == name and module.SUMMARY
        assert module.IMPLEMENTED == (name in precisions.MODULES)
    assert precisions.implemented() == ("fp32", "fp16", "bf16")
    assert precisions.defaults() == ("fp32",)
    for name in precisions.implemented():
        assert precisions.tolerance(name).multiple > 0
    for t in registry.TARGETS.values():
        assert set(t.precisions) <= set(precisions.names()), t.name


def test_fp32_is_the_identity_and_planned_ones_are_refused_by_name():
    g = parse_ir(GRAPH)
    assert precisions.apply("fp32", g) is g
    with pytest.raises(UnsupportedTargetError, match=r"precision int8 is not implemented yet \(planned\)"):
        precisions.apply("int8", g)
    with pytest.raises(UnsupportedTargetError, match=r"unknown precision 'fp64'"):
        precisions.get("fp64")


def _dense_model(scale: float = 1.0):
    """x @ W + b, then LayerNormalization with its own scale and bias: one contraction weight
    (W, 64 x 32) among constants that must stay f32."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((64, 32)) * scale).astype(np.float32)
    inits = [numpy_helper.from_array(w, "W"),
             numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "b"),
             numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "gamma"),
             numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "beta")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]),
             helper.make_node("Add", ["h", "b"], ["z"]),
             helper.make_node("LayerNormalization", ["z", "gamma", "beta"], ["y"], axis=-1)]
    graph = helper.make_graph(nodes, "dense", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 32])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), w


@pytest.mark.parametrize("name, dtype, bound", [("bf16", "bf16", 2 ** -7), ("fp16", "f16", 2 ** -10)])
def test_16_bit_precisions_store_the_contraction_weights_narrow(name, dtype, bound):
    import mlpack
    from mlpack.spec.ir.graph import Comprehension
    from mlpack.spec.ir.interp import run_graph

    model, w = _dense_model()
    g = mlpack.compile_onnx(model)
    narrow = precisions.apply(name, g)
    changed = {n for n, c in narrow.constants.items() if c.type.dtype != g.constants[n].type.dtype}
    assert len(changed) == 1, changed                   # W, and not b, gamma, beta or epsilon
    (wname,) = changed
    c = narrow.constants[wname]
    assert c.type.dtype == dtype and c.data.nbytes * 2 == g.constants[wname].data.nbytes
    # every read of W widens to f32: the ops' dtypes are unchanged
    assert [op.type for op in narrow.ops if isinstance(op, Comprehension)] == \
           [op.type for op in g.ops if isinstance(op, Comprehension)]
    # the values are W's, rounded to nearest (the constant may be laid out in another order)
    from mlpack.spec.ir import dtypes
    rounded = w.astype(dtypes.to_numpy(dtype)).astype(np.float32)
    np.testing.assert_array_equal(np.sort(c.data.astype(np.float32).ravel()), np.sort(rounded.ravel()))
    assert np.abs(rounded - w).max() <= bound / 2 * np.abs(w).max()
    x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    want, got = run_graph(g, {"x": x})["y"], run_graph(narrow, {"x": x})["y"]
    err = np.abs(got - want).max() / np.abs(want).max()
    assert 0 < err < 8 * bound, err                     # moved, by the weights' rounding only


def test_fp16_keeps_weights_beyond_its_range_in_f32():
    import mlpack

    model, _ = _dense_model(scale=1e5)                 # some |w| > 65504
    g = mlpack.compile_onnx(model)
    assert precisions.apply("fp16", g) is g
    assert precisions.apply("bf16", g) is not g        # bf16 has f32's range


def test_precision_lists_expand():
    assert precisions.expand(["fp32,bf16", "bf16"]) == ["fp32", "bf16"]
    assert precisions.expand(["all"]) == list(precisions.implemented())
    assert precisions.expand([]) == []
