"""Models whose output sizes are expressions of symbols (``2 * $batch``, ``$seq + 1``) build,
validate and run at several batch sizes, on the native artifact and on the portable one, with
ONNX Runtime's outputs; a size the container cannot state stops the build right after the
model compiles, with one line and no file (issue 15, "Sizes that are expressions")."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from support import assert_user_error, cli, load_models_module, oracle_outputs

import mlpack
from mlpack.packager.build import build
from mlpack.packager.signature import SignatureError
from mlpack.spec.container import open_container

MODELS = load_models_module("size_expressions")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """name -> (container path, ModelProto, feeds(batch), expected output sizes)."""
    out = {}
    d = tmp_path_factory.mktemp("sizes")
    for name, make in MODELS.MODELS.items():
        model, feeds, sizes = make()
        onnx.save(model, str(d / f"{name}.onnx"))
        build(str(d / f"{name}.onnx"), str(d / f"{name}.mlpack"))
        out[name] = (d / f"{name}.mlpack", model, feeds, sizes)
    return out


@pytest.mark.parametrize("name", sorted(MODELS.MODELS))
def test_signature_states_the_size(built, name):
    path, _, _, sizes = built[name]
    with open_container(path) as c:
        assert c.format_version == (1, 1)
        for art in c.artifacts:
            dims = art.config["model"]["outputs"][0]["dims"]
            assert [d["size"] for d in dims] == sizes, art.config["artifact"]["target"]


@pytest.mark.parametrize("name", sorted(MODELS.MODELS))
def test_validates(built, name):
    result = cli("validate", built[name][0])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("device", [None, "portable"])
@pytest.mark.parametrize("name", sorted(MODELS.MODELS))
def test_runs_at_two_batch_sizes_like_onnx_runtime(built, name, device):
    path, model, feeds, _ = built[name]
    with mlpack.load(path, device=device) as m:
        if device is None:
            assert m.artifact.device == "cpu", m.artifact   # the native artifact, not a fallback
        for batch in (2, 5):
            x = feeds(batch)
            want = oracle_outputs(model, x)[0]
            got = m(**x)["y"]
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-5)


def test_output_info_shows_the_expression(built):
    with mlpack.load(built["concat_twice"][0]) as m:
        assert m.outputs[0].shape == ("2 * $batch", 3)
        assert str(m.outputs[0]) == "y: f32[batch=2 * $batch, d1=3]"


def test_an_undecidable_size_is_refused_before_any_target_compiles(tmp_path):
    model, _, _ = MODELS.undecidable_expand()   # eq($batch, 2): no fact decides it
    src, out = tmp_path / "bad.onnx", tmp_path / "bad.mlpack"
    onnx.save(model, str(src))
    steps = []
    with pytest.raises(SignatureError, match=r"output 'y' dim 'd0' has size select\("):
        build(str(src), str(out), progress=steps.append)
    assert steps == ["import...", "compile..."]
    assert not out.exists()
    result = cli("build", src, "-o", out)
    assert_user_error(result, "output 'y'", "dim 'd0'", "cannot state")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.onnx"]
