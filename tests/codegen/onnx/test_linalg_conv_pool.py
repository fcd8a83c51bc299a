"""Contractions, convolutions, pooling and resize through mlpack, compared with onnxruntime.

Each test builds a small one-node model with onnx.helper and runs it through
``mlpack.backend`` and onnxruntime on the same random inputs. Float outputs agree to fp32
rtol 1e-4 / atol 1e-5, integer outputs (MatMulInteger, ConvInteger, MaxPool indices) exactly.
Weights, scales and sizes are initializers (so the model compiles once); one MatMul has a
symbolic (dim_param) batch dim and runs at two batch sizes on one compiled model.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from mlpack import backend
from mlpack.spec.ir.graph import Comprehension
from mlpack.codegen.onnx.importer import import_model
import functools
import support

RNG = np.random.default_rng(0)
F = TP.FLOAT
RTOL, ATOL = 1e-4, 1e-5


def model(op, inputs, attrs=None, inits=(), opset=21, n_out=1, in_names=None, out=F):
    """One ``op`` node over graph inputs (name, type, shape) then initializers."""
    names = in_names if in_names is not None else [i[0] for i in inputs] + [t.name for t in inits]
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op, names, outs, **(attrs or {}))
    out_types = out if isinstance(out, (list, tuple)) else [out] * n_out
    graph = helper.make_graph([node], "t", [helper.make_tensor_value_info(*i) for i in inputs],
                              [helper.make_tensor_value_info(o, t, None) for o, t in zip(outs, out_types)],
                              list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def init(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def randn(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


check = functools.partial(support.check, rtol=RTOL, atol=ATOL)


# ---------------------------------------------------------------- contractions


def test_matmul_symbolic_batch():
    w = randn(4, 5)
    m = model("MatMul", [("x", F, ["batch", 3, 4])], inits=[init("w", w)])
    rep = backend.prepare(m)
    for batch in (1, 3):
        check(m, {"x": randn(batch, 3, 4)}, rep=rep)


@pytest.mark.parametrize("sa, sb", [((3,), (3,)), ((3,), (3, 4)), ((2, 3), (3,)),
                                    ((2, 1, 3, 4), (5, 4, 2)), ((5, 3, 4), (4, 2))])
def test_matmul_broadcast_and_vectors(sa, sb):
    m = model("MatMul", [("a", F, sa), ("b", F, sb)])
    check(m, {"a": randn(*sa), "b": randn(*sb)})


@pytest.mark.parametrize("attrs, cshape", [
    ({}, None), ({"transA": 1}, (4,)), ({"transB": 1, "alpha": 0.5}, (3, 4)),
    ({"transA": 1, "transB": 1, "alpha": 2.0, "beta": 0.3}, (1, 4)), ({"beta": 2.0}, (3, 1))])
def test_gemm(attrs, cshape):
    a = randn(5, 3) if attrs.get("transA") else randn(3, 5)
    b = randn(4, 5) if attrs.get("transB") else randn(5, 4)
    inputs = [("a", F, a.shape), ("b", F, b.shape)]
    feeds = {"a": a, "b": b}
    if cshape is not None:
        inputs.append(("c", F, cshape))
        feeds["c"] = randn(*cshape)
    check(model("Gemm", inputs, attrs), feeds)


@pytest.mark.parametrize("eq, shapes", [
    ("ij,jk->ik", [(3, 4), (4, 5)]), ("ij,jk", [(3, 4), (4, 5)]), ("ii->i", [(4, 4)]),
    ("ii", [(4, 4)]), ("...ij,...jk->...ik", [(2, 3, 4), (1, 4, 5)]), ("bij->bji", [(2, 3, 4)]),
    ("i,i", [(5,), (5,)]), ("i,j->ij", [(3,), (4,)]), ("...i->...", [(2, 3, 4)])])
def test_einsum(eq, shapes):
    inputs = [(f"x{i}", F, s) for i, s in enumerate(shapes)]
    m = model("Einsum", inputs, {"equation": eq})
    check(m, {f"x{i}": randn(*s) for i, s in enumerate(shapes)})


def test_matmul_integer_zero_points():
    a = RNG.integers(0, 255, (3, 4)).astype(np.uint8)
    b = RNG.integers(0, 255, (4, 5)).astype(np.uint8)
    m = model("MatMulInteger", [("a", TP.UINT8, a.shape), ("b", TP.UINT8, b.shape)],
              inits=[init("za", np.uint8(12)), init("zb", np.arange(5, dtype=np.uint8) + 100)],
              out=TP.INT32)
    check(m, {"a": a, "b": b})


# ---------------------------------------------------------------- convolution


@pytest.mark.parametrize("xs, ws, attrs", [
    ((2, 3, 9, 8), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 4, 9, 8), (6, 2, 3, 2), {"group": 2, "strides": [2, 1], "dilations": [1, 2],
                                  "pads": [1, 0, 2, 1]}),
    ((1, 3, 7, 7), (3, 1, 3, 3), {"group": 3, "auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 2, 8, 7), (2, 2, 2, 3), {"auto_pad": "SAME_LOWER"}),
    ((1, 2, 8, 7), (2, 2, 3, 3), {"auto_pad": "VALID", "strides": [2, 3]}),
    ((2, 3, 10), (4, 3, 3), {"pads": [2, 1], "dilations": [2]}),
    ((1, 2, 5, 4, 6), (3, 2, 2, 3, 2), {"pads": [1, 0, 1, 0, 1, 1]}),
])
@pytest.mark.parametrize("bias", [False, True])
def test_conv(xs, ws, attrs, bias):
    inits = [init("w", randn(*ws) * 0.3)] + ([init("b", randn(ws[0]))] if bias else [])
    check(model("Conv", [("x", F, xs)], attrs, inits), {"x": randn(*xs)})


def test_conv_is_one_product_comprehension():
    """Conv imports as out = sum{ci, kh, kw} x[guarded] * w: the interpreter's einsum form."""
    m = model("Conv", [("x", F, (1, 2, 6, 6))], {"pads": [1, 1, 1, 1]},
              [init("w", randn(3, 2, 3, 3))])
    ops = [o for o in import_model(m).ops if isinstance(o, Comprehension)]
    assert len(ops) == 1 and ops[0].reduce == "sum" and ops[0].body.op == "mul"
    assert set(ops[0].rdims) == {"ci", "kh", "kw"}


@pytest.mark.parametrize("xs, ws, attrs", [
    ((1, 2, 4, 5), (2, 3, 3, 3), {}),
    ((1, 2, 4, 5), (2, 3, 3, 3), {"strides": [2, 3], "pads": [1, 0, 1, 1], "output_padding": [1, 1]}),
    ((1, 4, 3, 3), (4, 2, 2, 2), {"group": 2, "strides": [2, 2], "dilations": [2, 1]}),
    ((1, 2, 4, 4), (2, 3, 3, 3), {"strides": [2, 2], "output_shape": [9, 10]}),
    ((1, 2, 4, 4), (2, 3, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((2, 2, 5), (2, 1, 3), {"strides": [3]}),
])
def test_conv_transpose(xs, ws, attrs):
    inits = [init("w", randn(*ws) * 0.3), init("b", randn(ws[1] * attrs.get("group", 1)))]
    check(model("ConvTranspose", [("x", F, xs)], attrs, inits), {"x": randn(*xs)})


def test_conv_integer_pads_with_zero_point():
    x = RNG.integers(0, 255, (1, 2, 5, 5)).astype(np.uint8)
    w = RNG.integers(0, 255, (3, 2, 3, 3)).astype(np.uint8)
    m = model("ConvInteger", [("x", TP.UINT8, x.shape)], {"pads": [1, 1, 1, 1]},
              [init("w", w), init("zx", np.uint8(7)), init("zw", np.uint8(100))], out=TP.INT32)
    check(m, {"x": x})


# ---------------------------------------------------------------- pooling


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3]},
    {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 1, 1, 0], "ceil_mode": 1},
    {"kernel_shape": [2, 2], "dilations": [2, 2], "strides": [1, 2]},
    {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]},
    {"kernel_shape": [2, 3], "storage_order": 1, "strides": [2, 1]},
])
def test_max_pool_with_indices(attrs):
    m = model("MaxPool", [("x", F, (2, 3, 7, 8))], attrs, n_out=2, out=[F, TP.INT64])
    check(m, {"x": randn(2, 3, 7, 8)})


def test_max_pool_1d_and_3d():
    check(model("MaxPool", [("x", F, (1, 2, 9))], {"kernel_shape": [3], "strides": [2]}),
          {"x": randn(1, 2, 9)})
    check(model("MaxPool", [("x", F, (1, 2, 4, 5, 6))], {"kernel_shape": [2, 2, 3], "pads": [1] * 6}),
          {"x": randn(1, 2, 4, 5, 6)})


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3]},
    {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 3], "pads": [1, 2, 1, 0], "count_include_pad": 1},
    {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1, "pads": [1, 1, 1, 1],
     "count_include_pad": 1},
    {"kernel_shape": [2, 2], "auto_pad": "SAME_LOWER", "strides": [2, 2]},
])
def test_average_pool(attrs):
    check(model("AveragePool", [("x", F, (2, 3, 7, 8))], attrs), {"x": randn(2, 3, 7, 8)})


@pytest.mark.parametrize("p", [1, 2, 3])
def test_lp_pool(p):
    attrs = {"kernel_shape": [2, 3], "p": p, "pads": [1, 0, 0, 1], "strides": [2, 1]}
    check(model("LpPool", [("x", F, (1, 2, 6, 7))], attrs), {"x": randn(1, 2, 6, 7)})


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"])
def test_global_pools(op):
    check(model(op, [("x", F, ("n", 3, 5, 6))]), {"x": randn(2, 3, 5, 6)})


def test_max_unpool():
    x = randn(1, 2, 6, 6)
    pooled = model("MaxPool", [("x", F, x.shape)], {"kernel_shape": [2, 2], "strides": [2, 2]},
                   n_out=2, out=[F, TP.INT64])
    y, idx = backend.prepare(pooled).run({"x": x})
    m = model("MaxUnpool", [("y", F, y.shape), ("i", TP.INT64, idx.shape)],
              {"kernel_shape": [2, 2], "strides": [2, 2]})
    check(m, {"y": y, "i": idx})


# ---------------------------------------------------------------- resize


@pytest.mark.parametrize("attrs", [
    {"mode": "nearest"},
    {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
    {"mode": "nearest", "coordinate_transformation_mode": "align_corners",
     "nearest_mode": "round_prefer_ceil"},
    {"mode": "linear"},
    {"mode": "linear", "coordinate_transformation_mode": "align_corners"},
    {"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"},
    {"mode": "cubic"},
    {"mode": "cubic", "cubic_coeff_a": -0.5, "exclude_outside": 1},
    {"mode": "linear", "antialias": 1},
])
# scale * size is a whole number: where it is not, align_corners differs between onnxruntime
# and ONNX's reference (which mlpack follows; the node suite checks it)
@pytest.mark.parametrize("scales", [[1, 1, 2.0, 1.6], [1, 1, 0.6, 0.8]])
def test_resize_scales(attrs, scales):
    m = model("Resize", [("x", F, ("n", 2, 5, 5))], attrs,
              [init("roi", np.zeros(0, np.float32)), init("scales", np.array(scales, np.float32))])
    check(m, {"x": randn(2, 2, 5, 5)})


def test_resize_sizes_axes_and_crop():
    x = randn(1, 2, 6, 6)
    m = model("Resize", [("x", F, x.shape)], {"mode": "cubic", "axes": [3, 2]},
              [init("roi", np.zeros(0, np.float32)), init("scales", np.zeros(0, np.float32)),
               init("sizes", np.array([9, 4], np.int64))])
    check(m, {"x": x})
    m = model("Resize", [("x", F, x.shape)],
              {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize",
               "extrapolation_value": 3.0},
              [init("roi", np.array([0, 0, -0.2, 0.3, 1, 1, 0.9, 1.2], np.float32)),
               init("scales", np.zeros(0, np.float32)), init("sizes", np.array([1, 2, 5, 4], np.int64))],
              in_names=["x", "roi", "", "sizes"])
    check(m, {"x": x})


# ---------------------------------------------------------------- ops onnxruntime may lack


def check_reference(m, feeds, rtol=RTOL, atol=ATOL):
    """Against ONNX's reference evaluator, for ops newer than onnxruntime's CPU kernels."""
    from onnx.reference import ReferenceEvaluator
    want = ReferenceEvaluator(m).run(None, feeds)
    got = backend.prepare(m).run(feeds)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


@pytest.mark.parametrize("group, offset_group, with_mask", [(1, 1, False), (2, 2, True)])
def test_deform_conv(group, offset_group, with_mask):
    x, w = randn(1, 4, 5, 5), randn(6, 4 // group, 2, 2) * 0.3
    offset = randn(1, offset_group * 2 * 4, 5, 5)
    inputs = [("x", F, x.shape), ("off", F, offset.shape)]
    feeds = {"x": x, "off": offset}
    names = ["x", "w", "off", "b"]
    if with_mask:
        inputs.append(("mask", F, (1, offset_group * 4, 5, 5)))
        feeds["mask"] = RNG.random((1, offset_group * 4, 5, 5)).astype(np.float32)
        names.append("mask")
    m = model("DeformConv", inputs, {"group": group, "offset_group": offset_group, "pads": [1, 0, 0, 1]},
              [init("w", w), init("b", randn(6))], opset=22, in_names=names)
    check_reference(m, feeds)


@pytest.mark.parametrize("activation, past", [("none", False), ("silu", True)])
def test_causal_conv_with_state(activation, past):
    x, w = randn(2, 3, 6), randn(3, 1, 4)
    inputs = [("x", F, x.shape)] + ([("past", F, (2, 3, 3))] if past else [])
    feeds = {"x": x} | ({"past": randn(2, 3, 3)} if past else {})
    m = model("CausalConvWithState", inputs, {"activation": activation},
              [init("w", w), init("b", randn(3))], opset=27, n_out=2,
              in_names=["x", "w", "b"] + (["past"] if past else []))
    check_reference(m, feeds)
