"""Output sizes that are expressions of symbols (format 1.1) in both readers and both runtimes:
the C engine (libmlpack) sizes such outputs from the bound symbols, on its native and its
portable executor, through mlpack_run_into and mlpack_run; the C and Python readers agree on
which size texts are in the grammar; the Python runtime shows them as written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from support import load_models_module, oracle_outputs

from mlpack.packager.build import build
from mlpack.runtime import native
from mlpack.runtime.model import _tensor_infos
from mlpack.spec import errors, sizes
from mlpack.spec.conformance import generate as corpus
from mlpack.spec.container import open_container

MODELS = load_models_module("size_expressions")


pytestmark = pytest.mark.usefixtures("native_lib")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("sizes")
    out = {}
    for name in ("concat_twice", "pad_one", "vit_cls_expand"):
        model, feeds, _ = MODELS.MODELS[name]()
        onnx.save(model, str(d / f"{name}.onnx"))
        build(str(d / f"{name}.onnx"), str(d / f"{name}.mlpack"), targets=["x86_64-v2"])
        out[name] = (d / f"{name}.mlpack", model, feeds)
    return out


@pytest.mark.parametrize("copy_out", [False, True], ids=["run_into", "run"])
@pytest.mark.parametrize("device", ["cpu", "portable"])
@pytest.mark.parametrize("name", ["concat_twice", "pad_one", "vit_cls_expand"])
def test_engine_sizes_expression_outputs(built, name, device, copy_out, monkeypatch):
    path, model, feeds = built[name]
    if copy_out:   # no shapes known up front: the engine allocates and mlpack_run copies out
        monkeypatch.setattr(native, "_output_shapes", lambda *a: None)
    with native.open_model(path, device=device, threads=2) as m:
        assert m.chosen.device == device
        for batch in (2, 5):
            x = feeds(batch)
            want = oracle_outputs(model, x)[0]
            got = m.run(x)["y"]
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-5)


def test_engine_reports_the_expression_as_written(built):
    with native.open_model(built["pad_one"][0], device="cpu") as m:
        assert m.inputs[0].shape == ("batch", "seq")
        assert m.outputs[0].shape == ("batch", "$seq + 1")


def test_python_runtime_keeps_symbols_and_expressions_apart():
    sig = [{"name": "y", "dtype": "f32", "dims": [{"name": "n", "size": "$n"},
                                                   {"name": "m", "size": "$n * 2 + 1"},
                                                   {"name": "c", "size": 3}]}]
    info, = _tensor_infos(sig)
    assert info.shape == ("n", "$n * 2 + 1", 3)
    assert str(info) == "y: f32[n, m=$n * 2 + 1, c=3]"


SIZE_TEXTS = ["$batch", "2 * $batch", "$seq + 1", "$a-1", "($h - 3) // 2 + 1", "max($n, 1)",
              "min($a, $b) % 7", "$a * ($b + 1)", "$x // -2", "  $a +  1 ",
              # not sizes
              "$", "$1a", "batch", "3", "2 * 3", "($a)", "$a +", "$a $b", "select($a, 1, 2)",
              "$a ** 2", "$a / 2", "max($a)", "maximum($a, 1)", "$a + 99999999999999999999",
              "$ab-c", "$a,", ""]


@pytest.mark.parametrize("text", SIZE_TEXTS)
def test_c_and_python_readers_agree_on_the_grammar(tmp_path, text):
    path = tmp_path / "c.mlpack"
    path.write_bytes(corpus.tar(corpus.layout(edit=corpus._output_size(text))))
    try:
        sizes.parse_size(text)
        valid = True
    except ValueError:
        valid = False
    try:
        open_container(path).close()
        python_ok = True
    except errors.ManifestError as e:
        python_ok = False
        assert "dim 'batch'" in str(e) and "\n" not in str(e)
    try:
        native.open_model(path, device="portable", threads=1).close()
        c_ok = True
    except errors.FormatError as e:
        c_ok = False
        assert "dim 'batch'" in str(e)
    assert valid == python_ok == c_ok, (valid, python_ok, c_ok)


def test_an_older_minor_container_still_reads_in_both_readers():
    path = Path(corpus.HERE) / "ok_minor_older.mlpack"
    with open_container(path) as c:
        assert c.format_version == (1, 0)
        assert c.artifacts[0].config["mlpack_format"] == "1.0"
    with native.open_model(path, device="portable", threads=1) as m:
        assert m.inputs[0].shape == ("batch", 4)
        y = m.run({"x": np.ones((3, 4), np.float32)})["y"]
        np.testing.assert_allclose(y, np.ones((3, 4)) + np.arange(4))
