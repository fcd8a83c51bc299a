"""The examples run, as a user would run them (style: examples are runnable and run in CI)."""

from __future__ import annotations

import os
import subprocess
import sys

import onnx
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")
MLP = os.path.join(EXAMPLES, "models", "mlp.onnx")


def _run(*args, cwd=ROOT):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, cwd=cwd)


def test_make_mlp_is_deterministic(tmp_path):
    sys.path.insert(0, os.path.join(EXAMPLES, "models"))
    try:
        from make_mlp import make_mlp
    finally:
        sys.path.pop(0)
    a, b = make_mlp().SerializeToString(), make_mlp().SerializeToString()
    assert a == b and len(a) < 100_000
    if os.path.exists(MLP):  # the checked-in file is what the script writes
        assert onnx.load(MLP).graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"


@pytest.mark.skipif(not os.path.exists(MLP), reason="examples/models/mlp.onnx is not there")
def test_python_example_matches_onnxruntime():
    proc = _run(os.path.join(EXAMPLES, "mlp_reference.py"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert 'graph "mlp"' in proc.stdout and "max |mlpack - onnxruntime|" in proc.stdout


@pytest.mark.skipif(not os.path.exists(MLP), reason="examples/models/mlp.onnx is not there")
def test_readme_command_prints_the_ir():
    proc = _run("-m", "mlpack.packager.cli", "import", MLP, "--print-ir")
    assert proc.returncode == 0, proc.stderr
    assert "x: f32[batch=$batch, d1=16]" in proc.stdout and 'graph "mlp" {' in proc.stdout
