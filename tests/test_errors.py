"""User-facing failures of the ONNX frontend: each is an ``mlpack.Error`` that names its cause."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import mlpack


def _import(model):
    return mlpack.compile_onnx(model)


def test_error_hierarchy_is_reachable_from_the_facade():
    assert issubclass(mlpack.UnsupportedOpError, mlpack.Error)
    assert issubclass(mlpack.ModelError, mlpack.Error)
    assert mlpack.import_onnx.__name__ == "import_model"


def test_custom_domain_op_is_unsupported(onnx_model):
    node = helper.make_node("Frobnicate", ["x"], ["y"], name="frob_1", domain="com.example")
    model = onnx_model([node], [("x", TensorProto.FLOAT, [2])], [("y", TensorProto.FLOAT, [2])],
                       opsets=[("", 17), ("com.example", 3)])
    with pytest.raises(mlpack.UnsupportedOpError) as info:
        _import(model)
    msg = str(info.value)
    for part in ("Frobnicate", "com.example", "opset 3", "frob_1"):
        assert part in msg, msg
    assert info.value.op_type == "Frobnicate" and info.value.opset == 3


def test_onnx_ml_op_without_importer_is_unsupported(onnx_model):
    node = helper.make_node("TreeEnsembleRegressor", ["x"], ["y"], name="trees", domain="ai.onnx.ml",
                            n_targets=1, nodes_treeids=[0], nodes_nodeids=[0], nodes_featureids=[0],
                            nodes_modes=["LEAF"], nodes_values=[0.0], nodes_truenodeids=[0],
                            nodes_falsenodeids=[0], target_treeids=[0], target_nodeids=[0],
                            target_ids=[0], target_weights=[1.0])
    model = onnx_model([node], [("x", TensorProto.FLOAT, ["n", 3])], [("y", TensorProto.FLOAT, ["n", 1])],
                       opsets=[("", 17), ("ai.onnx.ml", 3)])
    with pytest.raises(mlpack.UnsupportedOpError) as info:
        _import(model)
    msg = str(info.value)
    for part in ("TreeEnsembleRegressor", "ai.onnx.ml", "opset 3", "trees"):
        assert part in msg, msg


def test_string_tensors_are_unsupported_and_named(onnx_model):
    node = helper.make_node("StringNormalizer", ["words"], ["y"], name="norm", case_change_action="LOWER")
    model = onnx_model([node], [("words", TensorProto.STRING, [3])], [("y", TensorProto.STRING, [3])])
    with pytest.raises(mlpack.UnsupportedOpError) as info:
        _import(model)
    assert "words" in str(info.value) and "STRING" in str(info.value)


def _save_real_model(path, onnx_model):
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32), "w")
    nodes = [helper.make_node("Add", ["x", "w"], ["t"], name="add"),
             helper.make_node("Relu", ["t"], ["y"], name="relu")]
    model = onnx_model(nodes, [("x", TensorProto.FLOAT, [16, 16])], [("y", TensorProto.FLOAT, [16, 16])],
                       [w])
    onnx.save(model, str(path))
    return path.read_bytes()


def test_truncated_file_is_a_model_error_naming_the_file(tmp_path, onnx_model):
    path = tmp_path / "cut.onnx"
    data = _save_real_model(path, onnx_model)
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(mlpack.ModelError) as info:
        _import(str(path))
    assert str(path) in str(info.value)


@pytest.mark.parametrize("keep", [0.0, 0.1, 0.5, 0.9, 0.97, 0.99, 0.999])
def test_every_truncation_is_a_model_error(tmp_path, onnx_model, keep):
    path = tmp_path / "cut.onnx"
    data = _save_real_model(path, onnx_model)
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(mlpack.ModelError) as info:
        _import(str(path))
    assert str(path) in str(info.value)


def test_every_cut_point_of_a_small_model_is_a_model_error(tmp_path, tiny_model_path):
    data = tiny_model_path.read_bytes()
    path = tmp_path / "cut.onnx"
    for n in range(len(data)):
        path.write_bytes(data[:n])
        with pytest.raises(mlpack.ModelError, match="cut.onnx"):
            _import(str(path))


def test_random_bytes_are_a_model_error(tmp_path):
    path = tmp_path / "noise.onnx"
    path.write_bytes(np.random.default_rng(1).bytes(4096))
    with pytest.raises(mlpack.ModelError) as info:
        _import(str(path))
    assert str(path) in str(info.value)


def test_missing_file_is_a_model_error(tmp_path):
    with pytest.raises(mlpack.ModelError, match="no such file"):
        _import(str(tmp_path / "absent.onnx"))


def test_read_of_undefined_value_is_a_model_error(onnx_model):
    node = helper.make_node("Add", ["x", "ghost"], ["y"], name="add_ghost")
    model = onnx_model([node], [("x", TensorProto.FLOAT, [2])], [("y", TensorProto.FLOAT, [2])])
    with pytest.raises(mlpack.ModelError) as info:
        _import(model)
    assert "ghost" in str(info.value) and "add_ghost" in str(info.value)


def test_output_nobody_produces_is_a_model_error(onnx_model):
    node = helper.make_node("Relu", ["x"], ["y"], name="relu")
    model = onnx_model([node], [("x", TensorProto.FLOAT, [2])], [("z", TensorProto.FLOAT, [2])])
    with pytest.raises(mlpack.ModelError, match="'z'"):
        _import(model)
