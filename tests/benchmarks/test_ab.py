"""benchmarks/ab.py: two containers of one model timed alternating beside ONNX Runtime, on
seeded random inputs or on an .npz of them, and A and B alone where ONNX Runtime cannot open
the model (a custom op)."""

from __future__ import annotations

import os
import re
import warnings

import numpy as np
import pytest

from benchmarks import ab
from mlpack.packager.build import build

pytest.importorskip("onnxruntime")
MLP = os.path.join(os.path.dirname(os.path.dirname(__file__)), "models", "mlp.onnx")


@pytest.fixture(scope="module")
def container(tmp_path_factory):
    out = tmp_path_factory.mktemp("ab") / "mlp.mlpack"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        build(MLP, out, targets=["x86_64-v2"], cache=False)
    return str(out)


def _ratio(text: str, name: str) -> float:
    return float(re.search(rf"{name} ([0-9.]+)", text).group(1))


def test_random_inputs_beside_onnx_runtime(container, capsys):
    ab.main([MLP, container, container, "--rounds", "2"])
    out = capsys.readouterr().out
    assert _ratio(out, "A/B") > 0 and _ratio(out, "ORT/A") > 0


def test_inputs_from_npz_and_no_onnx_runtime(container, tmp_path, capsys):
    import mlpack

    model = mlpack.load(container)
    feeds = {i.name: np.ones([1 if not isinstance(d, int) else d for d in i.shape], np.float32)
             for i in model.inputs}
    np.savez(tmp_path / "feeds.npz", **feeds)
    broken = tmp_path / "not_onnx.onnx"   # what ONNX Runtime cannot open, as a custom op
    broken.write_bytes(b"not a model")
    ab.main([str(broken), container, container, "--rounds", "2",
             "--inputs", str(tmp_path / "feeds.npz")])
    out = capsys.readouterr().out
    assert "ONNX Runtime cannot run" in out and "ORT" not in out.splitlines()[-1]
    assert _ratio(out, "A/B") > 0
