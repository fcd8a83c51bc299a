"""benchmarks/idle.py: a model's first runs after pauses, mlpack beside ONNX Runtime."""

from __future__ import annotations

import os
import re
import warnings

import pytest

from benchmarks import idle
from mlpack.packager.build import build

pytest.importorskip("onnxruntime")
MLP = os.path.join(os.path.dirname(os.path.dirname(__file__)), "models", "mlp.onnx")


def test_first_runs_after_each_pause_beside_onnx_runtime(tmp_path, capsys):
    out = tmp_path / "mlp.mlpack"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        build(MLP, out, targets=["x86_64-v2"], cache=False)
    idle.main([MLP, str(out), "--threads", "2", "--idle", "0.001,0.01", "--rounds", "2"])
    text = capsys.readouterr().out
    rows = {line.split()[0]: [float(v) for v in line.split()[1:]]
            for line in text.splitlines()[2:]}
    assert set(rows) == {"steady", "0.001s", "0.01s"}
    assert len(rows["steady"]) == 2 and all(len(rows[p]) == 4 for p in ("0.001s", "0.01s"))
    assert all(v > 0 for values in rows.values() for v in values)
    assert re.match(r"2 thread\(s\), medians of 2 rounds", text)
