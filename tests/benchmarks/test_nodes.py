"""benchmarks/nodes.py: mlpack's dispatches and ONNX Runtime's nodes joined by the tensor each
writes, the MLP's two fused Gemm+Relu layers found on both sides."""

from __future__ import annotations

import os
import re
import warnings

import pytest

from benchmarks import nodes
from mlpack.packager.build import build

pytest.importorskip("onnxruntime")
MLP = os.path.join(os.path.dirname(os.path.dirname(__file__)), "models", "mlp.onnx")


def test_canonical_names_meet():
    assert nodes.canonical("/layers/layers.2/Relu_output_0") == "layers_layers_2_Relu_output_0"
    assert nodes.canonical("_layers_layers.2_Relu_output_0") == "layers_layers_2_Relu_output_0"


def test_both_profiles_joined_by_output(tmp_path, capsys):
    out = tmp_path / "mlp.mlpack"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        build(MLP, out, targets=["x86_64-v2"], cache=False)
    rows = nodes.main([MLP, str(out), "--runs", "3"])
    text = capsys.readouterr().out
    assert re.search(r"mlpack [0-9.]+ ms in \d+ outputs, ONNX Runtime [0-9.]+ ms", text)
    # the hidden layers, each a Gemm with its Relu fused, on both sides
    both = [name for name, ours, theirs in rows if ours > 0 and theirs > 0]
    assert sum(name.endswith("Relu_output_0") for name in both) == 2, text
