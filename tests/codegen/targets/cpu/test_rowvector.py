"""Row reductions summed in vector registers (codegen/targets/cpu/rowvector.py) against ONNX
Runtime.

An SE block's squeeze: a convolution, its relu stored (the excitation's scale reads it too), a
global pooling of it over a channels-last image, the scale and a 1x1 convolution. The pooling's row is the
channels: 40 of them (two whole vectors and 8 more, one row chunk), or 48 over a bigger image
(the row cut into chunks of 24: a vector and 8 more each); a mean, a max and a min; and a
pooling after a grouped convolution, whose row is one group's 8 channels (vectors of 8). Each is
compiled for x86_64-v2/v3/v4, run by the plan runner at the fp32 tolerance, and the pooling is
checked to take the vector path. A sum of squares (its body no plain read) does not.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from mlpack.codegen.compile import compile_onnx
from mlpack.codegen.targets.cpu import rowvector
from mlpack.codegen.targets.cpu.compile import schedule_kernels
from mlpack.codegen.targets.cpu.kernels import row_dim
from mlpack.codegen.targets.cpu.target import get_target
from onnx import TensorProto as TP
from onnx import helper
from support import one_output_model

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# tests/codegen/targets/plan_runner.py
from plan_runner import HOST_TARGETS, assert_matches_ort, rand

F = TP.FLOAT


def grouped_squeeze(channels=48, size=14):
    """a grouped conv (8 channels a group, so the channel dim splits into groups) -> relu ->
    global average pool -> the scale -> 1x1 conv: RegNetY's SE block"""
    w = rand(channels, 8, 3, 3, seed=1, scale=1 / np.sqrt(72))
    w2 = rand(8, channels, 1, 1, seed=3, scale=1 / np.sqrt(channels))
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"]),
             helper.make_node("Conv", ["a", "w", "b"], ["c"], pads=[1] * 4, group=channels // 8),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["p"]),
             helper.make_node("Mul", ["r", "p"], ["s"]),
             helper.make_node("Conv", ["s", "w2"], ["y"])]
    w1 = rand(channels, 8, 1, 1, seed=4, scale=1 / np.sqrt(8))
    m = one_output_model(nodes, [("x", F, [1, 8, size, size])],
                         [("w1", w1), ("w", w), ("b", rand(channels, seed=2, scale=0.1)),
                          ("w2", w2)])
    return m, {"x": rand(1, 8, size, size)}


def squeeze(pool: str, channels: int, size: int):
    """conv -> relu -> ``pool`` over the image -> relu's output times the pooled value -> 1x1
    conv (so that the image tensors are channels last inside)"""
    w = rand(channels, 8, 3, 3, seed=1, scale=1 / np.sqrt(72))
    w2 = rand(8, channels, 1, 1, seed=3, scale=1 / np.sqrt(channels))
    if pool == "mean":
        reduce = helper.make_node("GlobalAveragePool", ["r"], ["p"])
    elif pool == "squares":
        reduce = helper.make_node("ReduceSumSquare", ["r"], ["p"], axes=[2, 3], keepdims=1)
    else:
        reduce = helper.make_node("ReduceMax" if pool == "max" else "ReduceMin", ["r"], ["p"],
                                  axes=[2, 3], keepdims=1)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1] * 4),
             helper.make_node("Relu", ["c"], ["r"]), reduce,
             helper.make_node("Mul", ["r", "p"], ["s"]),
             helper.make_node("Conv", ["s", "w2"], ["y"])]
    m = one_output_model(nodes, [("x", F, [1, 8, size, size])],
                         [("w", w), ("b", rand(channels, seed=2, scale=0.1)), ("w2", w2)])
    return m, {"x": rand(1, 8, size, size)}


def _pool_kernels(model, target: str, width: bool = False):
    """The pooling's kernels (the row reductions of the relu's output) and whether each takes
    the vector path (``width``: the lanes of its vectors, 0 where it does not)."""
    _, kernels, bufs, _, _ = schedule_kernels(compile_onnx(model), get_target(target))
    out = []
    for k in kernels:
        if k.strategy == "row" and k.reduce is not None:
            ob = bufs[k.out]
            row = row_dim(ob, k.blocked, k.points)[1]
            takes = rowvector.applies(k, ob, bufs, row)
            out.append(rowvector.lanes(k, ob, row) * takes if width else takes)
    return out


@pytest.mark.parametrize("target", HOST_TARGETS)
@pytest.mark.parametrize("pool,channels,size", [("mean", 40, 12), ("mean", 48, 40),
                                                ("max", 40, 12), ("min", 48, 40)])
def test_a_pooled_row_sums_in_vectors_matches_ort(pool, channels, size, target):
    model, feeds = squeeze(pool, channels, size)
    assert _pool_kernels(model, target) == [True]
    assert_matches_ort(model, feeds, target)


def test_a_body_that_is_no_plain_read_keeps_the_output_row():
    model, _ = squeeze("squares", 40, 12)
    assert _pool_kernels(model, "x86_64-v3") == [False]


@pytest.mark.parametrize("target", HOST_TARGETS)
def test_a_row_of_one_group_sums_in_vectors_of_its_width(target):
    model, feeds = grouped_squeeze()
    assert _pool_kernels(model, target, width=True) == [8]
    assert_matches_ort(model, feeds, target)
