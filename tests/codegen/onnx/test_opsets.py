"""Models at every opset from 7 to the newest the onnx wheel knows import and compute correctly.

One small CNN-with-a-head model is written at opset 7 and converted up with onnx's version
converter, so each opset's spelling of the same ops (attributes that became inputs, Softmax's
changed axis rule, Reshape, Unsqueeze, Clip, Pad) goes through the importer. Outputs are
compared with a NumPy computation of the same math.
"""

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, version_converter

import mlpack.backend as backend
from mlpack.codegen.onnx.importer import MAX_OPSET

RNG = np.random.default_rng(0)
W = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3
B = RNG.standard_normal(4).astype(np.float32)
FC = RNG.standard_normal((4 * 4 * 4, 5)).astype(np.float32) * 0.2


def _model_at_opset_7() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["c"], ["r"], min=0.0, max=6.0),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Pad", ["p"], ["pp"], pads=[0, 0, 0, 0, 0, 0, 0, 0], mode="constant"),
        helper.make_node("Reshape", ["pp", "shape"], ["f"]),
        helper.make_node("MatMul", ["f", "fc"], ["m"]),
        helper.make_node("Unsqueeze", ["m"], ["u"], axes=[0]),
        helper.make_node("Squeeze", ["u"], ["s"], axes=[0]),
        helper.make_node("Softmax", ["s"], ["y"], axis=1),
    ]
    graph = helper.make_graph(
        nodes, "opsets",
        [helper.make_tensor_value_info("x", T.FLOAT, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("y", T.FLOAT, None)],
        [helper.make_tensor("w", T.FLOAT, W.shape, W.ravel()),
         helper.make_tensor("b", T.FLOAT, B.shape, B),
         helper.make_tensor("shape", T.INT64, [2], [-1, 64]),
         helper.make_tensor("fc", T.FLOAT, FC.shape, FC.ravel())])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 7)])


def _reference(x: np.ndarray) -> np.ndarray:
    n = x.shape[0]
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    cols = np.stack([xp[:, :, i:i + 8, j:j + 8] for i in range(3) for j in range(3)], axis=2)
    c = np.einsum("nckhw,ock->nohw", cols, W.reshape(4, 3, 9)) + B[None, :, None, None]
    r = np.clip(c, 0, 6)
    p = r.reshape(n, 4, 4, 2, 4, 2).max(axis=(3, 5))
    m = p.reshape(n, 64) @ FC
    e = np.exp(m - m.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("opset", range(7, MAX_OPSET + 1))
def test_model_imports_and_matches_at_opset(opset):
    model = version_converter.convert_version(_model_at_opset_7(), opset)
    assert model.opset_import[0].version == opset
    rep = backend.prepare(model)
    for batch in (1, 3):
        x = RNG.standard_normal((batch, 3, 8, 8)).astype(np.float32)
        (y,) = rep.run([x])
        np.testing.assert_allclose(y, _reference(x), rtol=1e-4, atol=1e-6)
