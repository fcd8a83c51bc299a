"""A small convolutional network quantized by ONNX Runtime's ``quantize_static`` (QDQ format), as
users quantize models: per-channel s8 weights, u8 activations, calibrated on seeded inputs.

    path = qdq_convnet(folder)        # folder/convnet_qdq.onnx (and the float model beside it)

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


def qdq_convnet(folder: str) -> str:
    """``convnet`` quantized by ``quantize_static`` (QDQ, per channel, u8 activations, s8
    weights) on 8 seeded inputs; the path of the quantized model."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    out = os.path.join(folder, "convnet_qdq.onnx")
    quantize_static(convnet(os.path.join(folder, "convnet.onnx")), out, _Reader(feeds(8, 1)),
                    quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return out
