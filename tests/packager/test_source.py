"""packager/source.py: a model file read and hashed once, parsed only when the kernel cache does
not hold its compiled graph; a model with external data keyed by its tensors' bytes too."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

from mlpack.codegen.onnx import importer
from mlpack.packager import build as build_mod
from mlpack.packager.build import build
from mlpack.packager.source import ModelSource, file_key

pytest.importorskip("onnxruntime")
MLP = os.path.join(os.path.dirname(os.path.dirname(__file__)), "models", "mlp.onnx")


def _build(model, out, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build(model, out, targets=["x86_64-v2"], **kw)


@pytest.fixture
def parses(monkeypatch):
    """The model files parsed (importer.load_file_bytes and load_model calls on a file; a
    ModelProto given to load_model, as compile_onnx does, is only checked)."""
    import onnx

    seen = []
    real_bytes, real_load = importer.load_file_bytes, importer.load_model

    def load(m):
        if not isinstance(m, onnx.ModelProto):
            seen.append(m)
        return real_load(m)
    monkeypatch.setattr(importer, "load_file_bytes",
                        lambda path, data: seen.append(path) or real_bytes(path, data))
    monkeypatch.setattr(importer, "load_model", load)
    return seen


def test_a_warm_rebuild_of_a_file_does_not_parse_it(tmp_path, parses, monkeypatch):
    from mlpack.codegen.dsl import registry

    monkeypatch.setattr(registry, "_OPS", {})   # (ops other tests registered would turn it off)
    cold = _build(MLP, tmp_path / "cold.mlpack", cache=tmp_path / "k")
    assert parses == [MLP]
    parses.clear()
    warm = _build(MLP, tmp_path / "warm.mlpack", cache=tmp_path / "k")
    assert parses == []   # its graph and vectors found by the file's digest
    assert (tmp_path / "cold.mlpack").read_bytes() == (tmp_path / "warm.mlpack").read_bytes()
    assert warm.cache["hits"] == cold.cache["misses"]
    _build(MLP, tmp_path / "none.mlpack", cache=False)   # no cache: parsed, same bytes
    assert parses == [MLP]
    assert (tmp_path / "none.mlpack").read_bytes() == (tmp_path / "cold.mlpack").read_bytes()


def test_the_file_key_covers_its_bytes_the_budget_and_the_passes(monkeypatch):
    data = open(MLP, "rb").read()
    base = file_key(data, None)
    assert file_key(bytes(data), None) == base
    assert file_key(data[:-1] + bytes([data[-1] ^ 1]), None) != base
    assert file_key(data, 1 << 20) != base
    monkeypatch.setenv("MLPACK_DISABLE_PASSES", "cse")
    assert file_key(data, None) != base


def test_external_data_is_keyed_by_the_parsed_model(tmp_path, parses):
    """The file's bytes do not hold the weights: a changed weight in the data file is another
    graph, found by the parsed model's key (its tensors' data included), never the file's."""
    import onnx

    model = onnx.load(MLP)
    path = tmp_path / "ext.onnx"
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location="ext.data", size_threshold=0)
    source = ModelSource(str(path), None, True)
    source.proto()
    assert source.external and source.key() != source.file_key
    out = _build(str(path), tmp_path / "a.mlpack", cache=tmp_path / "k")
    assert out.cache["misses"] == 2
    data = tmp_path / "ext.data"   # a weight changed in the data file, the .onnx file the same
    raw = np.frombuffer(data.read_bytes(), np.float32).copy()
    raw[0] += 1
    data.write_bytes(raw.tobytes())
    _build(str(path), tmp_path / "b.mlpack", cache=tmp_path / "k")
    assert (tmp_path / "a.mlpack").read_bytes() != (tmp_path / "b.mlpack").read_bytes()


def test_a_registered_custom_op_turns_the_file_lookup_off(tmp_path, parses, monkeypatch):
    _build(MLP, tmp_path / "a.mlpack", cache=tmp_path / "k")
    parses.clear()
    monkeypatch.setattr(build_mod.customops, "registered", lambda: True)
    _build(MLP, tmp_path / "b.mlpack", cache=tmp_path / "k")
    assert parses == [MLP]   # parsed, so that used_by can see the model's nodes


def test_a_missing_or_broken_file_is_a_clear_error(tmp_path):
    from mlpack.spec.errors import Error

    with pytest.raises(Error, match="no such file"):
        _build(str(tmp_path / "none.onnx"), tmp_path / "a.mlpack", cache=tmp_path / "k")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(open(MLP, "rb").read()[:100])
    with pytest.raises(Error, match="bad.onnx"):
        _build(str(bad), tmp_path / "b.mlpack", cache=tmp_path / "k")


def test_a_files_weights_are_let_go_and_mapped_again_without_parsing(tmp_path, parses):
    from mlpack.codegen.errors import ModelError
    from mlpack.codegen.onnx.mapped import MappedModel

    path = tmp_path / "m.onnx"
    path.write_bytes(open(MLP, "rb").read())
    source = ModelSource(str(path), None, keyed=True)
    first = source.importable()
    assert isinstance(first, MappedModel) and first.weights and parses == [str(path)]
    want = {name: np.array(w) for name, w in first.weights.items()}
    proto = source.proto()
    source.release()
    assert source.proto() is proto   # the message stays
    again = source.importable()
    assert again is not first and parses == [str(path)]   # mapped, not parsed, again
    assert all(np.array_equal(again.weights[n], w) for n, w in want.items())
    source.release()
    path.write_bytes(b"")   # a file cut under the build: its error, not a crash
    with pytest.raises(ModelError, match="m.onnx: the file changed while mlpack was building"):
        source.importable()
