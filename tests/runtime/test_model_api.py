"""The user-facing surface of ``mlpack``: ONNX Runtime's InferenceSession API side by side with ORT
on the same model, one-line reprs, a clean ``dir(mlpack)``, a user's ``help(mlpack)``."""

from __future__ import annotations

import pathlib
import pydoc

import numpy as np
import pytest

import mlpack
from mlpack.packager.build import build
from mlpack.spec.errors import InputError

ort = pytest.importorskip("onnxruntime")

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODELS = {"mlp": ROOT / "examples/models/mlp.onnx",
          "bert_block": ROOT / "tests/models/bert_block.onnx"}


def _feeds(session, batch=3, seq=5) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    sizes = {"batch": batch, "seq": seq}
    feeds = {}
    for i in session.get_inputs():
        shape = [sizes[d] if isinstance(d, str) else d for d in i.shape]
        feeds[i.name] = (rng.integers(0, 8, shape) if i.type == "tensor(int64)"
                         else rng.standard_normal(shape).astype(np.float32))
    return feeds


@pytest.fixture(scope="module", params=sorted(MODELS))
def pair(request, tmp_path_factory):
    """(mlpack Model, ORT InferenceSession) on the same ONNX model."""
    onnx_path = MODELS[request.param]
    out = tmp_path_factory.mktemp(request.param) / f"{request.param}.mlpack"
    build(onnx_path, out)
    with mlpack.load(out) as m:
        yield m, ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])


# ---------------------------------------------------------------- ONNX Runtime's shape


def test_get_inputs_and_outputs_are_orts(pair):
    m, sess = pair
    for mine, theirs in ((m.get_inputs(), sess.get_inputs()),
                         (m.get_outputs(), sess.get_outputs())):
        assert [i.name for i in mine] == [i.name for i in theirs]
        assert [list(i.shape) for i in mine] == [i.shape for i in theirs]
        assert [i.type for i in mine] == [i.type for i in theirs]


def test_run_with_output_names_returns_orts_list(pair):
    m, sess = pair
    feeds = _feeds(sess)
    want = sess.run(None, feeds)
    got = m.run(None, feeds)
    assert isinstance(got, list) and len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    names = [o.name for o in sess.get_outputs()]
    named = m.run(names[::-1], input_feed=feeds)   # ORT's keyword, any order
    for g, w in zip(named, want[::-1]):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


def test_run_with_feeds_alone_still_returns_the_dict(pair):
    m, sess = pair
    feeds = _feeds(sess)
    got = m.run(feeds)
    assert isinstance(got, dict) and list(got) == [o.name for o in sess.get_outputs()]
    for g, w in zip(got.values(), m.run(None, feeds)):
        np.testing.assert_array_equal(g, w)


def test_run_names_a_bad_output(pair):
    m, sess = pair
    feeds = _feeds(sess)
    with pytest.raises(InputError, match="unknown output 'nope'"):
        m.run(["nope"], feeds)
    with pytest.raises(InputError, match="list of output names"):
        m.run(m.get_outputs()[0].name, feeds)   # a bare string, not a list


# ---------------------------------------------------------------- what a user prints


def _one_line(obj, limit=400) -> str:
    text = repr(obj)
    assert "\n" not in text and len(text) < limit, text
    return text


def test_reprs_are_one_short_line_each(pair):
    m, _ = pair
    assert _one_line(m).startswith("<mlpack.Model ")
    assert len(repr(m.verdicts)) < 2000
    assert repr(m.verdicts).count("\n") == len(m.verdicts) - 1   # one line per verdict
    for v in m.verdicts:
        assert v.reason in _one_line(v)
    assert _one_line(m.artifact).startswith("<ArtifactInfo ")
    for info in m.get_inputs() + m.get_outputs():
        assert info.name in _one_line(info)
    result = m.validate()
    assert _one_line(result).startswith("<ValidationResult ok: ")
    for check in result.outputs:
        assert _one_line(check).startswith(f"<OutputCheck ok: output {check.name!r}")


# ---------------------------------------------------------------- the package itself


def test_dir_mlpack_lists_the_public_names_only():
    names = dir(mlpack)
    assert "load" in names and "Error" in names
    assert not {"annotations", "importlib", "spec", "_LAZY"} & set(names)
    assert set(names) == set(mlpack.__all__)


def test_help_mlpack_is_written_for_users():
    text = pydoc.render_doc(mlpack)
    for phrase in ("mlpack.load(", "m.run(", "validate()", "README"):
        assert phrase in text


def test_the_package_ships_type_hints():
    assert (pathlib.Path(mlpack.__file__).parent / "py.typed").is_file()
