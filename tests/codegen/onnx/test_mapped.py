"""codegen/onnx/mapped.py: a model file's weights as views of its mapping, its message parsed
without them; whatever the walk cannot prove stays in the message, and bad bytes fall back to
the parser's own error."""

from __future__ import annotations

import mmap
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from mlpack.codegen.errors import ModelError
from mlpack.codegen.onnx import mapped
from mlpack.codegen.onnx.importer import import_model, load_file_bytes

MODELS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "models")
MLP = os.path.join(MODELS, "mlp.onnx")


def _mapping(path):
    with open(path, "rb") as f:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def test_the_light_message_is_the_model_less_its_raw_weights_and_the_views_are_them():
    data = _mapping(MLP)
    split = mapped.split_weights(data)
    whole = onnx.load(MLP)
    views = split.views(data)
    assert sorted(views) == sorted(t.name for t in whole.graph.initializer)
    for t in whole.graph.initializer:
        want = numpy_helper.to_array(t)
        assert views[t.name].dtype == want.dtype and np.array_equal(views[t.name], want)
        assert not views[t.name].flags.writeable and not views[t.name].flags.owndata
        t.ClearField("raw_data")
    assert onnx.load_model_from_string(split.light) == whole
    assert len(split.light) < os.path.getsize(MLP) / 10


def test_a_mapped_model_imports_as_the_whole_message_does():
    model, external = load_file_bytes(MLP, _mapping(MLP))
    assert isinstance(model, mapped.MappedModel) and not external
    got, want = import_model(model), import_model(onnx.load(MLP))
    assert sorted(got.constants) == sorted(want.constants)
    for name, c in want.constants.items():
        np.testing.assert_array_equal(got.constants[name].data, c.data)
        assert got.constants[name].data.base is not None   # a view of the mapping, no copy
    assert [op.out for op in got.ops if hasattr(op, "out")] == \
        [op.out for op in want.ops if hasattr(op, "out")]


def _model(initializers, tmp_path, name="m.onnx"):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    node = helper.make_node("Add", ["x", initializers[0].name], ["y"])
    g = helper.make_graph([node], "g", [x], [y], initializer=initializers)
    path = tmp_path / name
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)


def test_only_what_the_walk_can_prove_is_split_off(tmp_path):
    raw = numpy_helper.from_array(np.array([1.5, -2.0], np.float32), "w")
    typed = helper.make_tensor("t", TensorProto.FLOAT, [2], [3.0, 4.0])           # float_data
    bf16 = helper.make_tensor("b", TensorProto.BFLOAT16, [2], b"\x80\x3f\x00\x40", raw=True)
    short = numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "s")
    short.dims[:] = [3]   # raw_data shorter than its dims: the importer's error, not a view
    path = _model([raw, typed, bf16, short], tmp_path)
    split = mapped.split_weights(_mapping(path))
    assert set(split.places) == {"w"}
    light = onnx.load_model_from_string(split.light)
    kept = {t.name: t for t in light.graph.initializer}
    assert list(kept["t"].float_data) == [3.0, 4.0] and kept["b"].raw_data and kept["s"].raw_data
    twice = _model([raw, numpy_helper.from_array(np.zeros(2, np.float32), "w")], tmp_path, "2.onnx")
    assert mapped.split_weights(_mapping(twice)) is None   # parsed whole: its checks name it


def test_bad_bytes_never_break_the_walk_and_keep_the_parsers_error(tmp_path):
    data = bytes(_mapping(MLP))
    rng = np.random.default_rng(0)
    for i in range(400):
        bad = bytearray(data[:rng.integers(1, len(data))] if i % 2 else data)
        for at in rng.integers(0, len(bad), 1 + i % 5):
            bad[at] = int(rng.integers(0, 256))
        split = mapped.split_weights(bytes(bad))   # a Split or None, never an exception
        if split is not None:
            split.views(bytes(bad))
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelError, match="cut.onnx: not a readable ONNX model|cut.onnx"):
        load_file_bytes(str(cut), _mapping(str(cut)))


def test_a_model_with_external_data_is_parsed_whole(tmp_path):
    m = onnx.load(MLP)
    path = tmp_path / "ext.onnx"
    onnx.save(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location="w.bin", size_threshold=0)
    model, external = load_file_bytes(str(path), _mapping(str(path)))
    assert external and isinstance(model, onnx.ModelProto)
    assert all(t.raw_data for t in model.graph.initializer)
