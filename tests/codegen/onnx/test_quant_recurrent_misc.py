"""Quantization, recurrent, signal and misc ops through mlpack, compared with onnxruntime.

Each test builds a small one-node model, runs it through ``mlpack.backend`` and through
onnxruntime (or ONNX's reference evaluator where onnxruntime lacks the op) on the same random
inputs. Tolerances: quantized (integer) outputs must match exactly, except that a value
exactly halfway between two levels may round either way (|diff| <= 1); f32 recurrent, DFT and
window outputs within rtol=1e-4 / atol=1e-5 (windows: 1e-6 / 1e-7); BitCast exactly.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from mlpack import backend
from mlpack.codegen.errors import UnsupportedOpError
import support

RNG = np.random.default_rng(0)
F, I64, U8, I8 = TP.FLOAT, TP.INT64, TP.UINT8, TP.INT8


def model(op, inputs, outputs, attrs=None, inits=(), opset=21, in_names=None, domain=""):
    """One ``op`` node; inputs/outputs are (name, elem_type, shape) triples."""
    names = in_names if in_names is not None else [i[0] for i in inputs] + [t.name for t in inits]
    node = helper.make_node(op, names, [o[0] for o in outputs], domain=domain, **(attrs or {}))
    graph = helper.make_graph([node], "t", [helper.make_tensor_value_info(*i) for i in inputs],
                              [helper.make_tensor_value_info(*o) for o in outputs], list(inits))
    opsets = [helper.make_opsetid("", opset)]
    if domain:
        opsets.append(helper.make_opsetid(domain, 1))
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


check = support.check


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def init(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


# ---------------------------------------------------------------- quantization


@pytest.mark.parametrize("zp_type", [U8, I8, TP.INT16])
def test_quantize_per_axis(zp_type):
    x = rand(2, 3, 4) * 20
    np_t = {U8: np.uint8, I8: np.int8, TP.INT16: np.int16}[zp_type]
    scale = np.array([0.5, 0.25, 2.0], np.float32)
    zp = np.array([3, 10, 0], np_t)
    m = model("QuantizeLinear", [("x", F, x.shape)], [("y", zp_type, None)], {"axis": 1},
              [init("s", scale), init("z", zp)])
    check(m, {"x": x}, int_slack=1)


def test_quantize_blocked_and_saturating():
    x = rand(3, 8) * 1000  # far out of range: saturates
    scale = np.abs(rand(3, 2)) + 0.1
    zp = RNG.integers(0, 255, (3, 2)).astype(np.uint8)
    m = model("QuantizeLinear", [("x", F, x.shape)], [("y", U8, None)],
              {"axis": 1, "block_size": 4}, [init("s", scale), init("z", zp)])
    check(m, {"x": x}, oracle="ref", int_slack=1)


def test_dequantize_per_axis_and_default_zero_point():
    x = RNG.integers(-128, 127, (2, 3, 4)).astype(np.int8)
    scale = np.array([0.5, 0.25, 2.0], np.float32)
    m = model("DequantizeLinear", [("x", I8, x.shape)], [("y", F, None)], {"axis": 1},
              [init("s", scale), init("z", np.array([1, -2, 0], np.int8))])
    check(m, {"x": x})
    m = model("DequantizeLinear", [("x", I8, x.shape)], [("y", F, None)], {},
              [init("s", np.float32(0.1))])
    check(m, {"x": x})


def test_dynamic_quantize_linear():
    x = rand(4, 5) * 3
    m = model("DynamicQuantizeLinear", [("x", F, x.shape)],
              [("y", U8, None), ("s", F, None), ("z", U8, None)], opset=11)
    check(m, {"x": x}, rtol=1e-6, atol=0, int_slack=1)


@pytest.mark.parametrize("t,np_t", [(U8, np.uint8), (I8, np.int8)])
def test_qlinear_matmul_broadcast(t, np_t):
    lo, hi = np.iinfo(np_t).min, np.iinfo(np_t).max
    a = RNG.integers(lo, hi, (2, 3, 4)).astype(np_t)
    w = RNG.integers(lo, hi, (4, 5)).astype(np_t)
    inits = [init("sa", np.float32(0.02)), init("za", np_t(3)), init("sb", np.float32(0.03)),
             init("zb", np_t(-1 if t == I8 else 7)), init("sy", np.float32(0.5)),
             init("zy", np_t(5))]
    m = model("QLinearMatMul", [("a", t, a.shape), ("b", t, w.shape)], [("y", t, None)], {},
              inits, in_names=["a", "sa", "za", "b", "sb", "zb", "sy", "zy"])
    check(m, {"a": a, "b": w}, int_slack=1)


def test_qlinear_conv_padded_grouped_with_bias():
    x = RNG.integers(0, 255, (1, 4, 6, 6)).astype(np.uint8)
    w = RNG.integers(0, 255, (6, 2, 3, 3)).astype(np.uint8)
    bias = RNG.integers(-500, 500, (6,)).astype(np.int32)
    inits = [init("sx", np.float32(0.01)), init("zx", np.uint8(100)),
             init("sw", np.full(6, 0.02, np.float32)), init("zw", np.full(6, 120, np.uint8)),
             init("sy", np.float32(0.3)), init("zy", np.uint8(128)), init("bias", bias)]
    m = model("QLinearConv", [("x", U8, x.shape), ("w", U8, w.shape)], [("y", U8, None)],
              {"pads": [1, 1, 1, 1], "strides": [2, 1], "group": 2}, inits,
              in_names=["x", "sx", "zx", "w", "sw", "zw", "sy", "zy", "bias"])
    check(m, {"x": x, "w": w}, int_slack=1)


# ---------------------------------------------------------------- recurrent


def _rnn_model(op, seq, batch, inp, hidden, gates, attrs, with_b=True, seq_lens=None,
               init_h=True, layout=0, ndir=1, outs=("Y", "Y_h")):
    x_shape = (batch, seq, inp) if layout else (seq, batch, inp)
    feeds = {"X": rand(*x_shape)}
    inputs = [("X", F, x_shape)]
    inits = [init("W", rand(ndir, gates * hidden, inp) * 0.5),
             init("R", rand(ndir, gates * hidden, hidden) * 0.5)]
    names = ["X", "W", "R", "", "", ""]
    if with_b:
        inits.append(init("B", rand(ndir, 2 * gates * hidden) * 0.3))
        names[3] = "B"
    if seq_lens is not None:
        inits.append(init("L", np.asarray(seq_lens, np.int32)))
        names[4] = "L"
    if init_h:
        h_shape = (batch, ndir, hidden) if layout else (ndir, batch, hidden)
        inputs.append(("H0", F, h_shape))
        feeds["H0"] = rand(*h_shape)
        names[5] = "H0"
    if op == "LSTM":
        names += ["C0", "P"]
        c_shape = (batch, ndir, hidden) if layout else (ndir, batch, hidden)
        inputs.append(("C0", F, c_shape))
        feeds["C0"] = rand(*c_shape)
        inits.append(init("P", rand(ndir, 3 * hidden) * 0.3))
    while names and names[-1] == "":
        names.pop()
    attrs = {"hidden_size": hidden, "layout": layout, **attrs}
    m = model(op, inputs, [(o, F, None) for o in outs], attrs, inits, opset=14, in_names=names)
    return m, feeds


def check_batchwise(m1, feeds1):
    """A layout=1 model against onnxruntime on its layout=0 twin (onnxruntime has no layout=1;
    ONNX's reference ignores clip and input_forget)."""
    import copy
    m0 = copy.deepcopy(m1)
    node = m0.graph.node[0]
    for a in node.attribute:
        if a.name == "layout":
            a.i = 0
    perm = {"X": (1, 0, 2), "H0": (1, 0, 2), "C0": (1, 0, 2)}
    feeds0 = {k: np.ascontiguousarray(v.transpose(perm[k])) for k, v in feeds1.items()}
    for vi in m0.graph.input:
        dims = vi.type.tensor_type.shape.dim
        sizes = [d.dim_value for d in dims]
        for d, p in zip(dims, perm[vi.name]):
            d.dim_value = sizes[p]
    sess = ort.InferenceSession(m0.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds0)
    got = backend.prepare(m1).run(feeds1)
    for w, g in zip(want, got):
        w = w.transpose((2, 0, 1, 3) if w.ndim == 4 else (1, 0, 2))
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_rnn_directions_with_activation_params(direction):
    ndir = 2 if direction == "bidirectional" else 1
    acts = ["ScaledTanh", "LeakyRelu"][:ndir] if ndir == 2 else ["HardSigmoid"]
    m, feeds = _rnn_model("RNN", 4, 3, 5, 6, 1, {"direction": direction, "activations": acts,
                                                 "activation_alpha": [0.7, 0.2],
                                                 "activation_beta": [1.3]}, ndir=ndir)
    check(m, feeds)


@pytest.mark.parametrize("lbr", [0, 1])
def test_gru_bidirectional_seq_lens(lbr):
    m, feeds = _rnn_model("GRU", 5, 3, 4, 3, 3, {"direction": "bidirectional",
                                                 "linear_before_reset": lbr},
                          seq_lens=[5, 2, 3], ndir=2)
    check(m, feeds)


def test_gru_batchwise_layout_clip_no_initial_state():
    m, feeds = _rnn_model("GRU", 3, 2, 4, 5, 3, {"clip": 0.8}, with_b=False, init_h=False,
                          layout=1)
    check_batchwise(m, feeds)


@pytest.mark.parametrize("direction", ["forward", "reverse"])
def test_lstm_peepholes_seq_lens(direction):
    m, feeds = _rnn_model("LSTM", 4, 3, 3, 4, 4, {"direction": direction}, seq_lens=[4, 1, 3],
                          outs=("Y", "Y_h", "Y_c"))
    check(m, feeds)


def test_lstm_coupled_input_forget_bidirectional_layout1():
    m, feeds = _rnn_model("LSTM", 3, 2, 3, 4, 4, {"direction": "bidirectional",
                                                  "input_forget": 1}, layout=1, ndir=2,
                          outs=("Y", "Y_h", "Y_c"))
    check_batchwise(m, feeds)


def test_rnn_symbolic_sequence_is_refused():
    m = model("RNN", [("X", F, ["T", 2, 3])], [("Y", F, None)], {"hidden_size": 2},
              [init("W", rand(1, 2, 3)), init("R", rand(1, 2, 2))], opset=14)
    with pytest.raises(UnsupportedOpError, match="static"):
        backend.prepare(m)


# ---------------------------------------------------------------- signal and misc


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
def test_windows(op, periodic):
    m = model(op, [], [("y", TP.DOUBLE, None)], {"periodic": periodic, "output_datatype": 11},
              [init("n", np.int64(9))], opset=17)
    check(m, {}, rtol=1e-6, atol=1e-7)  # onnxruntime rounds the coefficients to f32


@pytest.mark.parametrize("inverse,onesided,comps,length", [
    (0, 0, 1, None), (0, 1, 1, 12), (0, 0, 2, 6), (1, 0, 2, None), (1, 1, 2, None)])
def test_dft(inverse, onesided, comps, length):
    x = rand(2, 8, 3, comps)
    inits = [init("axis", np.int64(1))]
    names = ["x", "", "axis"]
    if length is not None:
        inits.append(init("len", np.int64(length)))
        names[1] = "len"
    m = model("DFT", [("x", F, x.shape)], [("y", F, None)],
              {"inverse": inverse, "onesided": onesided}, inits, opset=20, in_names=names)
    check(m, {"x": x}, oracle="ref", atol=1e-4)


def test_stft_with_window():
    x = rand(2, 40, 1)
    m = model("STFT", [("x", F, x.shape)], [("y", F, None)], {},
              [init("step", np.int64(6)), init("win", np.hanning(10).astype(np.float32))],
              opset=17, in_names=["x", "step", "win"])
    check(m, {"x": x}, atol=1e-4)


@pytest.mark.parametrize("size", [2, 3, 4])
def test_det(size):
    x = rand(3, size, size)
    m = model("Det", [("x", F, x.shape)], [("y", F, None)], opset=22)
    check(m, {"x": x}, rtol=1e-4, atol=1e-4)


def test_col2im_strided_padded_dilated():
    x = rand(2, 2 * 2 * 3, 9)
    m = model("Col2Im", [("x", F, x.shape)], [("y", F, None)],
              {"strides": [2, 1], "pads": [1, 0, 1, 1], "dilations": [1, 2]},
              [init("img", np.array([5, 6], np.int64)), init("blk", np.array([2, 3], np.int64))],
              opset=18, in_names=["x", "img", "blk"])
    check(m, {"x": x}, oracle="ref")


def test_binarizer():
    x = rand(3, 4)
    m = model("Binarizer", [("x", F, x.shape)], [("y", F, None)], {"threshold": 0.2},
              domain="ai.onnx.ml")
    check(m, {"x": x})


@pytest.mark.parametrize("src,dst", [(np.float32, np.int32), (np.int32, np.float32),
                                     (np.float64, np.int64), (np.int64, np.float64),
                                     (np.uint16, np.int16), (np.float16, np.int16)])
def test_bitcast(src, dst):
    from onnx.helper import np_dtype_to_tensor_dtype as t
    if np.dtype(src).kind == "f":
        x = np.array([0.0, -0.0, 1.5, -3.25e-3, np.inf, -np.inf, 1e-40 if src != np.float16
                      else 3e-6, np.finfo(src).max, np.finfo(src).tiny], src)
    else:
        x = RNG.integers(np.iinfo(src).min, np.iinfo(src).max, 64, dtype=src)
        if np.dtype(dst).kind == "f":  # keep to finite, non-NaN patterns for the comparison
            x = x[np.isfinite(x.view(dst))]
    m = model("BitCast", [("x", t(np.dtype(src)), x.shape)], [("y", t(np.dtype(dst)), None)],
              {"to": t(np.dtype(dst))}, opset=26)
    got = backend.prepare(m).run({"x": x})[0]
    np.testing.assert_array_equal(got, x.view(dst))


def test_random_ops_are_refused():
    m = model("RandomUniformLike", [("x", F, (3,))], [("y", F, None)], opset=22)
    with pytest.raises(UnsupportedOpError, match="random"):
        backend.prepare(m)
