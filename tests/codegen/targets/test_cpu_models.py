"""Whole models through the cpu target (the highest x86-64 level this host runs: v4 with
AVX-512, else v3) against the reference interpreter.

The nine ``light_*`` models from the onnx wheel, rebuilt with seeded random weights
(tests/models/light.py), the MLP and the BERT block: each compiles with ``compile_cpu`` and its
plan, run by the Python plan runner, matches ``run_graph`` at fp32 rtol 1e-4 / atol 1e-5.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import onnx
import pytest

from mlpack.codegen.compile import compile_onnx
from mlpack.codegen.targets.cpu import compile_cpu
from mlpack.spec.ir.interp import run_graph
from plan_runner import TARGETS, run_plan
from support import best_host_target

MODELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models")
sys.path.insert(0, MODELS)
import light  # noqa: E402

TARGET = best_host_target(*TARGETS)
RTOL, ATOL = 1e-4, 1e-5


def compare(g, feeds):
    art = compile_cpu(g, TARGET)
    got = run_plan(art, g, feeds)
    want = run_graph(g, feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=RTOL, atol=ATOL, err_msg=name)
    return art


@pytest.mark.parametrize("name", light.NAMES)
def test_light_model(name):
    m = light.random_weight_model(name, 0)
    g = compile_onnx(m)
    compare(g, light.random_inputs(m, 0))


def test_mlp():
    g = compile_onnx(onnx.load(os.path.join(MODELS, "mlp.onnx")))
    x = np.random.default_rng(0).standard_normal((5, 784)).astype(np.float32)
    compare(g, {"x": x})


@pytest.mark.parametrize("batch,seq", [(1, 7), (3, 16)])
def test_bert_block(batch, seq):
    g = compile_onnx(onnx.load(os.path.join(MODELS, "bert_block.onnx")))
    ids = np.random.default_rng(batch).integers(-1000, 1000, (batch, seq)).astype(np.int64)
    compare(g, {"ids": ids})
