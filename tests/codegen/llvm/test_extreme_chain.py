"""A nest of three or more float max (or min) ops, a pooling window's taps or a variadic Max,
is lowered as one select per value and one NaN test over them all
(codegen/llvm/oprules.py's ``float_extreme_chain``, which scalar.py's emitter takes for such a
nest): the same values as the IR's NaN-propagating max, on this host's cpu targets, with a NaN
at every position of the nest in turn, infinities, and signed zeros (equal at any tolerance)."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from llvmlite import ir
from onnx import TensorProto as TP
from onnx import helper

from mlpack.codegen.compile import compile_onnx
from mlpack.codegen.llvm import oprules
from mlpack.codegen.llvm.scalar import _chain
from mlpack.codegen.targets.cpu import compile_cpu
from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.interp import run_graph
from support import one_output_model

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "targets"))
from plan_runner import HOST_TARGETS, rand, run_plan  # noqa: E402

F, D = TP.FLOAT, TP.DOUBLE


def _check(m, feeds, target, monkeypatch):
    chains = []
    real = oprules.float_extreme_chain
    monkeypatch.setattr(oprules, "float_extreme_chain",
                        lambda b, kind, values: chains.append(len(values)) or real(b, kind, values))
    g = compile_onnx(m)
    got = run_plan(compile_cpu(g, target), g, feeds)[g.outputs[0].name]
    assert chains and min(chains) >= 3   # lowered as a chain, not op by op
    want = run_graph(g, feeds)[g.outputs[0].name]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=0, atol=0, equal_nan=True)
    return got


@pytest.mark.parametrize("target", HOST_TARGETS)
@pytest.mark.parametrize("op, dtype", [("Max", F), ("Min", F), ("Max", D)])
def test_a_variadic_extreme_propagates_a_nan_from_any_operand(target, op, dtype, monkeypatch):
    names = [f"x{i}" for i in range(5)]
    m = one_output_model([helper.make_node(op, names, ["y"])],
                         [(n, dtype, [5, 37]) for n in names])
    if dtype == D:   # (the output is declared f32: a double model says so itself)
        m.graph.output[0].type.tensor_type.elem_type = D
    np_dtype = np.float32 if dtype == F else np.float64
    feeds = {n: rand(5, 37, seed=i).astype(np_dtype) for i, n in enumerate(names)}
    for i, n in enumerate(names):   # row i: a NaN in operand i, at columns 3 and 30
        feeds[n][i, [3, 30]] = np.nan
    feeds["x2"][:, 5] = np.inf
    feeds["x4"][:, 6] = -np.inf
    feeds["x0"][:, 7], feeds["x3"][:, 7] = -0.0, 0.0
    got = _check(m, feeds, target, monkeypatch)
    assert np.isnan(got[:, [3, 30]]).all() and not np.isnan(np.delete(got, [3, 30], 1)).any()


@pytest.mark.parametrize("target", HOST_TARGETS)
def test_a_pooling_windows_nan_reaches_each_output_it_covers(target, monkeypatch):
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], pads=[1] * 4)
    m = one_output_model([node], [("x", F, [1, 4, 28, 28])])
    x = rand(1, 4, 28, 28)
    x[0, 0, 0, 0] = x[0, 1, 13, 20] = x[0, 2, 27, 27] = x[0, 3, 5, 27] = np.nan
    x[0, 1, 2, 2] = np.inf
    got = _check(m, {"x": x}, target, monkeypatch)
    assert np.isnan(got).sum() == 4 + 9 + 4 + 6   # each NaN's 3x3 neighbourhood, clipped


def test_the_chain_is_the_nest_of_one_op_and_dtype_in_order():
    a, b, c, d = (ex.read(n, {"i": ex.var("i")}, "f32") for n in "abcd")
    e = ex.binary("max", a, ex.binary("max", ex.binary("max", b, c), d))
    assert _chain(e) == [a, b, c, d]
    mixed = ex.binary("max", a, ex.binary("min", b, c))   # another op: a leaf
    assert _chain(mixed) == [a, ex.binary("min", b, c)]


def test_the_lowering_has_one_nan_test_per_value_and_one_select_for_nan():
    mod = ir.Module()
    fn = ir.Function(mod, ir.FunctionType(ir.FloatType(), [ir.FloatType()] * 4), "f")
    b = ir.IRBuilder(fn.append_basic_block())
    out = oprules.float_extreme_chain(b, "max", [*fn.args[:3], ir.Constant(ir.FloatType(), 1.0)])
    b.ret(out)
    text = str(fn)
    assert text.count("fcmp uno") == 3          # not for the constant
    assert text.count("fcmp ogt") == 3 and text.count("select") == 4


def test_the_lowering_takes_vectors_too():
    vty = ir.VectorType(ir.FloatType(), 4)
    mod = ir.Module()
    fn = ir.Function(mod, ir.FunctionType(vty, [vty] * 3), "f")
    b = ir.IRBuilder(fn.append_basic_block())
    b.ret(oprules.float_extreme_chain(b, "min", list(fn.args)))
    text = str(fn)
    assert text.count("fcmp olt") == 2 and text.lower().count("float 0x7ff8000000000000") == 4
