"""The nine ``light_*`` models shipped with onnx, through mlpack.

Two checks per model: the shipped model on the inputs ONNX's own backend runner feeds it,
against the shipped expected output (at that suite's tolerances); and a rebuild with seeded
random weights (``tests/models/light.py``), whose output is a real distribution rather than
a uniform softmax, against ONNX Runtime at fp32 tolerances. Every result comes from mlpack's
compiled graph on the reference interpreter; ONNX Runtime is only the oracle.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

from mlpack import backend
import support

ort = pytest.importorskip("onnxruntime")

MODELS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models")
RTOL, ATOL = 1e-4, 1e-5




light = support.load_light()


def _mlpack(model, feeds: dict[str, np.ndarray]) -> np.ndarray:
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return backend.prepare(model).run(feeds)[0]


def _onnxruntime(model, feeds: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


@pytest.mark.parametrize("name", light.NAMES)
def test_shipped_model_matches_expected_output(name):
    from onnx.backend.test.runner import Runner
    model = light.load_model(name)
    got = _mlpack(model, light.reference_inputs(name, model))
    rtol, atol = light.tolerances(name)
    Runner.assert_similar_outputs([light.expected_output(name)], [got], rtol=rtol, atol=atol)


@pytest.mark.parametrize("name", light.NAMES)
def test_random_weights_match_onnxruntime(name):
    model = light.random_weight_model(name, seed=0)
    feeds = light.random_inputs(model, seed=0)
    want = _onnxruntime(model, feeds)
    assert np.ptp(want) > 0.1 * np.abs(want).max(), "the rebuilt model's output is near uniform"
    got = _mlpack(model, feeds)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
