"""Reductions, normalizations, activations and variadic ops through mlpack vs onnxruntime.

Each test builds a small model with onnx.helper, runs it through ``mlpack.backend`` and through
onnxruntime on the same random inputs. Float outputs must agree to fp32 rtol 1e-4 / atol 1e-5;
integer and bool outputs exactly. Opsets on both sides of each semantic change are covered
(Reduce* axes attribute vs input, Softmax flatten-to-2D vs single axis, Clip attributes vs
inputs), and one model has a symbolic (dim_param) batch dim.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from mlpack import backend
import support

RNG = np.random.default_rng(0)
F, I32, I64 = TP.FLOAT, TP.INT32, TP.INT64


def model(op, inputs, attrs=None, inits=(), opset=18, n_out=1, in_names=None, out=F,
          out_shape=None):
    """One ``op`` node over graph inputs (name, type, shape) then initializers."""
    names = in_names if in_names is not None else [i[0] for i in inputs] + [t.name for t in inits]
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op, names, outs, **(attrs or {}))
    graph = helper.make_graph([node], "t", [helper.make_tensor_value_info(*i) for i in inputs],
                              [helper.make_tensor_value_info(o, out, out_shape) for o in outs],
                              list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def ints(name, values):
    return numpy_helper.from_array(np.asarray(values, dtype=np.int64), name)


def floats(name, values):
    return numpy_helper.from_array(np.asarray(values, dtype=np.float32), name)


check = support.check


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


X = ("x", F, [2, 3, 4])


# ---------------------------------------------------------------- reductions

REDUCES = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
           "ReduceL2", "ReduceLogSumExp", "ReduceSumSquare"]


@pytest.mark.parametrize("op", REDUCES)
@pytest.mark.parametrize("axes,keepdims", [([1], 1), ([0, -1], 0), (None, 1)])
def test_reduce_axes_input(op, axes, keepdims):
    inits = [ints("axes", axes)] if axes is not None else []
    m = model(op, [X], {"keepdims": keepdims}, inits)
    check(m, {"x": rand(2, 3, 4)})


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceLogSum"])
def test_reduce_axes_attribute_old_opset(op):
    m = model(op, [X], {"axes": [2], "keepdims": 0}, opset=11)
    check(m, {"x": np.abs(rand(2, 3, 4)) + 0.1})


def test_reduce_noop_with_empty_axes():
    m = model("ReduceSumSquare", [X], {"noop_with_empty_axes": 1}, [ints("axes", [])])
    check(m, {"x": rand(2, 3, 4)})


def test_reduce_empty_set():
    m = model("ReduceLogSumExp", [("x", F, [2, 0, 4])], {"keepdims": 1}, [ints("axes", [1])])
    check(m, {"x": np.zeros((2, 0, 4), np.float32)})


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("last", [0, 1])
def test_arg_reduce(op, last):
    x = RNG.integers(0, 3, (3, 5)).astype(np.float32)  # ties, so select_last_index matters
    m = model(op, [("x", F, [3, 5])], {"axis": -1, "keepdims": 0, "select_last_index": last},
              out=I64)
    check(m, {"x": x})


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("opset,axis", [(11, 1), (11, 0), (13, 1), (13, -1)])
def test_softmax_family(op, opset, axis):
    x = rand(2, 3, 4) * 50  # large values: the max must be subtracted
    check(model(op, [X], {"axis": axis}, opset=opset), {"x": x})


@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumsum(exclusive, reverse):
    m = model("CumSum", [X], {"exclusive": exclusive, "reverse": reverse},
              [numpy_helper.from_array(np.array(1, np.int64), "axis")])
    check(m, {"x": rand(2, 3, 4)})


# ---------------------------------------------------------------- normalizations


def test_layer_norm_with_stats():
    inits = [floats("s", rand(3, 4)), floats("b", rand(3, 4))]
    m = model("LayerNormalization", [X], {"axis": 1, "epsilon": 1e-3}, inits, opset=17, n_out=3)
    check(m, {"x": rand(2, 3, 4)})


def test_batch_norm_inference():
    inits = [floats(n, v) for n, v in [("s", rand(3)), ("b", rand(3)), ("m", rand(3)),
                                        ("v", np.abs(rand(3)) + 0.5)]]
    check(model("BatchNormalization", [X], {"epsilon": 1e-3}, inits, opset=15), {"x": rand(2, 3, 4)})


def test_instance_and_group_norm():
    inits = [floats("s", rand(4)), floats("b", rand(4))]
    x = ("x", F, [2, 4, 3])
    check(model("InstanceNormalization", [x], {}, inits), {"x": rand(2, 4, 3)})
    check(model("GroupNormalization", [x], {"num_groups": 2}, inits, opset=21),
          {"x": rand(2, 4, 3)})


@pytest.mark.parametrize("p", [1, 2])
def test_lp_norm(p):
    check(model("LpNormalization", [X], {"axis": 1, "p": p}), {"x": rand(2, 3, 4)})


def test_lrn_and_mvn():
    x = ("x", F, [2, 5, 3, 3])
    check(model("LRN", [x], {"size": 3, "alpha": 1e-2}), {"x": rand(2, 5, 3, 3)})
    check(model("MeanVarianceNormalization", [x]), {"x": rand(2, 5, 3, 3)})


def test_symbolic_batch():
    """Statistics over a dim_param batch dim: the count is a symbolic size."""
    xb = ("x", F, ["batch", 3])
    inits = [floats("s", rand(3)), floats("b", rand(3)), floats("m", rand(3)), floats("v", rand(3))]
    m = model("BatchNormalization", [xb], {"training_mode": 1}, inits, opset=15, n_out=3)
    rep = backend.prepare(m)
    assert rep.executor is not None  # compiled once, not per batch size
    for n in (1, 5):
        feeds = {"x": rand(n, 3)}
        want = ort.InferenceSession(m.SerializeToString()).run(None, feeds)
        for w, g in zip(want, rep.run(feeds)):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    check(model("ReduceMean", [xb], {"keepdims": 0}, [ints("axes", [0])]), {"x": rand(4, 3)})
    check(model("Softmax", [xb], {"axis": 0}, opset=13), {"x": rand(4, 3)})


# ---------------------------------------------------------------- activations

ACTS = [("LeakyRelu", {"alpha": 0.2}), ("Elu", {}), ("Selu", {}), ("Celu", {"alpha": 2.0}),
        ("HardSigmoid", {}), ("HardSwish", {}), ("Softplus", {}), ("Softsign", {}),
        ("ThresholdedRelu", {"alpha": 0.5}), ("Mish", {}), ("Shrink", {"lambd": 0.7, "bias": 0.1}),
        ("Gelu", {}), ("Gelu", {"approximate": "tanh"})]


@pytest.mark.parametrize("op,attrs", ACTS)
def test_activation(op, attrs):
    x = rand(2, 3, 4) * 3
    x[0, 0, :] = [40.0, -40.0, 0.0, 1e-3]  # overflow guards
    check(model(op, [X], attrs, opset=20), {"x": x})


def test_prelu_broadcast_slope():
    check(model("PRelu", [X], {}, [floats("s", rand(3, 1))]), {"x": rand(2, 3, 4)})


@pytest.mark.parametrize("opset", [6, 13])
def test_clip(opset):
    if opset < 11:
        m = model("Clip", [X], {"min": -0.5, "max": 0.5}, opset=opset)
    else:
        m = model("Clip", [X, ("lo", F, []), ("hi", F, [])], opset=opset)
    feeds = {"x": rand(2, 3, 4)}
    if opset >= 11:
        feeds.update(lo=np.array(-0.3, np.float32), hi=np.array(0.8, np.float32))
    check(m, feeds)


def test_clip_min_only():
    m = model("Clip", [X], {}, [floats("lo", 0.1)], opset=13, in_names=["x", "lo", ""])
    check(m, {"x": rand(2, 3, 4)})


# ---------------------------------------------------------------- variadic and integer ops


@pytest.mark.parametrize("op", ["Max", "Min", "Sum", "Mean"])
def test_variadic_broadcast(op):
    ins = [("a", F, [2, 3, 4]), ("b", F, [3, 1]), ("c", F, [4])]
    check(model(op, ins), {"a": rand(2, 3, 4), "b": rand(3, 1), "c": rand(4)})


@pytest.mark.parametrize("fmod,dtype", [(0, I32), (1, I32), (1, F)])
def test_mod(fmod, dtype):
    npt = np.int32 if dtype == I32 else np.float32
    a = RNG.integers(-20, 20, (3, 4)).astype(npt)
    b = RNG.choice([-7, -3, 2, 5], (3, 4)).astype(npt)
    check(model("Mod", [("a", dtype, [3, 4]), ("b", dtype, [3, 4])], {"fmod": fmod}, out=dtype),
          {"a": a, "b": b})


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bitshift(direction):
    u = TP.UINT32
    a = RNG.integers(0, 1 << 20, (6,)).astype(np.uint32)
    b = np.array([0, 1, 3, 7, 31, 2], np.uint32)
    check(model("BitShift", [("a", u, [6]), ("b", u, [6])], {"direction": direction}, out=u),
          {"a": a, "b": b})


@pytest.mark.parametrize("pos,neg", [(1, 1), (1, 0), (0, 1)])
def test_isinf(pos, neg):
    x = np.array([1.0, np.inf, -np.inf, np.nan, 0.0], np.float32)
    m = model("IsInf", [("x", F, [5])], {"detect_positive": pos, "detect_negative": neg},
              out=TP.BOOL)
    check(m, {"x": x})
