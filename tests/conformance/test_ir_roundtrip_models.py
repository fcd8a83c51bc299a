"""Printing the compiled IR of every ``light_*`` model and parsing it back gives an equal graph."""

from __future__ import annotations

import os

import pytest

from mlpack.codegen.compile import compile_onnx
from mlpack.spec.ir.parser import parse_graph
from mlpack.spec.ir.printer import format_graph
import support

MODELS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models")




light = support.load_light()


@pytest.mark.parametrize("name", light.NAMES)
def test_compiled_light_model_round_trips(name):
    graph = compile_onnx(light.load_model(name))
    text = format_graph(graph)
    back = parse_graph(text)
    assert back == graph
    assert format_graph(back) == text
