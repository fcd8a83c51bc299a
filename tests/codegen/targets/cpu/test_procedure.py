"""Procedures on the cpu target (codegen/targets/cpu/procedure.py), run natively in libmlpack.

Each model compiles through ``mlpack.backend`` in native mode (no fallback) and is compared
with ONNX Runtime: TopK, NonZero, Unique, NonMaxSuppression, Compress, ScatterElements with a
reduction, a data-dependent output feeding further ops, and symbolic input dims, so sizes are
only known at run time (computed symbols, plan ABI 1.1, spec/SPEC.md section 7).
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper

from mlpack import backend
from mlpack.codegen.compile import compile_onnx
from mlpack.codegen.targets.cpu import compile_cpu
from mlpack.runtime import native

ort = pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.skipif(not native.available(), reason="libmlpack is not built")

F, I64 = TP.FLOAT, TP.INT64


def make(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "proc", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                          [helper.make_tensor_value_info(n, t, None) for n, t in outputs], list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def check(model, *feeds_list, rtol=1e-5, atol=1e-6):
    """Every feed through one native rep (compiled once) equals ONNX Runtime, shape included."""
    rep = backend.prepare(model, mode="native")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in model.graph.output]
    for feeds in feeds_list:
        got = rep.run(feeds)
        want = sess.run(None, feeds)
        for name, g, w in zip(names, got, want):
            assert g.shape == w.shape and g.dtype == w.dtype, (name, g.shape, w.shape, g.dtype, w.dtype)
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=name)
    return rep


RNG = np.random.default_rng(0)


def test_topk_with_a_dynamic_batch():
    k = helper.make_tensor("k", I64, [1], [3])
    m = make([helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1, largest=1)],
             [("x", F, ["batch", 7])], [("v", F), ("i", I64)], [k])
    ties = np.array([[1, 3, 3, 0, 3, 2, -1]], np.float32)
    check(m, {"x": RNG.standard_normal((4, 7)).astype(np.float32)},
          {"x": RNG.standard_normal((1, 7)).astype(np.float32)}, {"x": ties})


def test_nonzero_then_more_ops_with_a_dynamic_dim():
    # NonZero's count is computed at run time and sizes the Transpose/Cast/Mul/Add after it
    two = helper.make_tensor("two", F, [], [2.0])
    nodes = [helper.make_node("NonZero", ["x"], ["nz"]),
             helper.make_node("Transpose", ["nz"], ["t"], perm=[1, 0]),
             helper.make_node("Cast", ["t"], ["tf"], to=F),
             helper.make_node("Mul", ["tf", "two"], ["y"]),
             helper.make_node("ReduceSum", ["y"], ["s"], keepdims=0)]
    m = make(nodes, [("x", F, ["n", 5])], [("nz", I64), ("y", F), ("s", F)], [two])
    x = RNG.standard_normal((6, 5)).astype(np.float32) * (RNG.random((6, 5)) > 0.5)
    check(m, {"x": x}, {"x": np.zeros((3, 5), np.float32)}, {"x": np.ones((1, 5), np.float32)},
          {"x": np.zeros((0, 5), np.float32)})


def test_unique_sorted_with_axis_and_flat():
    nodes = [helper.make_node("Unique", ["x"], ["y", "idx", "inv", "cnt"], sorted=1, axis=0),
             helper.make_node("Unique", ["f"], ["fy", "fidx", "finv", "fcnt"], sorted=0)]
    m = make(nodes, [("x", F, ["n", 3]), ("f", F, ["m"])],
             [("y", F), ("idx", I64), ("inv", I64), ("cnt", I64), ("fy", F), ("fidx", I64),
              ("finv", I64), ("fcnt", I64)], opset=11)
    x = np.array([[1, 0, 2], [0, 1, 1], [1, 0, 2], [0, 1, 0], [0, 1, 1]], np.float32)
    f = np.array([2, 1, 1, 3, 4, 3, 2], np.float32)
    check(m, {"x": x, "f": f}, {"x": x[:2], "f": f[:1]})


def test_non_max_suppression():
    nodes = [helper.make_node("NonMaxSuppression", ["boxes", "scores", "maxo", "iou", "thr"], ["sel"])]
    inits = [helper.make_tensor("maxo", I64, [1], [3]), helper.make_tensor("iou", F, [1], [0.5]),
             helper.make_tensor("thr", F, [1], [0.1])]
    m = make(nodes, [("boxes", F, [2, 6, 4]), ("scores", F, [2, 2, 6])], [("sel", I64)], inits, opset=11)
    corner = RNG.random((2, 6, 2)).astype(np.float32) * 4
    boxes = np.concatenate([corner, corner + 1 + RNG.random((2, 6, 2)).astype(np.float32)], axis=2)
    check(m, {"boxes": boxes, "scores": RNG.random((2, 2, 6)).astype(np.float32)},
          {"boxes": boxes, "scores": np.zeros((2, 2, 6), np.float32)})


def test_compress_on_an_axis_then_relu():
    nodes = [helper.make_node("Compress", ["x", "c"], ["y"], axis=1),
             helper.make_node("Relu", ["y"], ["r"])]
    m = make(nodes, [("x", F, [3, "w"]), ("c", TP.BOOL, ["w"])], [("y", F), ("r", F)], opset=11)
    x = RNG.standard_normal((3, 6)).astype(np.float32)
    check(m, {"x": x, "c": np.array([1, 0, 1, 1, 0, 0], bool)},
          {"x": x[:, :2], "c": np.array([0, 0], bool)})


def test_scatter_elements_with_reduction():
    nodes = [helper.make_node("ScatterElements", ["d", "i", "u"], ["y"], axis=1, reduction="add"),
             helper.make_node("ScatterElements", ["d", "i", "u"], ["z"], axis=1, reduction="max")]
    m = make(nodes, [("d", F, [3, 5]), ("i", I64, [3, 4]), ("u", F, [3, 4])], [("y", F), ("z", F)],
             opset=18)
    idx = np.array([[0, 4, 0, 2], [1, 1, 1, -1], [3, 2, 3, 0]], np.int64)
    check(m, {"d": RNG.standard_normal((3, 5)).astype(np.float32), "i": idx,
              "u": RNG.standard_normal((3, 4)).astype(np.float32)})


def test_plan_declares_computed_symbols_and_output_shapes():
    m = make([helper.make_node("NonZero", ["x"], ["y"])], [("x", F, ["n", 4])], [("y", I64)])
    plan = compile_cpu(compile_onnx(m), "x86_64-v2").plan
    assert plan["abi"] == 1 and plan["abi_minor"] == 1
    (sym,) = [s for s in plan["symbols"] if s != "n"]
    computed = [s for s in plan["symbol_sources"] if "dispatch" in s]
    assert computed == [{"symbol": sym, "dispatch": 0, "bound": ["mul", 4, "$n"]}]
    assert plan["dispatches"][0]["workgroups"] == 1
    out = next(b for b in plan["buffers"] if b["kind"] == "output")
    assert out["shape"] == [2, "$" + sym]
    # the arena holds the trimmed-later result at its bound: 2 x (4 n) i64, no computed symbol
    assert sym not in str(plan["arena_size"])


def test_plans_without_procedures_stay_abi_1_0():
    m = make([helper.make_node("Relu", ["x"], ["y"])], [("x", F, ["n", 4])], [("y", F)])
    plan = compile_cpu(compile_onnx(m), "x86_64-v2").plan
    assert "abi_minor" not in plan and all("dispatch" not in s for s in plan["symbol_sources"])
