"""One-node models whose output sizes are expressions of the input's symbols (issue 15, sizes).

Each builder returns (ModelProto, inputs(batch) -> feeds, expected output size text). Made by
hand with onnx.helper so the tests need no torch; ``vit_cls_expand`` spells what torch 2.x
exports for ViT's ``cls_token.expand(B, -1, -1)`` node for node (Shape, Gather, Unsqueeze,
Concat with -1s, Reshape, Shape, ConstantOfShape, Mul, Equal, Where, Expand).
``undecidable_expand`` is not in MODELS: its size is one the format cannot state.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT


def _model(nodes, x_shape, inits=(), name="t"):
    g = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", F, x_shape)],
                          [helper.make_tensor_value_info("y", F, None)],
                          [numpy_helper.from_array(np.asarray(a), n) for n, a in inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _feeds(*shape):
    rng = np.random.default_rng(sum(shape))
    return {"x": rng.standard_normal(shape).astype(np.float32)}


def concat_twice():
    """y = concat(x, x) along the batch: [2 * $batch, 3]."""
    m = _model([helper.make_node("Concat", ["x", "x"], ["y"], axis=0)], ["batch", 3])
    return m, lambda b: _feeds(b, 3), ["2 * $batch", 3]


def reshape_infer():
    """y = reshape(x, [-1, 3]) of x [$batch, 4, 3]: [4 * $batch, 3]."""
    m = _model([helper.make_node("Reshape", ["x", "shape"], ["y"])], ["batch", 4, 3],
               [("shape", np.array([-1, 3], np.int64))])
    return m, lambda b: _feeds(b, 4, 3), ["4 * $batch", 3]


def pad_one():
    """y = pad(x, one more column): [$batch, $seq + 1]."""
    m = _model([helper.make_node("Pad", ["x", "pads"], ["y"], mode="constant")], ["batch", "seq"],
               [("pads", np.array([0, 0, 0, 1], np.int64))])
    return m, lambda b: _feeds(b, 2 * b + 1), ["$batch", "$seq + 1"]


def vit_cls_expand():
    """torch's ``cat([cls.expand(B, -1, -1), x], 1)``: [$batch, 4, 4]."""
    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
        helper.make_node("Unsqueeze", ["b", "axes0"], ["b1"]),
        helper.make_node("Concat", ["b1", "minus1", "minus1"], ["shape3"], axis=0),
        helper.make_node("Reshape", ["shape3", "flat"], ["target"]),
        helper.make_node("Shape", ["target"], ["ts"]),
        helper.make_node("ConstantOfShape", ["ts"], ["ones"],
                         value=numpy_helper.from_array(i64(1))),
        helper.make_node("Mul", ["ones", "guard"], ["guards"]),
        helper.make_node("Equal", ["target", "guards"], ["is_guard"]),
        helper.make_node("Where", ["is_guard", "ones", "target"], ["expand_to"]),
        helper.make_node("Expand", ["cls", "expand_to"], ["cls_b"]),
        helper.make_node("Concat", ["cls_b", "x"], ["y"], axis=1),
    ]
    cls = np.linspace(-1, 1, 4, dtype=np.float32).reshape(1, 1, 4)
    inits = [("zero", np.array(0, np.int64)), ("axes0", i64(0)), ("minus1", i64(-1)),
             ("flat", i64(-1)), ("guard", np.array(-1, np.int64)), ("cls", cls)]
    m = _model(nodes, ["batch", 3, 4], inits, name="vit_cls")
    return m, lambda b: _feeds(b, 3, 4), ["$batch", 4, 4]


def undecidable_expand():
    """y = cls expanded to [1 if B == 2 else B, 1, 4]: a size no container can state, since
    nothing known of ``$batch`` decides ``B == 2`` (valid ONNX: ONNX Runtime runs it)."""
    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "axes0"], ["b1"], axis=0),
        helper.make_node("Equal", ["b1", "two"], ["is_two"]),
        helper.make_node("Where", ["is_two", "one", "b1"], ["lead"]),
        helper.make_node("Concat", ["lead", "one", "one"], ["target"], axis=0),
        helper.make_node("Expand", ["cls", "target"], ["y"]),
    ]
    cls = np.linspace(-1, 1, 4, dtype=np.float32).reshape(1, 1, 4)
    inits = [("axes0", i64(0)), ("two", i64(2)), ("one", i64(1)), ("cls", cls)]
    m = _model(nodes, ["batch", 3], inits, name="undecidable")
    return m, lambda b: _feeds(b, 3), None


MODELS = {"concat_twice": concat_twice, "reshape_infer": reshape_infer, "pad_one": pad_one,
          "vit_cls_expand": vit_cls_expand}
