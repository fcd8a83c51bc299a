"""benchmarks/dispatch_ab.py: two builds of one model, dispatch by dispatch, each kernel's
fastest time over rounds taken in turns."""

from __future__ import annotations

import os
import warnings

from benchmarks import dispatch_ab
from mlpack.packager.build import build

MLP = os.path.join(os.path.dirname(os.path.dirname(__file__)), "models", "mlp.onnx")


def test_each_dispatch_of_both_builds_timed(tmp_path, capsys):
    paths = []
    for target in ("x86_64-v2", "x86_64-v3"):   # (every x86-64 host runs both)
        paths.append(str(tmp_path / f"{target}.mlpack"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            build(MLP, paths[-1], targets=[target], cache=False)
    best = dispatch_ab.main([*paths, "--runs", "3", "--rounds", "2", "--match", "Relu"])
    text = capsys.readouterr().out
    assert len(best) == 2 and set(best[0]) == set(best[1])
    relu = [n for n in best[0] if "Relu" in n]
    assert len(relu) == 2 and all(b[n] > 0 for b in best for n in relu), text
    lines = text.splitlines()
    assert lines[1].startswith("all dispatches:") and lines[2].startswith("matching 'Relu':")
    assert len(lines) == 3 + len(relu)
