"""rows.py: the tensor a projection reads across heads is laid out rows first, and the artifact
still matches ONNX Runtime (fp32 tolerance, rtol 1e-4, atol 1e-5) on x86_64-v2/v3/v4.

The model is attention's tail: per-head outputs ``O[head, token, d]`` (here a Relu of the input,
so that a comprehension writes them), transposed to tokens by heads, reshaped to tokens by
(head, d) and multiplied by a weight matrix, optionally over a dynamic batch.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from mlpack.codegen.compile import compile_onnx
from mlpack.codegen.targets.cpu import rows
from onnx import TensorProto as TP
from onnx import helper
from support import one_output_model

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# tests/codegen/targets/plan_runner.py
from plan_runner import HOST_TARGETS, assert_matches_ort, rand

HEADS, TOKENS, D, N = 4, 24, 16, 40


def heads_projection(batch=None):
    """Relu(x) over [batch,] heads, tokens, d, then tokens x (heads * d) @ W."""
    lead = [] if batch is None else ["batch"]
    x = rand(*([2] if batch else []), HEADS, TOKENS, D, seed=1)
    perm = [1, 0, 2] if batch is None else [0, 2, 1, 3]
    shape = [TOKENS, HEADS * D] if batch is None else [0, TOKENS, HEADS * D]
    nodes = [helper.make_node("Relu", ["x"], ["o"]),
             helper.make_node("Transpose", ["o"], ["t"], perm=perm),
             helper.make_node("Reshape", ["t", "shape"], ["r"]),
             helper.make_node("MatMul", ["r", "w"], ["y"])]
    inits = [("shape", np.array(shape, np.int64)),
             ("w", rand(HEADS * D, N, seed=2, scale=1 / np.sqrt(HEADS * D)))]
    m = one_output_model(nodes, [("x", TP.FLOAT, lead + [HEADS, TOKENS, D])], inits)
    return m, {"x": x}


def plain_matmul():
    """Relu then a matmul over one K dim: nothing to reorder."""
    nodes = [helper.make_node("Relu", ["x"], ["o"]), helper.make_node("MatMul", ["o", "w"], ["y"])]
    return one_output_model(nodes, [("x", TP.FLOAT, [TOKENS, D])], [("w", rand(D, N, seed=2))])


def _relu_layout(m) -> list[str]:
    g = compile_onnx(m)
    out = rows.rows_first(g)
    (relu,) = [op for op in g.ops if op.out.startswith("o")]
    return list(g.types[relu.out].dims), list(out.types[relu.out].dims)


@pytest.mark.parametrize("batch", [None, "dynamic"])
def test_the_heads_tensor_is_laid_out_tokens_first(batch):
    before, after = _relu_layout(heads_projection(batch)[0])
    lead = before[:1] if batch else []
    heads, tokens, d = before[len(lead):]
    assert after == lead + [tokens, heads, d]


def test_one_k_dim_keeps_its_order():
    before, after = _relu_layout(plain_matmul())
    assert after == before


@pytest.mark.parametrize("target", HOST_TARGETS)
@pytest.mark.parametrize("batch", [None, "dynamic"])
def test_rows_first_matches_ort(batch, target):
    m, feeds = heads_projection(batch)
    assert_matches_ort(m, feeds, target)
