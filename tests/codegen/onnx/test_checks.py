"""Declared names and shapes checked at load (codegen/onnx/checks.py): bad dims and names defined
twice are ModelErrors naming the file, the input or initializer and the dim, before anything is
allocated; what ONNX allows (an initializer that is also an input) still imports."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from mlpack.codegen.errors import ModelError
from mlpack.codegen.onnx.checks import MAX_TENSOR_BYTES, check_model
from mlpack.codegen.onnx.importer import import_model, load_model

F = TensorProto.FLOAT


def _model(inputs, inits=(), nodes=None, ir_version=9):
    nodes = nodes if nodes is not None else [helper.make_node("Relu", ["x"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "t", [helper.make_tensor_value_info(*i) for i in inputs],
                              [helper.make_tensor_value_info("y", F, None)], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=ir_version)


def _header(name, dims, data_type=F):
    """An initializer with declared dims and no data (the checks must not read data)."""
    t = TensorProto(name=name, data_type=data_type)
    t.dims.extend(dims)
    return t


def _bias(name="b", value=1.0, n=4):
    return numpy_helper.from_array(np.full(n, value, np.float32), name)


ADD = [helper.make_node("Add", ["x", "b"], ["y"], name="add")]


def _error(model, *parts, where="m.onnx"):
    with pytest.raises(ModelError) as e:
        check_model(model, where)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{where}: ")
    for p in parts:
        assert p in msg, msg
    return msg


def test_negative_input_dim_names_input_and_dim():
    _error(_model([("x", F, [1, -5])]), "input 'x' dim 1 is -5")


def test_too_large_input_names_dim_and_limit():
    msg = _error(_model([("x", F, [1, 2 ** 40])]), "input 'x' dim 1 is 1099511627776", "4 GiB")
    assert "4 TiB" in msg


def test_size_counts_symbols_at_one_and_the_element_width():
    per_f32 = MAX_TENSOR_BYTES // 4
    check_model(_model([("x", F, ["batch", per_f32])]), "m.onnx")  # exactly at the limit
    _error(_model([("x", F, ["batch", per_f32 + 1])]), "input 'x' dim 1")
    check_model(_model([("x", TensorProto.UINT8, [2, per_f32])]), "m.onnx")  # 1 byte each
    _error(_model([("x", TensorProto.DOUBLE, [2, per_f32])]), "input 'x' dim 1")


def test_zero_and_symbolic_dims_are_fine():
    check_model(_model([("x", F, [0, "n", None, 3])]), "m.onnx")


def test_zero_dims_do_not_hide_huge_strides():
    _error(_model([("x", F, [0, 2 ** 40])]), "dim 1 is 1099511627776")


def test_negative_initializer_dim():
    _error(_model([("x", F, [1, 4])], [_header("w", [-2, 2])]), "initializer 'w' dim 0 is -2")


def test_too_large_initializer_is_refused_before_its_data_is_read():
    _error(_model([("x", F, [1, 4])], [_header("w", [2 ** 20, 2 ** 20])]),
           "initializer 'w' dim 0 is 1048576", "4 TiB")


def test_duplicate_initializer():
    # ONNX Runtime keeps the last one with a warning; a silently different constant is worse
    _error(_model([("x", F, [1, 4])], [_bias(), _bias(value=2.0)], ADD),
           "initializer 'b' is defined twice")


def test_duplicate_input():
    _error(_model([("x", F, [1, 4]), ("x", F, [1, 4])]), "input 'x' is listed twice")


@pytest.mark.parametrize("nodes, fragment", [
    ([helper.make_node("Relu", ["x"], ["x"], name="r")],
     "Relu node 'r' defines 'x', which input 'x'"),
    ([helper.make_node("Relu", ["x"], ["b"]), helper.make_node("Relu", ["b"], ["y"])],
     "an unnamed Relu node defines 'b', which initializer 'b'"),
    ([helper.make_node("Relu", ["x"], ["y"], name="r1"),
      helper.make_node("Relu", ["x"], ["y"], name="r2")],
     "Relu node 'r2' defines 'y', which Relu node 'r1' already defines"),
])
def test_a_name_defined_twice_by_a_node(nodes, fragment):
    _error(_model([("x", F, [1, 4])], [_bias()], nodes), fragment)


def test_input_with_initializer_is_legal_and_imports_its_default():
    # legal ONNX (IR >= 4): the initializer is the input's default; ONNX Runtime lets a caller
    # override it, mlpack imports the default as a constant
    model = _model([("x", F, ["n", 4]), ("b", F, [4])], [_bias(value=3.0)], ADD)
    check_model(model, "m.onnx")
    graph = import_model(model)
    assert [p.name for p in graph.inputs] == ["x"]
    assert "b" in graph.constants


@pytest.mark.parametrize("declared, fragment", [
    (("b", F, [5]), "input 'b' declares shape [5] but its initializer has shape [4]"),
    (("b", F, [2, 2]), "declares shape [2, 2]"),
    (("b", TensorProto.DOUBLE, [4]),
     "input 'b' is declared DOUBLE but its initializer holds FLOAT"),
])
def test_input_disagreeing_with_its_initializer(declared, fragment):
    _error(_model([("x", F, [1, 4]), declared], [_bias()], ADD), fragment)


def test_subgraph_initializers_are_checked():
    def branch(name, inits):
        out = helper.make_tensor_value_info(f"{name}_y", F, None)
        node = helper.make_node("Identity", ["x"], [f"{name}_y"])
        return helper.make_graph([node], name, [], [out], inits)

    if_node = helper.make_node("If", ["c"], ["y"], name="if",
                               then_branch=branch("then", [_header("w", [-1])]),
                               else_branch=branch("else", []))
    model = _model([("x", F, [1, 4]), ("c", TensorProto.BOOL, [])], nodes=[if_node])
    _error(model, "initializer 'w' of subgraph 'then' (If node 'if') dim 0 is -1")


def test_every_loader_runs_the_checks(tmp_path):
    model = _model([("x", F, [1, -5])])
    path = tmp_path / "neg.onnx"
    onnx.save(model, str(path))
    for source, where in ((str(path), str(path)), (path, str(path)),
                          (model.SerializeToString(), "the model bytes"), (model, "the model")):
        with pytest.raises(ModelError, match=f"^{re.escape(where)}: input 'x' dim 1 is -5"):
            load_model(source)
    with pytest.raises(ModelError, match="input 'x' dim 1 is -5"):
        import_model(path)


def test_backend_and_reference_run_the_checks():
    from mlpack import backend
    from mlpack.packager.reference import run_reference

    model = _model([("x", F, [1, 2 ** 40])])
    with pytest.raises(ModelError, match="input 'x' dim 1"):
        backend.prepare(model)
    with pytest.raises(ModelError, match="input 'x' dim 1"):
        run_reference(model, {"x": np.zeros((1, 4), np.float32)})
