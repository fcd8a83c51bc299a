"""The convolutional capsule primitive, built two ways with onnx.helper (issue 5's benchmark).

    V[n, x, y, co, i, j] = sum over kx, ky, ci, k of P[n, 2x+kx, 2y+ky, ci, i, k] * W[kx, ky, ci, co, k, j]

4x4 pose matrices, a 3x3 kernel at stride 2, no padding. Both models take the poses ``P``
(``[batch, size, size, caps, 4, 4]``, an input) and hold the same seeded random ``W``
(``[3, 3, caps, caps, 4, 4]``, an initializer), and give ``V`` as ``[batch, X, X, caps, 4, 4]``
with ``X = (size - 3) // 2 + 1``:

* ``einsum_model``: the direct form. ONNX has no strided index in Einsum, so the patches are
  two Gathers with a constant index table ``2*x + kx`` and the math is one Einsum node.
* ``framework_model``: what torch's unfold/im2col exports (opset 17): the same two Gathers,
  Transpose and Reshape to patches ``[B, 9*caps, 1, 4, 4]`` (``B = batch*X*X``), W reshaped
  to ``[9*caps, caps, 4, 4]``, a broadcasting batched MatMul giving the votes
  ``[B, 9*caps, caps, 4, 4]``, ReduceSum over axis 1, and a Reshape back.

A benchmark reuses this module; nothing here depends on mlpack.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
KERNEL, STRIDE, POSE = 3, 2, 4


def out_size(size: int) -> int:
    return (size - KERNEL) // STRIDE + 1


def weights(caps: int = 32, seed: int = 0) -> np.ndarray:
    """W[kx, ky, ci, co, k, j], scaled so each vote sum stays O(1)."""
    rng = np.random.default_rng(seed)
    fan_in = KERNEL * KERNEL * caps * POSE
    return (rng.standard_normal((KERNEL, KERNEL, caps, caps, POSE, POSE))
            / np.sqrt(fan_in)).astype(np.float32)


def poses(batch: int = 8, size: int = 16, caps: int = 32, seed: int = 1) -> np.ndarray:
    """A seeded input P[n, h, w, ci, i, k]."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((batch, size, size, caps, POSE, POSE)).astype(np.float32)


def patch_index(size: int) -> np.ndarray:
    """[x, kx] -> the input row (or column) a window position reads."""
    return STRIDE * np.arange(out_size(size))[:, None] + np.arange(KERNEL)[None, :]


def patches(p: np.ndarray) -> np.ndarray:
    """P cut into its windows: [n, x, kx, y, ky, ci, i, k]."""
    idx = patch_index(p.shape[1])
    return p[:, idx][:, :, :, idx]


def reference(p: np.ndarray, w: np.ndarray) -> np.ndarray:
    """V computed with NumPy (the definition above)."""
    return np.einsum("nxaybcik,abcokj->nxyoij", patches(p), w)


def _patch_nodes(size: int):
    """The two Gathers that cut P into patches, and their index table (an initializer)."""
    inits = [numpy_helper.from_array(patch_index(size).astype(np.int64), "patch_index")]
    nodes = [
        # [n, h, w, ci, i, k] -> [n, x, kx, w, ci, i, k] -> [n, x, kx, y, ky, ci, i, k]
        helper.make_node("Gather", ["P", "patch_index"], ["rows"], axis=1),
        helper.make_node("Gather", ["rows", "patch_index"], ["patches"], axis=3),
    ]
    return nodes, inits


def _model(name, nodes, inits, batch, size, caps) -> onnx.ModelProto:
    x = out_size(size)
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info("P", TensorProto.FLOAT, [batch, size, size, caps, POSE, POSE])],
        [helper.make_tensor_value_info("V", TensorProto.FLOAT, [batch, x, x, caps, POSE, POSE])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def einsum_model(batch: int = 8, size: int = 16, caps: int = 32) -> onnx.ModelProto:
    nodes, inits = _patch_nodes(size)
    inits.append(numpy_helper.from_array(weights(caps), "W"))
    nodes.append(helper.make_node("Einsum", ["patches", "W"], ["V"],
                                  equation="nxaybcik,abcokj->nxyoij"))
    return _model("capsule_einsum", nodes, inits, batch, size, caps)


def framework_model(batch: int = 8, size: int = 16, caps: int = 32) -> onnx.ModelProto:
    x = out_size(size)
    kk = KERNEL * KERNEL * caps
    nodes, inits = _patch_nodes(size)
    inits += [
        numpy_helper.from_array(weights(caps), "W"),
        numpy_helper.from_array(np.array([-1, kk, 1, POSE, POSE], np.int64), "patch_shape"),
        numpy_helper.from_array(np.array([kk, caps, POSE, POSE], np.int64), "w_shape"),
        numpy_helper.from_array(np.array([1], np.int64), "sum_axes"),
        numpy_helper.from_array(np.array([batch, x, x, caps, POSE, POSE], np.int64), "out_shape"),
    ]
    nodes += [
        # -> [n, x, y, kx, ky, ci, i, k], then rows of B = n*x*y patches of 9*caps matrices
        helper.make_node("Transpose", ["patches"], ["patches_t"], perm=[0, 1, 3, 2, 4, 5, 6, 7]),
        helper.make_node("Reshape", ["patches_t", "patch_shape"], ["patch_rows"]),
        helper.make_node("Reshape", ["W", "w_shape"], ["w_rows"]),
        # [B, 9c, 1, 4, 4] @ [9c, c, 4, 4] broadcasts to the votes [B, 9c, c, 4, 4]
        helper.make_node("MatMul", ["patch_rows", "w_rows"], ["votes"]),
        helper.make_node("ReduceSum", ["votes", "sum_axes"], ["summed"], keepdims=0),
        helper.make_node("Reshape", ["summed", "out_shape"], ["V"]),
    ]
    return _model("capsule_framework", nodes, inits, batch, size, caps)
