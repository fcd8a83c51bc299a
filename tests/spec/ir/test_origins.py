"""Origins (spec/ir/origins.py): the ONNX node an out-of-range index names, on the interpreter
and through the portable program's optional "origins"."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from mlpack.codegen.compile import compile_onnx
from mlpack.spec.errors import IndexRangeError, InterpError
from mlpack.spec.ir import parse_graph, run_graph
from mlpack.spec.ir.origins import Origin, message
from mlpack.spec.ir.program import decode_program, dumps_program


def gather_nd():
    data = numpy_helper.from_array(np.arange(20, dtype=np.float32).reshape(10, 2), "data")
    g = helper.make_graph([helper.make_node("GatherND", ["data", "ids"], ["y"], name="pick")], "g",
                          [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])], [data])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_messages():
    assert message("t", "d", -3, 10, Origin("Gather node 'e'")) == \
        "Gather node 'e': index -13 out of range for dim of size 10 (valid -10..9)"
    assert message("t", "d", 10, 10, Origin("X node 'x'", wraps=False)) == \
        "X node 'x': index 10 out of range for dim of size 10 (valid 0..9)"
    assert message("t", "d", 10, 10) == "read of %t dim d: index 10 out of range for dim of size 10 (valid 0..9)"


def test_the_interpreter_names_the_node_and_the_callers_index():
    g = compile_onnx(gather_nd())
    assert list(g.origins.values()) == [Origin("GatherND node 'pick'", True)]
    np.testing.assert_array_equal(run_graph(g, {"ids": np.array([[-1], [0]])})["y"], [[18, 19], [0, 1]])
    with pytest.raises(IndexRangeError, match=r"GatherND node 'pick': index -11 out of range"):
        run_graph(g, {"ids": np.array([[0], [-11]])})
    assert issubclass(IndexRangeError, InterpError)


def test_the_portable_program_carries_origins():
    g = compile_onnx(gather_nd())
    back = decode_program(dumps_program(g), {c.name: c.data for c in g.constants.values()})
    assert back.origins == g.origins
    with pytest.raises(IndexRangeError, match=r"GatherND node 'pick': index 10 out of range"):
        run_graph(back, {"ids": np.array([[10], [0]])})


def test_a_read_without_origin_names_tensor_and_dim():
    g = parse_graph("""
graph "g" {
  in %t: f32{n=4} (n)
  in %i: i64{k=2} (k)
  %y: f32{k=2} = %t[n=%i[k=k]]
  out %y (k)
}
""")
    with pytest.raises(IndexRangeError, match=r"read of %t dim n: index 7 out of range for dim of size 4"):
        run_graph(g, {"t": np.zeros(4, np.float32), "i": np.array([0, 7])})
