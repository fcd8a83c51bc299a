"""Fixtures of the runtime tests: the IR graphs of runtime_helpers.py, parsed."""

from __future__ import annotations

import pytest
from runtime_helpers import TINY, TWO

from mlpack.spec.ir import parse_graph


@pytest.fixture
def tiny():
    return parse_graph(TINY)


@pytest.fixture
def two():
    return parse_graph(TWO)
