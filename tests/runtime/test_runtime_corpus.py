"""The spec conformance corpus through mlpack.load: each broken container raises its FormatError
(and no other exception); each valid one loads and runs its portable program."""

from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pytest

import mlpack
from mlpack.spec import errors

CORPUS = os.path.join(os.path.dirname(errors.__file__), "conformance")
with open(os.path.join(CORPUS, "expected.json")) as _f:
    EXPECTED = json.load(_f)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_corpus_verdicts_through_load(name):
    want, path = EXPECTED[name], os.path.join(CORPUS, name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mlpack.PortableFallbackWarning)
        if want["verdict"] == "error":
            with pytest.raises(errors.FormatError) as info:
                mlpack.load(path)
            assert type(info.value).__name__ == want["error"]
            assert want["message_contains"] in str(info.value)
            return
        with mlpack.load(path) as m:
            # the corpus programs compute y = relu(x + b) with b = 0..3
            x = np.linspace(-3, 3, 12, dtype=np.float32).reshape(3, 4)
            y = m(x=x)["y"]
            np.testing.assert_array_equal(y, np.maximum(x + np.arange(4, dtype=np.float32), 0))


@pytest.mark.parametrize("name", ["ok_minimal.mlpack", "ok_multi.mlpack", "ok_minor_unknown_fields.mlpack"])
def test_valid_corpus_containers_pass_their_own_test_vectors(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = mlpack.load(os.path.join(CORPUS, name)).validate()
    assert result.ok and result.cases == 1
