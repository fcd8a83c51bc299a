"""cpu kernel building (codegen/targets/cpu/kernels.py): small pooling windows unrolled.

A max or min pooling over a window of at most MAX_WINDOW positions becomes a map that combines
the window's terms (unroll_window), with a bias and relu taken out of the window where they
are non-decreasing; a larger window stays a reduction. On x86_64-v2/v3/v4, outputs equal ONNX
Runtime's on finite inputs, and the IR interpreter's (whose reduction propagates NaN, as the
cpu reduction did before unrolling; ONNX Runtime's MaxPool drops a NaN that is not first) with
NaN, -inf and inf among the inputs; exact, since max and min do no arithmetic.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from mlpack.codegen.compile import compile_onnx
from mlpack.codegen.targets.cpu.kernels import MAX_WINDOW, build_kernels
from mlpack.codegen.targets.cpu.plan import tensor_buffers
from onnx import TensorProto as TP
from onnx import helper
from support import one_output_model, oracle_outputs

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from plan_runner import HOST_TARGETS, compile_and_run, run_plan  # tests/codegen/targets/plan_runner.py

F = TP.FLOAT


def specials(x):
    x = x.copy()
    flat = x.reshape(-1)
    flat[::37] = np.nan
    flat[5::41] = -np.inf
    flat[9::43] = np.inf
    return x


def pool_case(op="MaxPool", k=3, stride=2, size=15, pads=0, bias_relu=True, concat=False):
    nodes, inits, src = [], [], "x"
    if bias_relu:
        nodes += [helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Relu", ["a"], ["r"])]
        inits.append(("b", np.linspace(-1, 1, 6, dtype=np.float32).reshape(1, 6, 1, 1)))
        src = "r"
    if concat:
        nodes.append(helper.make_node("Neg", ["x"], ["nx"]))
        nodes.append(helper.make_node("Concat", [src, "nx"], ["c"], axis=1))
        src = "c"
    attrs = {} if op.startswith("Global") else dict(kernel_shape=[k, k], strides=[stride] * 2,
                                                     pads=[pads] * 4)
    nodes.append(helper.make_node(op, [src], ["y"], **attrs))
    m = one_output_model(nodes, [("x", F, [1, 6, size, size])], inits)
    x = np.random.default_rng(0).standard_normal((1, 6, size, size)).astype(np.float32)
    return m, {"x": x}


CASES = {
    "maxpool3x3_s2_bias_relu": lambda: pool_case(),
    "maxpool2x2_plain": lambda: pool_case(k=2, stride=2, size=14, bias_relu=False),
    "maxpool3x3_padded": lambda: pool_case(stride=1, size=9, pads=1),
    "maxpool_over_concat": lambda: pool_case(concat=True),
    "global_maxpool_7x7": lambda: pool_case(op="GlobalMaxPool", size=7),   # 49 > MAX_WINDOW
}
UNROLLED = {"maxpool3x3_s2_bias_relu": 9, "maxpool2x2_plain": 4, "maxpool3x3_padded": 9,
            "maxpool_over_concat": 9, "global_maxpool_7x7": 1}


@pytest.mark.parametrize("target", HOST_TARGETS)
@pytest.mark.parametrize("case", list(CASES))
def test_pooling_matches_ort_and_the_interpreter(case, target):
    from mlpack.spec.ir import run_graph
    m, feeds = CASES[case]()
    g, art, got = compile_and_run(m, feeds, target)
    name = g.outputs[0].name
    np.testing.assert_array_equal(got, oracle_outputs(m, feeds)[0])
    odd = {"x": specials(feeds["x"])}
    got, want = run_plan(art, g, odd)[name], run_graph(g, odd)[name]
    np.testing.assert_array_equal(got, want)   # NaN where NaN, infinities where they are


@pytest.mark.parametrize("case", list(CASES))
def test_small_windows_become_maps(case):
    m, _ = CASES[case]()
    g = compile_onnx(m)
    bufs = tensor_buffers(g)
    k = [k for k in build_kernels(g, bufs) if k.out == g.outputs[0].name][0]
    assert k.window == UNROLLED[case]
    assert (k.reduce is None) == (k.window > 1)
    assert UNROLLED[case] <= MAX_WINDOW
