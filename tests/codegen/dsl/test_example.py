"""examples/capsules/build_and_run.py runs as a user would run it: the DSL layer and its EM
routing against NumPy, the PyTorch custom-op model built, validated and run."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from dsl_support import CAPSULES, ROOT

pytest.importorskip("torch")


def test_build_and_run(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(CAPSULES, "build_and_run.py"),
                           str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    errors = [float(e) for e in re.findall(r"max error (?:of the \w+ )?(?:against \S+ \S+ )?"
                                           r"([0-9.e+-]+)", out)]
    assert len(errors) >= 4 and max(errors) < 1e-4, out
    assert "portable fp32: validated" in out and "the container keeps the op's source" in out
    assert (tmp_path / "caps.mlpack").exists()
