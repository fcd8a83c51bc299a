"""A small convolutional network quantized by ONNX Runtime's ``quantize_static`` (QDQ format), as
users quantize models: per-channel s8 weights, u8 activations, calibrated on seeded inputs.

    path = qdq_convnet(folder)        # folder/convnet_qdq_s8_pc.onnx (the float model beside it)
    model, feeds = qlinear_conv()     # QLinearConv, QLinearMatMul, MatMulInteger, ConvInteger:
                                      # one-node models of seeded 8-bit integers

Convolution 3->32 (3x3; 27 products deep, below int8's depth), ReLU, convolution 32->32 (3x3,
288 deep), ReLU, a residual add, global average pooling and a 32->10 Gemm (32 deep), with
seeded random weights of sane scale. Nothing here depends on mlpack.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

INPUT = "x"
SHAPE = (1, 3, 16, 16)


def convnet(path: str) -> str:
    """The float model, written to ``path``."""
    rng = np.random.default_rng(7)

    def init(name, *shape, fan_in):
        return numpy_helper.from_array(
            (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32), name)

    inits = [init("w1", 32, 3, 3, 3, fan_in=27), init("w2", 32, 32, 3, 3, fan_in=288),
             init("wf", 10, 32, fan_in=32),
             numpy_helper.from_array((rng.standard_normal(32) * 0.1).astype(np.float32), "b1"),
             numpy_helper.from_array((rng.standard_normal(32) * 0.1).astype(np.float32), "b2"),
             numpy_helper.from_array((rng.standard_normal(10) * 0.1).astype(np.float32), "bf")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Add", ["r1", "r2"], ["s"]),
             helper.make_node("GlobalAveragePool", ["s"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1)]
    g = helper.make_graph(nodes, "convnet",
                          [helper.make_tensor_value_info(INPUT, TensorProto.FLOAT, ["n", 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 10])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    return path


def feeds(count: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{INPUT: rng.standard_normal(SHAPE).astype(np.float32)} for _ in range(count)]


class _Reader:
    def __init__(self, inputs):
        self.it = iter(inputs)

    def get_next(self):
        return next(self.it, None)


def qdq_convnet(folder: str, weights: str = "s8", per_channel: bool = True) -> str:
    """``convnet`` quantized by ``quantize_static`` (QDQ, u8 activations, s8 weights per
    channel unless told: ``weights="u8"`` gives asymmetric u8 weights, with zero points) on 8
    seeded inputs; the path of the quantized model."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    out = os.path.join(folder, f"convnet_qdq_{weights}{'_pc' if per_channel else ''}.onnx")
    quantize_static(convnet(os.path.join(folder, "convnet.onnx")), out, _Reader(feeds(8, 1)),
                    quant_format=QuantFormat.QDQ, per_channel=per_channel,
                    activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8 if weights == "s8" else QuantType.QUInt8,
                    extra_options={} if weights == "s8" else {"WeightSymmetric": False})
    return out


# ---------------------------------------------------------------- integer operators


def _integers(rng, dtype, shape):
    lo, hi = (-128, 128) if dtype == np.int8 else (0, 256)
    return rng.integers(lo, hi, shape).astype(dtype)


def _model(node, inputs, output_type, inits, opset=13):
    g = helper.make_graph([node], node.op_type.lower(),
                          [helper.make_tensor_value_info(n, TensorProto.UINT8, s) for n, s in inputs],
                          [helper.make_tensor_value_info("y", output_type, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def qlinear_conv(weights=np.int8, w_zero=None, cin=16, cout=24, size=8, stride=1, seed=0):
    """A 3x3 QLinearConv (padding 1) of a u8 image with 8-bit weights: per-channel weight scales,
    ``w_zero`` the weights' zero point (a scalar or one per output channel; None: 0, or 128 for
    u8), an i32 bias; (model, feeds)."""
    rng = np.random.default_rng(seed)
    zw = w_zero if w_zero is not None else (0 if weights == np.int8 else 128)
    inits = [numpy_helper.from_array(np.float32(0.02), "sx"),
             numpy_helper.from_array(np.uint8(131), "zx"),
             numpy_helper.from_array(_integers(rng, weights, (cout, cin, 3, 3)), "w"),
             numpy_helper.from_array((rng.uniform(0.5, 2, cout) * 2e-3).astype(np.float32), "sw"),
             numpy_helper.from_array(np.asarray(zw, dtype=weights), "zw"),
             numpy_helper.from_array(np.float32(0.05), "sy"),
             numpy_helper.from_array(np.uint8(120), "zy"),
             numpy_helper.from_array(rng.integers(-5000, 5000, cout).astype(np.int32), "b")]
    node = helper.make_node("QLinearConv", ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy", "b"],
                            ["y"], pads=[1] * 4, strides=[stride] * 2)
    shape = [1, cin, size, size]
    return _model(node, [("x", shape)], TensorProto.UINT8, inits), \
        {"x": rng.integers(0, 256, shape).astype(np.uint8)}


def qlinear_matmul(weights=np.int8, w_zero=0, m=8, k=64, n=40, seed=0):
    """QLinearMatMul of a u8 [m, k] by 8-bit [k, n] weights (per-tensor parameters)."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(np.float32(0.02), "sx"),
             numpy_helper.from_array(np.uint8(131), "zx"),
             numpy_helper.from_array(_integers(rng, weights, (k, n)), "w"),
             numpy_helper.from_array(np.float32(2e-3), "sw"),
             numpy_helper.from_array(np.asarray(w_zero, dtype=weights), "zw"),
             numpy_helper.from_array(np.float32(0.3), "sy"),
             numpy_helper.from_array(np.uint8(120), "zy")]
    node = helper.make_node("QLinearMatMul", ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy"], ["y"])
    return _model(node, [("x", [m, k])], TensorProto.UINT8, inits), \
        {"x": rng.integers(0, 256, (m, k)).astype(np.uint8)}


def matmul_integer(weights=np.uint8, w_zero=None, m=8, k=64, n=40, seed=0):
    """MatMulInteger of a u8 [m, k] (zero point 131) by 8-bit [k, n] weights, i32 out."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(_integers(rng, weights, (k, n)), "w"),
             numpy_helper.from_array(np.uint8(131), "zx")]
    if w_zero is not None:
        inits.append(numpy_helper.from_array(np.asarray(w_zero, dtype=weights), "zw"))
    node = helper.make_node("MatMulInteger", ["x", "w", "zx"] + (["zw"] if w_zero is not None
                                                                 else []), ["y"])
    return _model(node, [("x", [m, k])], TensorProto.INT32, inits), \
        {"x": rng.integers(0, 256, (m, k)).astype(np.uint8)}


def conv_integer(weights=np.uint8, w_zero=None, cin=16, cout=24, size=8, seed=0):
    """A 3x3 ConvInteger (padding 1) of a u8 image (zero point 131) by 8-bit weights, i32 out."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(_integers(rng, weights, (cout, cin, 3, 3)), "w"),
             numpy_helper.from_array(np.uint8(131), "zx")]
    if w_zero is not None:
        inits.append(numpy_helper.from_array(np.asarray(w_zero, dtype=weights), "zw"))
    node = helper.make_node("ConvInteger", ["x", "w", "zx"] + (["zw"] if w_zero is not None
                                                               else []), ["y"], pads=[1] * 4)
    shape = [1, cin, size, size]
    return _model(node, [("x", shape)], TensorProto.INT32, inits), \
        {"x": rng.integers(0, 256, shape).astype(np.uint8)}
