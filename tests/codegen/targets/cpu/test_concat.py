"""Concatenations written in place (codegen/targets/cpu/concat.py) against ONNX Runtime.

A SqueezeNet fire module (two convolutions with bias and relu, concatenated on channels), a
DenseNet-style chain (each concat holds the last one and a new convolution, which reads the
last one too), a part that a relu also reads, a graph input as a part, and concats that stay
maps (on an inner axis, a graph output, a dynamic batch): each compiled for x86_64-v2/v3/v4 and
run by the plan runner, fp32 rtol 1e-4 / atol 1e-5. Also: which concats are split, that the
parts' convolutions take the arms as epilogues, and that a part lies inside its concat's slice.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from mlpack.codegen.compile import compile_onnx
from mlpack.codegen.targets.cpu import compile_cpu
from mlpack.codegen.targets.cpu.concat import root, split_concats
from onnx import TensorProto as TP
from onnx import helper
from support import one_output_model

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# tests/codegen/targets/plan_runner.py
from plan_runner import HOST_TARGETS, assert_matches_ort, rand

F = TP.FLOAT


def conv(x, y, w, b, k):
    return helper.make_node("Conv", [x, w, b], [y], pads=[k // 2] * 4)


def weights(prefix, cin, cout, k, seed):
    return [(f"{prefix}w", rand(cout, cin, k, k, seed=seed, scale=1 / np.sqrt(cin * k * k))),
            (f"{prefix}b", rand(cout, seed=seed + 1, scale=0.1))]


def fire(size=9, batch=1, dyn=False):
    """squeeze 1x1 -> (expand 1x1, expand 3x3) -> relu each -> concat -> 1x1 conv."""
    nodes = [conv("x", "s", "sw", "sb", 1), helper.make_node("Relu", ["s"], ["sr"]),
             conv("sr", "e1", "e1w", "e1b", 1), helper.make_node("Relu", ["e1"], ["e1r"]),
             conv("sr", "e3", "e3w", "e3b", 3), helper.make_node("Relu", ["e3"], ["e3r"]),
             helper.make_node("Concat", ["e1r", "e3r"], ["cat"], axis=1),
             conv("cat", "y", "ow", "ob", 1)]
    inits = [*weights("s", 16, 8, 1, 1), *weights("e1", 8, 24, 1, 3), *weights("e3", 8, 20, 3, 5),
             *weights("o", 44, 12, 1, 7)]
    shape = ["N" if dyn else batch, 16, size, size]
    return one_output_model(nodes, [("x", F, shape)], inits), {"x": rand(batch, 16, size, size)}


def dense(layers=3, size=8):
    """x -> concat(x, conv(relu(x))) -> concat(that, conv(relu(that))) -> ... -> 1x1 conv."""
    nodes, inits, prev, c = [], [], "x", 8
    for i in range(layers):
        nodes += [helper.make_node("Relu", [prev], [f"r{i}"]), conv(f"r{i}", f"f{i}", f"c{i}w", f"c{i}b", 3),
                  helper.make_node("Concat", [prev, f"f{i}"], [f"cat{i}"], axis=1)]
        inits += weights(f"c{i}", c, 6, 3, 10 * i)
        prev, c = f"cat{i}", c + 6
    nodes.append(conv(prev, "y", "ow", "ob", 1))
    inits += weights("o", c, 5, 1, 99)
    return one_output_model(nodes, [("x", F, [1, 8, size, size])], inits), {"x": rand(1, 8, size, size)}


def shared_part():
    """A convolution read whole by the concat (so it is placed in its slice) and, through a
    relu, by the rest of the graph (so it must still be written, not fused into the relu)."""
    nodes = [conv("x", "c", "cw", "cb", 3), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Concat", ["c", "x"], ["cat"], axis=1),
             conv("cat", "s", "sw", "sb", 1), helper.make_node("Add", ["s", "r"], ["y"])]
    return one_output_model(nodes, [("x", F, [1, 4, 7, 7])],
                            [*weights("c", 4, 4, 3, 2), *weights("s", 8, 4, 1, 4)]), \
        {"x": rand(1, 4, 7, 7)}


def concat_last_axis():
    nodes = [conv("x", "a", "aw", "ab", 1), conv("x", "b", "bw", "bb", 3),
             helper.make_node("Concat", ["a", "b"], ["cat"], axis=3),
             helper.make_node("Relu", ["cat"], ["y"])]
    return one_output_model(nodes, [("x", F, [1, 6, 5, 5])],
                            [*weights("a", 6, 4, 1, 1), *weights("b", 6, 4, 3, 3)]), \
        {"x": rand(1, 6, 5, 5)}


def concat_output():
    nodes = [conv("x", "a", "aw", "ab", 1), helper.make_node("Relu", ["a"], ["ar"]),
             helper.make_node("Concat", ["ar", "x"], ["y"], axis=1)]
    return one_output_model(nodes, [("x", F, [1, 6, 5, 5])], weights("a", 6, 4, 1, 1)), \
        {"x": rand(1, 6, 5, 5)}


CASES = {
    "fire": fire,
    "fire_13x13": lambda: fire(size=13),
    "fire_dynamic_batch": lambda: fire(batch=2, dyn=True),
    "dense_chain": dense,
    "shared_part": shared_part,
    "concat_last_axis": concat_last_axis,
    "concat_output": concat_output,
}
SPLIT = {"fire": 1, "fire_13x13": 1, "fire_dynamic_batch": 0, "dense_chain": 3,
         "shared_part": 1, "concat_last_axis": 0, "concat_output": 0}


@pytest.mark.parametrize("target", HOST_TARGETS)
@pytest.mark.parametrize("case", list(CASES))
def test_concat_matches_ort(case, target):
    m, feeds = CASES[case]()
    assert_matches_ort(m, feeds, target)


@pytest.mark.parametrize("case", list(CASES))
def test_which_concats_split(case):
    m, _ = CASES[case]()
    g = compile_onnx(m)
    before = list(g.ops)
    _, aliases, parents = split_concats(g)
    assert len(parents) == SPLIT[case]
    assert g.ops == before   # the shared graph is left alone
    for t in aliases:
        assert root(t, aliases)[0] in parents


def test_fire_parts_are_conv_epilogues_in_place():
    """Each expand convolution writes its relu'd output straight into its channels of the
    concat: one kernel per part (the convolution with the arm as its epilogue), none for the
    concat, and the parts' arena slices tile the concat's, 24*9*9 floats apart (the weights'
    panels are packed by prepare kernels, when the artifact is opened). Laid out in the
    type's order: channels last (layout.py), the concatenation is a copy instead."""
    m, _ = fire()
    g = compile_onnx(m)
    art = compile_cpu(g, "x86_64-v4", disabled={"channels_last"})
    _, aliases, parents = split_concats(g)
    (cat,) = parents
    gemms = [n for n in art.kernel_names if not n.endswith(("_pad", "_panel"))]
    assert [n.split("_", 1)[1] for n in gemms] == ["sr", f"{cat}#0", f"{cat}#1", "y"]
    plan = art.plan
    written = {d["kernel"]: plan["buffers"][d["bindings"][0]] for d in plan["dispatches"]}
    part = {n: written[i] for i, n in enumerate(art.kernel_names) if "#" in n
            and not n.endswith(("_pad", "_panel"))}
    p0, p1 = part[f"k1_{cat}#0"], part[f"k2_{cat}#1"]
    assert (p0["size"], p1["size"]) == (24 * 81 * 4, 20 * 81 * 4)
    assert p1["offset"] == p0["offset"] + 24 * 81 * 4
    # the last kernel reads the whole concat: an arena slice starting where the first part does
    reads = [plan["buffers"][b] for b in plan["dispatches"][-1]["bindings"][1:]]
    assert any(b["kind"] == "arena" and b["offset"] == p0["offset"]
               and b["size"] >= 44 * 81 * 4 for b in reads)
