"""Shared test set-up: hypothesis profiles and small ONNX model builders.

Tests are grouped by what they need; everything under tests/ runs on a plain CPU machine in a
few minutes. Hypothesis writes no example database (``database=None``), so a run leaves the
checkout clean; set ``HYPOTHESIS_PROFILE=thorough`` for more examples.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, settings
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # so tests can import support

settings.register_profile("default", database=None, deadline=None, max_examples=60,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", database=None, deadline=None, max_examples=1000,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


def make_model(nodes, inputs, outputs, initializers=(), opsets=(("", 17),), name="test"):
    """A ModelProto from nodes and (name, elem_type, shape) triples for inputs and outputs."""
    def info(spec):
        n, t, shape = spec
        return helper.make_tensor_value_info(n, t, shape)

    graph = helper.make_graph(list(nodes), name, [info(i) for i in inputs],
                              [info(o) for o in outputs], list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])


@pytest.fixture(scope="session", autouse=True)
def _session_kernel_cache(tmp_path_factory):
    """Fixtures of a wider scope (built before any test's own cache below) build with a cache of
    the session's, never the user's ~/.cache: a machine's earlier runs cannot feed them."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLPACK_CACHE_DIR", str(tmp_path_factory.mktemp("session-kernels")))
        # builds wait the default 5 s for emulated runs whatever the caller's environment sets
        # (test_emulate.py patches the default itself), unless a test asks for
        # patient_emulation
        mp.delenv("MLPACK_EMULATION_SECONDS", raising=False)
        yield


@pytest.fixture(autouse=True)
def _kernel_cache(tmp_path_factory, monkeypatch):
    """Each test builds with a kernel cache of its own (packager/cache.py), never the user's:
    a test that plants wrong code (by patching the compiler) must not hand it to another."""
    monkeypatch.setenv("MLPACK_CACHE_DIR", str(tmp_path_factory.mktemp("kernels")))


@pytest.fixture
def patient_emulation():
    """Builds in the test (in this process and the CLI's) wait for their emulated runs to the
    end (support.patient_emulation)."""
    from support import patient_emulation

    with patient_emulation():
        yield


@pytest.fixture
def tiny_model_path(tmp_path):
    """``y = relu(x + b)`` with a dynamic ``batch`` dim, saved to a file; returns its path."""
    b = numpy_helper.from_array(np.arange(4, dtype=np.float32), "b")
    nodes = [helper.make_node("Add", ["x", "b"], ["t"], name="add"),
             helper.make_node("Relu", ["t"], ["y"], name="relu")]
    model = make_model(nodes, [("x", TensorProto.FLOAT, ["batch", 4])],
                       [("y", TensorProto.FLOAT, ["batch", 4])], [b], name="tiny")
    path = tmp_path / "tiny.onnx"
    onnx.save(model, str(path))
    return path


@pytest.fixture
def onnx_model():
    """The ``make_model`` builder, for tests that assemble their own models."""
    return make_model
