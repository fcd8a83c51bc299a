"""Pooling windows made to read in bounds (codegen/targets/cpu/halo.py), against ONNX Runtime on
x86_64-v2, v3 and v4 (those this host runs), fp32 rtol 1e-4 / atol 1e-5, and in the kernels they
compile to.

A 3x3 max pooling over an NCHW concatenation (a concatenation keeps its tensor NCHW, layout.py)
with pads, or ceil_mode past the edge: its input copied with a halo of -inf, the pooling reading
that without guards; a window that never leaves its input: no guard and no copy; a stride-2 one
over a short row keeps its guards; one whose guard holds along its row (channels last) too.
NaN in the padded input still propagates (against the IR interpreter). An average pooling's
window sum goes the same way (kernels.unroll_window), a convolution's sum of products does not.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper

from mlpack.codegen.compile import compile_onnx
from mlpack.codegen.targets.cpu import compile_cpu
from mlpack.codegen.targets.cpu.compile import get_target, schedule_kernels
from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.interp import run_graph
from support import one_output_model, oracle_outputs

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from plan_runner import ATOL, HOST_TARGETS, RTOL, rand, run_plan  # tests/codegen/targets/plan_runner.py

F = TP.FLOAT


def concat_pool(size: int, stride: int, pads: int = 0, ceil: int = 0, channels=(6, 10),
                op: str = "MaxPool", **attrs):
    """Relu'd inputs concatenated along channels (NCHW), then a 3x3 MaxPool (or ``op``, with
    ``attrs``: an AveragePool's count_include_pad)."""
    nodes = [helper.make_node("Relu", [f"x{i}"], [f"r{i}"]) for i in range(len(channels))]
    nodes += [helper.make_node("Concat", [f"r{i}" for i in range(len(channels))], ["c"], axis=1),
              helper.make_node(op, ["c"], ["y"], kernel_shape=[3, 3], strides=[stride] * 2,
                               pads=[pads] * 4, ceil_mode=ceil, **attrs)]
    m = one_output_model(nodes, [(f"x{i}", F, ["N", c, size, size])
                                 for i, c in enumerate(channels)])
    feeds = {f"x{i}": rand(1, c, size, size, seed=i) for i, c in enumerate(channels)}
    return m, feeds


def pool_kernels(m, target="x86_64-v3"):
    """(the pooling's kernel, its halo copy or None) as the target schedules them."""
    _, kernels, _, _, _ = schedule_kernels(compile_onnx(m), get_target(target))
    pool = next(k for k in kernels if k.out == "y")
    copy = next((k for k in kernels if k.name == f"{pool.name}_pad"), None)
    return pool, copy


def guarded(k) -> int:
    return sum(r.arg[2] is not None for r in ex.reads(k.body))


@pytest.mark.parametrize("target", HOST_TARGETS)
@pytest.mark.parametrize("case", [dict(size=14, stride=1, pads=1),            # GoogLeNet's
                                  dict(size=28, stride=2, ceil=1),            # guards kept
                                  dict(size=56, stride=2, ceil=1),            # past the edge
                                  dict(size=55, stride=2, ceil=1),            # fits: no copy
                                  dict(size=56, stride=2, pads=1),
                                  # ShuffleNet's average poolings: a short row, a halo copy
                                  dict(size=28, stride=2, pads=1, op="AveragePool"),
                                  dict(size=56, stride=2, pads=1, op="AveragePool"),
                                  dict(size=14, stride=1, pads=1, op="AveragePool",
                                       count_include_pad=1)])
def test_a_pooling_over_a_concatenation_matches_onnx_runtime(case, target):
    m, feeds = concat_pool(**case)
    g = compile_onnx(m)
    got = run_plan(compile_cpu(g, target), g, feeds)["y"]
    np.testing.assert_allclose(got, oracle_outputs(m, feeds)[0], rtol=RTOL, atol=ATOL)


def test_a_padded_window_along_the_row_reads_a_halo_copy():
    pool, copy = pool_kernels(concat_pool(14, 1, pads=1)[0])
    assert pool.window == 9 and guarded(pool) == 0
    assert copy is not None and guarded(copy) > 0   # (the copy holds the guard, once)
    assert pool.reads == [copy.out]
    pool, copy = pool_kernels(concat_pool(56, 2, ceil=1)[0])   # ceil_mode past the last column
    assert guarded(pool) == 0 and copy is not None


def test_a_window_that_stays_inside_loses_its_guards_without_a_copy():
    pool, copy = pool_kernels(concat_pool(55, 2, ceil=1)[0])   # 27 windows end at column 54
    assert guarded(pool) == 0 and copy is None and pool.reads == ["c"]


def test_a_strided_window_over_a_short_row_keeps_its_guards():
    pool, copy = pool_kernels(concat_pool(28, 2, ceil=1)[0])   # a row of 14: see MIN_STRIDED_ROW
    assert guarded(pool) == 9 and copy is None


def test_a_guard_that_holds_along_the_row_stays():
    # a pooling of a convolution's output: channels last, the guard the same for every lane
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("MaxPool", ["c"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                              pads=[1] * 4)]
    m = one_output_model(nodes, [("x", F, ["N", 8, 20, 20])],
                         inits=[("w", rand(32, 8, 1, 1, seed=3))])
    pool, copy = pool_kernels(m)
    assert guarded(pool) > 0 and copy is None


@pytest.mark.parametrize("target", HOST_TARGETS)
def test_nan_in_the_halo_copy_still_propagates(target):
    m, feeds = concat_pool(14, 1, pads=1)
    feeds["x0"][0, 1, 0, 0] = np.nan   # a corner: its windows reach into the halo
    feeds["x1"][0, 2, 5, 7] = np.nan
    g = compile_onnx(m)
    got = run_plan(compile_cpu(g, target), g, feeds)["y"]
    want = run_graph(g, feeds)["y"]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, equal_nan=True)
    assert np.isnan(got[0, 1, 0, 0]) and np.isnan(got[0, 8, 5, 7])


def test_an_average_pooling_sums_its_window_as_a_map_and_a_convolution_does_not():
    """An average pooling's sum over its 3x3 window is written out as one map of 9 terms (an
    NCHW stride-2 one was a reduction reading each tap through a guard: ShuffleNet's 0.118 ->
    0.030 ms), and a wide enough padded row reads a halo copy; a depthwise convolution's sum of
    products over the same window stays a reduction (depthwise.py schedules it)."""
    pool, copy = pool_kernels(concat_pool(56, 2, 1, op="AveragePool")[0])
    assert pool.window == 9 and pool.reduce is None and guarded(pool) == 0
    assert copy is not None and pool.reads[0] == copy.out
    # a row of 14 (MIN_STRIDED_ROW): guards, no copy
    pool, copy = pool_kernels(concat_pool(28, 2, 1, op="AveragePool")[0])
    assert pool.window == 9 and pool.reduce is None and copy is None
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Conv", ["r", "w"], ["y"], group=8, pads=[1] * 4)]
    m = one_output_model(nodes, [("x", F, ["N", 8, 20, 20])],
                         inits=[("w", rand(8, 1, 3, 3, seed=4))])
    conv, _ = pool_kernels(m)
    assert conv.window == 1 and conv.reduce == "sum"
