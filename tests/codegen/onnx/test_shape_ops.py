"""Shape and data-movement ops through mlpack, compared with onnxruntime.

Small models built with onnx.helper run through ``mlpack.backend`` and onnxruntime on the same
random inputs. Movement ops do no arithmetic, so results must match to fp32 rtol 1e-4 /
atol 1e-5 (in practice exactly); integer outputs exactly. Also checks that shape arithmetic on
a symbolic (dim_param) batch dim imports with symbolic sizes and that views make no copies.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.graph import Comprehension
from mlpack.codegen.onnx.importer import import_model
import support

RNG = np.random.default_rng(0)
F, I64, B = TP.FLOAT, TP.INT64, TP.BOOL


def graph_model(nodes, inputs, outputs, inits=(), opset=18):
    graph = helper.make_graph(nodes, "t", [helper.make_tensor_value_info(*i) for i in inputs],
                              [helper.make_tensor_value_info(*o) for o in outputs], list(inits))
    # IR version 8: what this onnxruntime accepts (the helper default may be newer)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def model(op, inputs, attrs=None, inits=(), opset=18, n_out=1, in_names=None, out=F):
    """One ``op`` node over graph inputs (name, type, shape) then initializers; ``out`` is the
    output element type (one for all outputs, or a list)."""
    names = in_names if in_names is not None else [i[0] for i in inputs] + [t.name for t in inits]
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op, names, outs, **(attrs or {}))
    types = out if isinstance(out, list) else [out] * n_out
    return graph_model([node], inputs, [(o, t, None) for o, t in zip(outs, types)], inits, opset)


def ints(name, values):
    return numpy_helper.from_array(np.asarray(values, dtype=np.int64), name)


check = support.check


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


# ---------------------------------------------------------------- symbolic shapes


def test_reshape_of_shape_arithmetic_keeps_batch_symbolic():
    # Reshape(x, Concat(Shape(x)[0:1], [-1])) with x: [batch, 3, 4]
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Slice", ["s", "zero", "one"], ["s0"]),
        helper.make_node("Concat", ["s0", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    m = graph_model(nodes, [("x", F, ["batch", 3, 4])], [("y", F, None)],
                    [ints("zero", [0]), ints("one", [1]), ints("minus1", [-1])])
    g = import_model(m)
    assert [repr(s) for s in g.types["y"].dims.values()] == ["$batch", "12"]
    for batch in (1, 5):
        check(m, {"x": rand(batch, 3, 4)})


def test_symbolic_unsqueeze_squeeze_expand_flatten():
    nodes = [
        helper.make_node("Unsqueeze", ["x", "ax"], ["u"]),                 # [b, 1, 4]
        helper.make_node("Shape", ["u"], ["s"]),
        helper.make_node("Expand", ["u", "e"], ["ex"]),                   # [b, 3, 4]
        helper.make_node("Transpose", ["ex"], ["t"], perm=[2, 0, 1]),     # [4, b, 3]
        helper.make_node("Flatten", ["t"], ["f"], axis=2),                # [4b, 3]
        helper.make_node("Size", ["f"], ["n"]),
        helper.make_node("Squeeze", ["u", "ax"], ["sq"]),                 # [b, 4]
    ]
    m = graph_model(nodes, [("x", F, ["b", 4])],
                    [("f", F, None), ("n", I64, None), ("sq", F, None), ("s", I64, None)],
                    [ints("ax", [1]), ints("e", [1, 3, 1])])
    g = import_model(m)
    assert [repr(s) for s in g.types["f"].dims.values()] == ["4 * $b", "3"]
    check(m, {"x": rand(2, 4)})


def test_views_make_no_copies():
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),
             helper.make_node("Reshape", ["t", "s"], ["r"]),
             helper.make_node("Slice", ["r", "st", "en"], ["sl"]),
             helper.make_node("Relu", ["sl"], ["y"])]
    m = graph_model(nodes, [("x", F, [4, 6])], [("y", F, None)],
                    [ints("s", [3, 8]), ints("st", [1]), ints("en", [3])])
    g = import_model(m)
    assert len([o for o in g.ops if isinstance(o, Comprehension)]) == 1
    check(m, {"x": rand(4, 6)})


# ---------------------------------------------------------------- reshape family


@pytest.mark.parametrize("target,allowzero", [([0, -1], 0), ([2, 0, 2, -1], 0), ([-1], 0),
                                              ([6, 0, 0], 1)])
def test_reshape(target, allowzero):
    x = rand(2, 3, 4) if not allowzero else rand(6, 0, 2)
    if allowzero:
        target = [6, 2, 0]
    m = model("Reshape", [("x", F, x.shape)], {"allowzero": allowzero}, [ints("s", target)])
    check(m, {"x": x})


def test_reshape_shape_given_at_run_time():
    x = rand(2, 6)
    m = model("Reshape", [("x", F, x.shape), ("s", I64, [3])])
    check(m, {"x": x, "s": np.array([3, 2, 2], np.int64)})


def test_shape_start_end():
    x = rand(2, 3, 4, 5)
    m = model("Shape", [("x", F, x.shape)], {"start": 1, "end": -1}, out=I64)
    check(m, {"x": x})


def test_squeeze_unsqueeze_opset11_attributes():
    nodes = [helper.make_node("Unsqueeze", ["x"], ["u"], axes=[0, 3]),
             helper.make_node("Squeeze", ["u"], ["y"], axes=[0])]
    m = graph_model(nodes, [("x", F, [2, 3])], [("y", F, None)], opset=11)
    check(m, {"x": rand(2, 3)})


# ---------------------------------------------------------------- movement


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat_with_empty_input(axis):
    a, c = rand(2, 3), rand(2, 3)
    e = np.zeros((2, 0) if axis else (0, 3), np.float32)
    m = model("Concat", [("a", F, a.shape), ("e", F, e.shape), ("c", F, c.shape)], {"axis": axis})
    check(m, {"a": a, "e": e, "c": c})


@pytest.mark.parametrize("starts,ends,axes,steps", [
    ([1, 0], [3, 10], [0, 1], [1, 2]),
    ([-1], [-100], [1], [-1]),
    ([10], [0], [0], [-2]),
    ([0, 1], [2**63 - 1, -1], [-1, 0], [3, 1]),
])
def test_slice(starts, ends, axes, steps):
    x = rand(4, 7)
    inits = [ints("s", starts), ints("e", ends), ints("a", axes), ints("st", steps)]
    check(model("Slice", [("x", F, x.shape)], inits=inits), {"x": x})


def test_split_num_outputs_and_sizes():
    x = rand(7, 3)
    check(model("Split", [("x", F, x.shape)], {"num_outputs": 3}, n_out=3), {"x": x})
    m = model("Split", [("x", F, x.shape)], {"axis": 0}, [ints("sp", [2, 0, 5])], n_out=3)
    check(m, {"x": x})


def test_tile_and_transpose():
    x = rand(2, 3, 4)
    check(model("Tile", [("x", F, x.shape)], inits=[ints("r", [2, 1, 3])]), {"x": x})
    check(model("Transpose", [("x", F, x.shape)], {"perm": [1, 2, 0]}), {"x": x})


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad(mode):
    x = rand(3, 4)
    pads = [1, 2, 2, 1] if mode != "constant" else [1, -1, 0, 3]
    inits = [ints("p", pads), numpy_helper.from_array(np.array(1.5, np.float32), "v")]
    check(model("Pad", [("x", F, x.shape)], {"mode": mode}, inits), {"x": x})


def test_pad_axes_input():
    x = rand(2, 3, 4)
    inits = [ints("p", [1, 2, 0, 3])]
    m = model("Pad", [("x", F, x.shape)], {"mode": "edge"}, inits,
              in_names=["x", "p", "", "ax"])
    m.graph.initializer.append(ints("ax", [2, 0]))
    check(m, {"x": x})


def test_pad_by_constants_reads_a_tensor_and_pads_of_zero_add_nothing():
    # an exporter's Pad: pads and value from Constant nodes, over a computed tensor
    x = rand(1, 2, 4, 5)
    consts = {"p1": np.array([0, 0, 1, 0, 0, 0, 0, 2], np.int64),
              "p0": np.zeros(8, np.int64), "v": np.array(0.5, np.float32)}
    nodes = [helper.make_node("Constant", [], [k], value=numpy_helper.from_array(a, k))
             for k, a in consts.items()]
    nodes += [helper.make_node("Relu", ["x"], ["r"]),
              helper.make_node("Pad", ["r", "p1", "v"], ["y0"]),
              helper.make_node("Pad", ["x", "p0", "v"], ["z"]),
              helper.make_node("Exp", ["z"], ["y1"])]
    m = graph_model(nodes, [("x", F, x.shape)], [("y0", F, None), ("y1", F, None)])
    check(m, {"x": x})
    g = import_model(m)
    y0 = next(op for op in g.ops if op.out == "y0")
    # one read of the Relu's tensor that pads by 0.5 itself: no select, no clamped index
    reads = ex.reads(y0.body)
    assert len(reads) == 1 and reads[0].arg[2] == 0.5, y0.body
    assert not {e.op for e in ex.walk(y0.body)} & {"select", "min", "max"}, y0.body
    y1 = next(op for op in g.ops if op.out == "y1")
    assert [e.arg[0] for e in ex.reads(y1.body)] == ["x"]   # the zero Pad is x itself


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_space_round_trip(mode):
    x = rand(1, 8, 2, 3)
    check(model("DepthToSpace", [("x", F, x.shape)], {"blocksize": 2, "mode": mode}), {"x": x})
    y = rand(1, 2, 4, 6)
    check(model("SpaceToDepth", [("x", F, y.shape)], {"blocksize": 2}), {"x": y})


# ---------------------------------------------------------------- generators and selects


def test_constant_of_shape_range_eyelike():
    m = model("ConstantOfShape", [], {"value": numpy_helper.from_array(np.array([7], np.int32))},
              [ints("s", [2, 3])], out=TP.INT32)
    check(m, {})
    r = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in
         (("a", 1.0), ("l", 4.0), ("d", 0.7))]
    check(model("Range", [], inits=r), {})
    check(model("EyeLike", [("x", F, [3, 5])], {"k": -1}), {"x": rand(3, 5)})


@pytest.mark.parametrize("upper", [0, 1])
def test_trilu_with_run_time_k(upper):
    x = rand(2, 4, 5)
    m = model("Trilu", [("x", F, x.shape), ("k", I64, [])], {"upper": upper})
    check(m, {"x": x, "k": np.array(-1, np.int64)})


def test_where_broadcast_and_dropout():
    c = RNG.random((3, 1)) > 0.5
    x, y = rand(1, 4), rand(3, 4)
    check(model("Where", [("c", B, c.shape), ("x", F, x.shape), ("y", F, y.shape)]),
          {"c": c, "x": x, "y": y})
    check(model("Dropout", [("x", F, [3, 4])], n_out=2, out=[F, B]), {"x": y})
