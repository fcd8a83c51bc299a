"""Indexing, scatter and procedural ops through mlpack, compared with onnxruntime.

Each test builds a small one-node model, runs it through ``mlpack.backend`` and through
onnxruntime on the same random inputs. Index and integer outputs must match exactly; float
outputs within rtol=1e-6 / atol=1e-6 (these ops move values, they do no arithmetic, except
the reductions of the scatters: rtol=1e-5).
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from mlpack.codegen.compile import compile_onnx
from mlpack.spec.ir.parser import parse_graph
from mlpack.spec.ir.printer import format_graph
import functools
import support

RNG = np.random.default_rng(0)
F, I64, B = TP.FLOAT, TP.INT64, TP.BOOL


def model(op, inputs, outputs, attrs=None, inits=(), opset=18, in_names=None):
    """One ``op`` node; inputs/outputs are (name, elem_type, shape) triples."""
    names = in_names if in_names is not None else [i[0] for i in inputs] + [t.name for t in inits]
    node = helper.make_node(op, names, [o[0] for o in outputs], **(attrs or {}))
    graph = helper.make_graph([node], "t", [helper.make_tensor_value_info(*i) for i in inputs],
                              [helper.make_tensor_value_info(*o) for o in outputs], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)


check = functools.partial(support.check, rtol=1e-6, atol=1e-6)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


# ---------------------------------------------------------------- gathers


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_negative_indices(axis):
    x = rand(3, 4, 5)
    n = x.shape[axis]
    idx = RNG.integers(-n, n, size=(2, 3)).astype(np.int64)
    m = model("Gather", [("x", F, x.shape), ("i", I64, idx.shape)], [("y", F, None)], {"axis": axis})
    check(m, {"x": x, "i": idx})


def test_gather_elements_and_nd():
    x = rand(3, 4)
    idx = RNG.integers(-3, 3, size=(5, 4)).astype(np.int64)
    m = model("GatherElements", [("x", F, x.shape), ("i", I64, idx.shape)], [("y", F, None)],
              {"axis": 0})
    check(m, {"x": x, "i": idx})
    x = rand(2, 3, 4)
    idx = np.array([[[1, 2]], [[0, -1]]], dtype=np.int64)  # batch_dims=1: [2, 1, 2]
    m = model("GatherND", [("x", F, x.shape), ("i", I64, idx.shape)], [("y", F, None)],
              {"batch_dims": 1})
    check(m, {"x": x, "i": idx})


def test_array_feature_extractor():
    x = rand(3, 4)
    idx = np.array([2, 3, 0], dtype=np.int64)  # onnxruntime rejects negative indices
    m = model("ArrayFeatureExtractor", [("x", F, x.shape), ("i", I64, idx.shape)], [("y", F, None)])
    m.opset_import.append(helper.make_opsetid("ai.onnx.ml", 3))
    m.graph.node[0].domain = "ai.onnx.ml"
    check(m, {"x": x, "i": idx})


def test_one_hot_with_constant_depth():
    idx = np.array([[0, 3, -1], [9, 2, -4]], dtype=np.int64)  # 9: out of range, all off
    inits = [numpy_helper.from_array(np.array(5, dtype=np.int64), "depth"),
             numpy_helper.from_array(np.array([-1.0, 2.0], dtype=np.float32), "values")]
    m = model("OneHot", [("i", I64, idx.shape)], [("y", F, None)], {"axis": 1}, inits)
    check(m, {"i": idx})


def test_reverse_sequence():
    x = rand(4, 3, 2)  # time-major: [time, batch, feature]
    lens = np.array([1, 4, 2], dtype=np.int64)
    m = model("ReverseSequence", [("x", F, x.shape), ("l", I64, [3])], [("y", F, None)],
              {"batch_axis": 1, "time_axis": 0})
    check(m, {"x": x, "l": lens})


# ---------------------------------------------------------------- scatters


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_elements_duplicates(reduction):
    x = rand(4, 5)
    idx = np.array([[0, 1, -1], [0, 1, 3]], dtype=np.int64)  # (0, 0) and (1, 1) repeat
    if reduction == "none":
        idx = np.array([[0, 1, -1], [2, 2, 3]], dtype=np.int64)  # unique targets
    upd = rand(2, 3)
    m = model("ScatterElements", [("x", F, x.shape), ("i", I64, idx.shape), ("u", F, upd.shape)],
              [("y", F, None)], {"axis": 1, "reduction": reduction})
    check(m, {"x": x, "i": idx, "u": upd}, rtol=1e-5)


@pytest.mark.parametrize("reduction", ["none", "add", "max"])
def test_scatter_nd(reduction):
    x = rand(4, 3)
    idx = np.array([[1], [-1], [1]] if reduction != "none" else [[1], [-1], [0]], dtype=np.int64)
    upd = rand(3, 3)
    m = model("ScatterND", [("x", F, x.shape), ("i", I64, idx.shape), ("u", F, upd.shape)],
              [("y", F, None)], {"reduction": reduction})
    check(m, {"x": x, "i": idx, "u": upd}, rtol=1e-5)


@pytest.mark.parametrize("constant_data", [True, False])
def test_a_scatter_of_constants_is_folded_at_import(constant_data):
    # Swin's shifted-window masks: ScatterND into constants. Of constants, the procedure is
    # evaluated at import (the graph holds no procedure, the outputs still match ORT's); with
    # an input for its data it stays a procedure
    from mlpack.codegen.onnx.importer import import_model
    from mlpack.spec.ir.graph import Procedure

    x, idx, upd = rand(4, 3), np.array([[1], [-1]], dtype=np.int64), rand(2, 3)
    inits = [numpy_helper.from_array(idx, "i"), numpy_helper.from_array(upd, "u")]
    inputs = [("x", F, x.shape)]
    if constant_data:
        inits.insert(0, numpy_helper.from_array(x, "x"))
        inputs = []
    m = model("ScatterND", inputs, [("y", F, None)], inits=inits, in_names=["x", "i", "u"])
    feeds = {} if constant_data else {"x": x}
    procedures = [op for op in import_model(m).ops if isinstance(op, Procedure)]
    assert len(procedures) == (0 if constant_data else 1)
    check(m, feeds)


def test_a_scatter_of_constants_folds_in_order_and_names_a_bad_index():
    """The fold of a ScatterND of constants (NumPy, at import) stores the index rows in order,
    as the procedure does: a repeated row keeps the last update, a negative row counts from the
    end; a row out of range is left to the procedure, whose error names the index."""
    from mlpack.codegen.onnx.importer import import_model
    from mlpack.spec.errors import Error

    x, upd = rand(4, 3), rand(3, 3)

    def scatter(rows):
        idx = np.array(rows, dtype=np.int64)
        inits = [numpy_helper.from_array(a, n) for a, n in ((x, "x"), (idx, "i"), (upd, "u"))]
        return model("ScatterND", [], [("y", F, None)], inits=inits, in_names=["x", "i", "u"])
    g = import_model(scatter([[1], [-1], [1]]))
    want = x.copy()
    want[1], want[3] = upd[2], upd[1]
    assert not g.ops and np.array_equal(g.constants[g.outputs[0].name].data, want)
    with pytest.raises(Error, match=r"index 4 out of range"):
        import_model(scatter([[1], [4], [0]]))


@pytest.mark.parametrize("out_shape", [None, [1, 2, 5, 5]])
def test_max_unpool(out_shape):
    x = rand(1, 2, 2, 2)
    # one position per 2x2 window of the 4x4 inferred output, as MaxPool's indices would be
    win = np.array([[0, 2], [8, 10]]) + np.array([[1, 0], [4, 5]])
    idx = np.stack([win, win + 16])[None].astype(np.int64)
    inits = [] if out_shape is None else [numpy_helper.from_array(np.array(out_shape, np.int64), "os")]
    m = model("MaxUnpool", [("x", F, x.shape), ("i", I64, idx.shape)], [("y", F, None)],
              {"kernel_shape": [2, 2], "strides": [2, 2]}, inits)
    # With output_shape, onnxruntime reads the indices as offsets into output_shape; ONNX (its
    # reference and node test data) into the inferred shape, padding at the end.
    check(m, {"x": x, "i": idx}, oracle="ort" if out_shape is None else "reference")


@pytest.mark.parametrize("axis", [None, 0, 1])
def test_compress(axis):
    x = rand(3, 4)
    cond = np.array([True, False, True], dtype=bool)  # shorter than the axis when axis=1
    attrs = {} if axis is None else {"axis": axis}
    m = model("Compress", [("x", F, x.shape), ("c", B, [3])], [("y", F, None)], attrs)
    check(m, {"x": x, "c": cond})


# ---------------------------------------------------------------- procedures


def _topk_model(largest, dims=(3, 7)):
    k = numpy_helper.from_array(np.array([4], dtype=np.int64), "k")
    return model("TopK", [("x", F, list(dims))], [("v", F, None), ("i", I64, None)],
                 {"axis": 1, "largest": largest}, [k])


@pytest.mark.parametrize("largest", [0, 1])
def test_top_k_ties_by_lower_index(largest):
    x = RNG.integers(0, 3, size=(3, 7)).astype(np.float32)  # many ties
    check(_topk_model(largest), {"x": x})


def test_top_k_symbolic_rows():
    check(_topk_model(1, ("batch", 7)), {"x": rand(5, 7)})


def test_top_k_ir_round_trips():
    g = compile_onnx(_topk_model(1))
    text = format_graph(g)
    assert "proc" in text and "while" in text
    assert parse_graph(text) == g


@pytest.mark.parametrize("op,attrs", [("Unique", {"axis": 1}), ("NonZero", {}), ("Compress", {})])
def test_data_dependent_procedures_round_trip(op, attrs):
    ins = [("x", F, [3, 4])] + ([("c", B, [5])] if op == "Compress" else [])
    outs = [("y", F, None)] + ([("i", I64, None)] * 3 if op == "Unique" else [])
    outs = [(f"o{k}", t, s) for k, (_, t, s) in enumerate(outs)]
    g = compile_onnx(model(op, ins, outs, attrs))
    text = format_graph(g)
    assert "size $" in text
    assert parse_graph(text) == g


def test_non_zero():
    x = (RNG.standard_normal((3, 4)) > 0.3).astype(np.float32) * rand(3, 4)
    check(model("NonZero", [("x", F, x.shape)], [("y", I64, None)]), {"x": x})


@pytest.mark.parametrize("axis,sort", [(None, 1), (None, 0), (0, 1), (1, 1), (-1, 0)])
def test_unique(axis, sort):
    x = RNG.integers(0, 2, size=(4, 3)).astype(np.float32)
    attrs = {"sorted": sort} if axis is None else {"sorted": sort, "axis": axis}
    outs = [("y", F, None), ("ind", I64, None), ("inv", I64, None), ("cnt", I64, None)]
    check(model("Unique", [("x", F, x.shape)], outs, attrs), {"x": x})


@pytest.mark.parametrize("center", [0, 1])
def test_non_max_suppression(center):
    xy = RNG.uniform(0, 4, size=(2, 12, 2)).astype(np.float32)
    wh = RNG.uniform(0.5, 3, size=(2, 12, 2)).astype(np.float32)
    boxes = np.concatenate([xy, wh], -1) if center else np.concatenate([xy, xy + wh], -1)
    scores = RNG.uniform(0, 1, size=(2, 3, 12)).astype(np.float32)
    scores[0, 0, 5] = scores[0, 0, 2]  # a tie: the lower index goes first
    inits = [numpy_helper.from_array(np.array([4], dtype=np.int64), "maxo"),
             numpy_helper.from_array(np.array([0.3], dtype=np.float32), "iou"),
             numpy_helper.from_array(np.array([0.2], dtype=np.float32), "sthr")]
    m = model("NonMaxSuppression", [("b", F, boxes.shape), ("s", F, scores.shape)],
              [("y", I64, None)], {"center_point_box": center}, inits)
    check(m, {"b": boxes, "s": scores})
