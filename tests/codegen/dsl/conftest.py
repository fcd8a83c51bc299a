"""The DSL tests' fixtures (their helpers are in dsl_support.py)."""

import numpy as np
import pytest


@pytest.fixture
def rng():
    """Seeded data, the same in every test."""
    return np.random.default_rng(0)
