"""Control flow (If, Loop, Scan) through mlpack, compared with onnxruntime.

Small models built with onnx.helper run through ``mlpack.backend`` and onnxruntime on the same
inputs (fp32 rtol 1e-4 / atol 1e-5). Covers If with a known condition (only the taken branch
is imported, so the branches may differ in shape) and a run-time one (an elementwise select),
subgraphs reading outer values and nesting, Scan (opset 8 and 9+ with axes and directions) and
Loop unrolled over static trip counts (early exit, trip count given as an input), and the clear
errors for what cannot be unrolled.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from mlpack import backend
from mlpack.codegen.errors import UnsupportedOpError
import support

RNG = np.random.default_rng(0)
F, I64, B = TP.FLOAT, TP.INT64, TP.BOOL


def vi(name, ty, shape):
    return helper.make_tensor_value_info(name, ty, shape)


def graph(nodes, inputs, outputs, inits=(), name="g"):
    return helper.make_graph(nodes, name, [vi(*i) for i in inputs], [vi(*o) for o in outputs],
                             list(inits))


def model(nodes, inputs, outputs, inits=(), opset=18):
    g = graph(nodes, inputs, outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


check = support.check


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def const(name, data):
    return numpy_helper.from_array(np.asarray(data), name)


# ---------------------------------------------------------------- If


def _branches(then_nodes, then_out, else_nodes, else_out):
    return {"then_branch": graph(then_nodes, [], [then_out], name="then"),
            "else_branch": graph(else_nodes, [], [else_out], name="else")}


def test_if_runtime_condition_selects_elementwise():
    # both branches read the outer value x; the condition is a graph input
    br = _branches([helper.make_node("Add", ["x", "x"], ["t"])], ("t", F, [2, 3]),
                   [helper.make_node("Neg", ["x"], ["e"])], ("e", F, [2, 3]))
    m = model([helper.make_node("If", ["c"], ["y"], **br)], [("c", B, []), ("x", F, [2, 3])],
              [("y", F, [2, 3])])
    x = rand(2, 3)
    for c in (True, False):
        check(m, {"c": np.array(c), "x": x})


def test_if_condition_computed_from_data():
    br = _branches([helper.make_node("Exp", ["x"], ["t"])], ("t", F, [4]),
                   [helper.make_node("Abs", ["x"], ["e"])], ("e", F, [4]))
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], **br)]
    m = model(nodes, [("x", F, [4])], [("y", F, [4])], [const("zero", np.float32(0))])
    check(m, {"x": rand(4)})
    check(m, {"x": -np.abs(rand(4))})


def test_if_known_condition_imports_taken_branch_only():
    # the branches differ in shape: fine when the condition is a constant
    br = _branches([helper.make_node("Identity", ["a"], ["t"])], ("t", F, [3]),
                   [helper.make_node("Identity", ["b"], ["e"])], ("e", F, [2, 2]))
    for c in (True, False):
        m = model([helper.make_node("If", ["c"], ["y"], **br)], [("a", F, [3]), ("b", F, [2, 2])],
                  [("y", F, None)], [const("c", np.array(c))])
        check(m, {"a": rand(3), "b": rand(2, 2)})


def test_if_runtime_condition_with_different_shapes_fails_clearly():
    br = _branches([helper.make_node("Identity", ["a"], ["t"])], ("t", F, [3]),
                   [helper.make_node("Identity", ["b"], ["e"])], ("e", F, [2, 2]))
    nodes = [helper.make_node("ReduceSum", ["a"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], **br)]
    m = model(nodes, [("a", F, [3]), ("b", F, [2, 2])], [("y", F, None)],
              [const("zero", np.float32(0))])
    with pytest.raises(UnsupportedOpError, match="branches give"):
        backend.prepare(m).run({"a": rand(3), "b": rand(2, 2)})


def test_nested_if_sees_enclosing_scopes():
    inner = _branches([helper.make_node("Mul", ["x", "h"], ["it"])], ("it", F, [3]),
                      [helper.make_node("Sub", ["x", "h"], ["ie"])], ("ie", F, [3]))
    then_nodes = [helper.make_node("Add", ["x", "x"], ["h"]),
                  helper.make_node("If", ["c2"], ["t"], **inner)]
    br = _branches(then_nodes, ("t", F, [3]), [helper.make_node("Neg", ["x"], ["e"])], ("e", F, [3]))
    m = model([helper.make_node("If", ["c1"], ["y"], **br)],
              [("c1", B, []), ("c2", B, []), ("x", F, [3])], [("y", F, [3])])
    x = rand(3)
    for c1 in (True, False):
        for c2 in (True, False):
            check(m, {"c1": np.array(c1), "c2": np.array(c2), "x": x})


def test_if_with_sequence_branch_fails_clearly():
    seq = helper.make_tensor_sequence_value_info("t", F, [3])
    then_g = helper.make_graph([helper.make_node("SequenceConstruct", ["a"], ["t"])], "then", [], [seq])
    else_g = helper.make_graph([helper.make_node("SequenceConstruct", ["a"], ["e"])], "else", [],
                               [helper.make_tensor_sequence_value_info("e", F, [3])])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)
    g = helper.make_graph([node], "g", [vi("c", B, []), vi("a", F, [3])],
                          [helper.make_tensor_sequence_value_info("y", F, [3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    with pytest.raises(UnsupportedOpError, match="sequence type"):
        backend.prepare(m).run({"c": np.array(True), "a": rand(3)})


# ---------------------------------------------------------------- Scan


def _scan_body():
    """state (2,) accumulates x_t * w (w from the outer scope); emits state and x_t + 1."""
    nodes = [helper.make_node("Mul", ["x_t", "w"], ["p"]),
             helper.make_node("Add", ["s_in", "p"], ["s_out"]),
             helper.make_node("Identity", ["s_out"], ["y1"]),
             helper.make_node("Add", ["x_t", "one"], ["y2"])]
    return graph(nodes, [("s_in", F, [2]), ("x_t", F, [2])],
                 [("s_out", F, [2]), ("y1", F, [2]), ("y2", F, [2])], name="body")


def test_scan9_forward():
    node = helper.make_node("Scan", ["s0", "x"], ["s", "ys", "zs"], body=_scan_body(),
                            num_scan_inputs=1)
    m = model([node], [("s0", F, [2]), ("x", F, [5, 2])],
              [("s", F, [2]), ("ys", F, [5, 2]), ("zs", F, [5, 2])],
              [const("w", rand(2)), const("one", np.float32(1))])
    check(m, {"s0": rand(2), "x": rand(5, 2)})


def test_scan9_axes_and_directions():
    node = helper.make_node("Scan", ["s0", "x"], ["s", "ys", "zs"], body=_scan_body(),
                            num_scan_inputs=1, scan_input_axes=[-1], scan_input_directions=[1],
                            scan_output_axes=[1, 0], scan_output_directions=[0, 1])
    m = model([node], [("s0", F, [2]), ("x", F, [2, 4])],
              [("s", F, [2]), ("ys", F, [2, 4]), ("zs", F, [4, 2])],
              [const("w", rand(2)), const("one", np.float32(1))])
    check(m, {"s0": rand(2), "x": rand(2, 4)})


def test_scan8_batch_axis():
    body = graph([helper.make_node("Add", ["s_in", "x_t"], ["s_out"]),
                  helper.make_node("Mul", ["s_out", "x_t"], ["y"])],
                 [("s_in", F, [2]), ("x_t", F, [2])], [("s_out", F, [2]), ("y", F, [2])])
    node = helper.make_node("Scan", ["", "s0", "x"], ["s", "ys"], body=body, num_scan_inputs=1,
                            directions=[1])
    m = model([node], [("s0", F, [3, 2]), ("x", F, [3, 4, 2])], [("s", F, [3, 2]), ("ys", F, [3, 4, 2])],
              opset=8)
    check(m, {"s0": rand(3, 2), "x": rand(3, 4, 2)})


def test_scan_symbolic_length_fails_clearly():
    node = helper.make_node("Scan", ["s0", "x"], ["s", "ys", "zs"], body=_scan_body(),
                            num_scan_inputs=1)
    m = model([node], [("s0", F, [2]), ("x", F, ["T", 2])],
              [("s", F, [2]), ("ys", F, ["T", 2]), ("zs", F, ["T", 2])],
              [const("w", rand(2)), const("one", np.float32(1))])
    with pytest.raises(UnsupportedOpError, match="symbolic"):
        backend.prepare(m)


# ---------------------------------------------------------------- Loop


def _loop_body(cond_node):
    """y += x[i] (a Slice by the iteration number); emits y; the condition from ``cond_node``."""
    nodes = [helper.make_node("Unsqueeze", ["i", "ax0"], ["i1"]),
             helper.make_node("Add", ["i1", "one"], ["i2"]),
             helper.make_node("Slice", ["x", "i1", "i2"], ["xi"]),
             helper.make_node("Add", ["y_in", "xi"], ["y_out"]),
             helper.make_node("Identity", ["y_out"], ["scan"]), cond_node]
    return graph(nodes, [("i", I64, []), ("c_in", B, []), ("y_in", F, [1])],
                 [("c_out", B, []), ("y_out", F, [1]), ("scan", F, [1])], name="body")


LOOP_INITS = [const("ax0", np.array([0])), const("one", np.array([1]))]


def test_loop_constant_trip_count():
    body = _loop_body(helper.make_node("Identity", ["c_in"], ["c_out"]))
    node = helper.make_node("Loop", ["M", "", "y0"], ["y", "ys"], body=body)
    m = model([node], [("y0", F, [1]), ("x", F, [6])], [("y", F, [1]), ("ys", F, [4, 1])],
              LOOP_INITS + [const("M", np.array(4))])
    check(m, {"y0": rand(1), "x": rand(6)})


def test_loop_trip_count_and_condition_as_inputs():
    # the backend specializes on the values of the integer and bool inputs
    body = _loop_body(helper.make_node("Identity", ["c_in"], ["c_out"]))
    node = helper.make_node("Loop", ["M", "c", "y0"], ["y", "ys"], body=body)
    m = model([node], [("M", I64, []), ("c", B, []), ("y0", F, [1]), ("x", F, [6])],
              [("y", F, [1]), ("ys", F, ["n", 1])], LOOP_INITS)
    for trip, c in ((3, True), (5, True), (3, False)):
        check(m, {"M": np.array(trip), "c": np.array(c), "y0": rand(1), "x": rand(6)})


def test_loop_early_exit_on_known_condition():
    # c_out = i < 2 is known at import in every unrolled iteration: stops after 3
    body = _loop_body(helper.make_node("Less", ["i", "two"], ["c_out"]))
    node = helper.make_node("Loop", ["M", "", "y0"], ["y", "ys"], body=body)
    m = model([node], [("y0", F, [1]), ("x", F, [6])], [("y", F, [1]), ("ys", F, ["n", 1])],
              LOOP_INITS + [const("M", np.array(6)), const("two", np.array(2))])
    check(m, {"y0": rand(1), "x": rand(6)})


def test_loop_data_dependent_condition_fails_clearly():
    body = _loop_body(helper.make_node("Less", ["y_out", "lim"], ["c_out"]))
    nodes = [helper.make_node("Loop", ["M", "", "y0"], ["y", "ys"], body=body)]
    m = model(nodes, [("y0", F, [1]), ("x", F, [6])], [("y", F, [1]), ("ys", F, ["n", 1])],
              LOOP_INITS + [const("M", np.array(6)), const("lim", np.array([1.0], np.float32))])
    with pytest.raises(UnsupportedOpError, match="While"):
        backend.prepare(m)


def test_loop_trip_count_computed_from_scalar_input():
    # as Range's function body: M = ceil(limit); the backend specializes on the scalar input
    body = graph([helper.make_node("Identity", ["c_in"], ["c_out"]),
                  helper.make_node("Add", ["v_in", "limit"], ["v_out"]),
                  helper.make_node("Identity", ["v_in"], ["r"])],
                 [("i", I64, []), ("c_in", B, []), ("v_in", F, [])],
                 [("c_out", B, []), ("v_out", F, []), ("r", F, [])], name="body")
    nodes = [helper.make_node("Ceil", ["limit"], ["cl"]),
             helper.make_node("Cast", ["cl"], ["M"], to=I64),
             helper.make_node("Loop", ["M", "", "v0"], ["v", "rs"], body=body)]
    m = model(nodes, [("limit", F, []), ("v0", F, [])], [("v", F, []), ("rs", F, ["n"])])
    for limit in (2.5, 4.0):
        check(m, {"limit": np.array(limit, np.float32), "v0": np.array(1.0, np.float32)})
