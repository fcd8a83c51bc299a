"""Fixtures of the runtime tests: the IR graphs of runtime_helpers.py, parsed, libmlpack, and
the plan-check tests' container (``mlp_v2``)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from runtime_helpers import MLP, TINY, TWO

from mlpack.spec.ir import parse_graph


@pytest.fixture(scope="module")
def mlp_v2(tmp_path_factory):
    """tests/models/mlp.onnx built for x86_64-v2 alone (its artifact NATIVE, runtime_helpers)."""
    build = pytest.importorskip("mlpack.packager.build").build
    out = tmp_path_factory.mktemp("mlp_v2") / "mlp.mlpack"
    build(MLP, out, targets=["x86_64-v2"])
    return out


@pytest.fixture
def tiny():
    return parse_graph(TINY)


@pytest.fixture
def two():
    return parse_graph(TWO)


@pytest.fixture(scope="module")
def native_lib():
    """libmlpack, built with make when the checkout has none; skips the module without it."""
    from mlpack.runtime import native

    cdir = Path(__file__).resolve().parents[2] / "runtime" / "c"
    if not native.available() and shutil.which("make") and shutil.which("cc"):
        subprocess.run(["make", "-C", str(cdir)], check=False, capture_output=True)
    if not native.available():
        pytest.skip("libmlpack is not built (pip install -e . or make -C runtime/c)")
