"""Printing the compiled IR of every ``light_*`` model and parsing it back gives an equal graph."""

from __future__ import annotations

import importlib.util
import os

import pytest

from mlpack.codegen.compile import compile_onnx
from mlpack.spec.ir.parser import parse_graph
from mlpack.spec.ir.printer import format_graph

MODELS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models")


def _load_light():
    spec = importlib.util.spec_from_file_location("mlpack_test_light",
                                                  os.path.join(MODELS_DIR, "light.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


light = _load_light()


@pytest.mark.parametrize("name", light.NAMES)
def test_compiled_light_model_round_trips(name):
    graph = compile_onnx(light.load_model(name))
    text = format_graph(graph)
    back = parse_graph(text)
    assert back == graph
    assert format_graph(back) == text
