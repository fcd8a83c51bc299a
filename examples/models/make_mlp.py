"""Write ``mlp.onnx`` next to this file: a tiny two-layer perceptron with a dynamic batch.

    x: f32[batch, 16] -> Gemm(16x32) -> Relu -> Gemm(32x4) -> y: f32[batch, 4]

Weights are seeded, so the file is the same on every run (about 3 KB).
"""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def make_mlp(seed: int = 0, sizes=(16, 32, 4)) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    d_in, d_hidden, d_out = sizes
    inits = [
        numpy_helper.from_array((rng.standard_normal((d_in, d_hidden)) * np.sqrt(2 / d_in))
                                .astype(np.float32), "fc1.weight"),
        numpy_helper.from_array((rng.standard_normal(d_hidden) * 0.1).astype(np.float32), "fc1.bias"),
        numpy_helper.from_array((rng.standard_normal((d_hidden, d_out)) * np.sqrt(2 / d_hidden))
                                .astype(np.float32), "fc2.weight"),
        numpy_helper.from_array((rng.standard_normal(d_out) * 0.1).astype(np.float32), "fc2.bias"),
    ]
    nodes = [
        helper.make_node("Gemm", ["x", "fc1.weight", "fc1.bias"], ["h"], name="fc1"),
        helper.make_node("Relu", ["h"], ["h_relu"], name="relu1"),
        helper.make_node("Gemm", ["h_relu", "fc2.weight", "fc2.bias"], ["y"], name="fc2"),
    ]
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", d_in])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", d_out])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="mlpack-examples")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


if __name__ == "__main__":
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mlp.onnx")
    onnx.save(make_mlp(), path)
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")
