"""Row-invariant selects (codegen/targets/cpu/hoist.py) and the compare-and-select min/max of
lower.py, against ONNX Runtime on x86_64-v2, v3 and v4, fp32 rtol 1e-4 / atol 1e-5.

Concatenations inlined into a pooling, a relu and a batchnorm-like map (two- and four-way, a
symbolic batch so the concatenated channel is not the first dim), pooling with padding, and
NaN propagation through max/min, relu, MaxPool and ReduceMax (against the IR interpreter:
ONNX Runtime's MaxPool and ReduceMax drop NaN). A concatenation along its row (channels last)
is split into one row loop per part, its clamps taken out (``row_select``, ``unclamp``).
"""

from __future__ import annotations

import os
import re
import sys

import numpy as np
import pytest
from mlpack.codegen.compile import compile_onnx
from mlpack.codegen.targets.cpu import compile_cpu
from mlpack.codegen.targets.cpu import hoist
from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.interp import run_graph
from onnx import TensorProto as TP
from onnx import helper
from support import one_output_model, oracle_outputs

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from plan_runner import ATOL, HOST_TARGETS, RTOL, rand, run_plan  # tests/codegen/targets/plan_runner.py

F = TP.FLOAT


model = one_output_model


def check(m, feeds, target, oracle="ort"):
    """``oracle="interp"``: the IR interpreter, for NaN inputs (ORT's MaxPool and ReduceMax
    drop NaN; the IR's max propagates it, as NumPy does)."""
    g = compile_onnx(m)
    art = compile_cpu(g, target)
    got = run_plan(art, g, feeds)[g.outputs[0].name]
    if oracle == "ort":
        want = oracle_outputs(m, feeds)[0]
    else:
        res = run_graph(g, feeds)
        want = res[g.outputs[0].name] if isinstance(res, dict) else res[0]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, equal_nan=True)


def concat_pool_case(n_in=2, batch=1, pads=0):
    names = [f"x{i}" for i in range(n_in)]
    nodes = [helper.make_node("Relu", [x], [f"r{i}"]) for i, x in enumerate(names)]
    nodes += [helper.make_node("Concat", [f"r{i}" for i in range(n_in)], ["c"], axis=1),
              helper.make_node("MaxPool", ["c"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                               pads=[pads] * 4)]
    chans = [5 + 3 * i for i in range(n_in)]
    m = model(nodes, [(x, F, ["N", c, 13, 13]) for x, c in zip(names, chans)])
    return m, {x: rand(batch, c, 13, 13, seed=i) for i, (x, c) in enumerate(zip(names, chans))}


def concat_affine_case(batch=1):
    """A concat read by a per-channel scale and shift (densenet's batchnorm after a concat)."""
    nodes = [helper.make_node("Concat", ["a", "b"], ["c"], axis=1),
             helper.make_node("Mul", ["c", "s"], ["m"]),
             helper.make_node("Add", ["m", "t"], ["y"])]
    m = model(nodes, [("a", F, [batch, 6, 9, 11]), ("b", F, [batch, 4, 9, 11])],
              [("s", rand(10, 1, 1, seed=3)), ("t", rand(10, 1, 1, seed=4))])
    return m, {"a": rand(batch, 6, 9, 11, seed=1), "b": rand(batch, 4, 9, 11, seed=2)}


@pytest.mark.parametrize("target", HOST_TARGETS)
@pytest.mark.parametrize("n_in,batch,pads", [(2, 1, 0), (4, 1, 1), (3, 2, 0)])
def test_concat_into_pooling(target, n_in, batch, pads):
    m, feeds = concat_pool_case(n_in, batch, pads)
    check(m, feeds, target)


@pytest.mark.parametrize("target", HOST_TARGETS)
@pytest.mark.parametrize("batch", [1, 2])
def test_concat_into_map(target, batch):
    m, feeds = concat_affine_case(batch)
    check(m, feeds, target)


def _with_nans(*shape, seed=0):
    x = rand(*shape, seed=seed)
    x.flat[::7] = np.nan
    x.flat[3::11] = -0.0
    return x


@pytest.mark.parametrize("target", HOST_TARGETS)
def test_minmax_propagate_nan(target):
    nodes = [helper.make_node("Max", ["a", "b"], ["p"]), helper.make_node("Min", ["p", "a"], ["q"]),
             helper.make_node("Relu", ["q"], ["y"])]
    m = model(nodes, [("a", F, [4, 37]), ("b", F, [4, 37])])
    check(m, {"a": _with_nans(4, 37), "b": _with_nans(4, 37, seed=1)[::-1].copy()}, target,
          oracle="interp")


@pytest.mark.parametrize("target", HOST_TARGETS)
@pytest.mark.parametrize("op", ["MaxPool", "ReduceMax"])
def test_max_reductions_propagate_nan(target, op):
    if op == "MaxPool":
        node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], pads=[1] * 4)
    else:
        node = helper.make_node("ReduceMax", ["x"], ["y"], axes=[2], keepdims=0)
    m = model([node], [("x", F, [1, 3, 10, 10])])
    x = rand(1, 3, 10, 10)
    x[0, 1, 4, 6] = np.nan
    check(m, {"x": x}, target, oracle="interp")


def test_invariant_select_finds_outer_conditions():
    c, w = ex.var("c"), ex.var("w")
    a = ex.read("A", {"c": c, "w": w}, "f32")
    b = ex.read("B", {"c": c, "w": w}, "f32")
    on_c = ex.select(ex.binary("lt", c, ex.const(4)), a, b)
    on_w = ex.select(ex.binary("lt", w, ex.const(4)), a, b)
    assert hoist.invariant_select([on_w, on_c], {"c"}) is on_c
    assert hoist.invariant_select([on_w], {"c"}) is None
    assert ex.replace_node(on_c, on_c, a) is a


def test_row_select_and_unclamp():
    c, w = ex.var("c"), ex.var("w")
    a = ex.read("A", {"c": c, "w": w}, "f32")
    clamped = ex.binary("min", ex.binary("max", c - ex.const(4), ex.const(0)), ex.const(5))
    b = ex.read("B", {"c": clamped, "w": w}, "f32")
    on_c = ex.select(ex.binary("lt", c, ex.const(4)), a, b)
    on_w = ex.select(ex.binary("lt", w, ex.const(4)), a, b)
    assert hoist.row_select([on_w, on_c], "c") is on_c
    assert hoist.row_select([on_w], "c") is None
    # c in [4, 10) keeps c - 4 within [0, 5]; [4, 11) does not, nor an unknown end
    assert hoist.unclamp(b, "c", 4, 10).args[0] == c - ex.const(4)
    assert hoist.unclamp(b, "c", 4, 11) is b
    assert hoist.unclamp(b, "c", 3, 10) is b
    assert hoist.unclamp(b, "c", 4, None) is b


def test_a_concatenation_along_the_row_runs_a_loop_per_part(monkeypatch, capsys):
    """Three parts concatenated along their channel, laid out last (a dynamic batch: the
    concatenation is a kernel, layout.py): one row loop per part and no per-element select of
    the part (test_layout.py's test_matches_ort runs the model against ONNX Runtime)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from test_layout import concat_batched

    monkeypatch.setenv("MLPACK_DEBUG", "3")
    compile_cpu(compile_onnx(concat_batched()[0]), "x86_64-v3")
    llvm = capsys.readouterr().err.split("LLVM IR before optimization:")[1]
    kernel = re.search(r'@"k\d+_t\.impl".*?\n}\n', llvm, re.S).group(0)
    assert len(re.findall(r"^j\.co\.head(\.\d+)?:", kernel, re.M)) == 3
    # each part loads at its own channel, unclamped: the two relus are the only float selects
    assert len(re.findall(r"select\s+i1 %\S+, float", kernel)) == 2, kernel


def pad_case(pads, width=13, batch=1):
    """Pad (zeros) of a Relu'd image along its rows and columns: a map whose read is guarded
    along its row (the column) by ``w - left``."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Pad", ["r", "p"], ["y"], mode="constant")]
    m = model(nodes, [("x", F, ["N", 3, 9, width])],
              [("p", np.array([0, 0, pads[0], pads[1], 0, 0, pads[2], pads[3]], np.int64))])
    return m, {"x": rand(batch, 3, 9, width, seed=5)}


def test_guard_cuts_find_a_guarded_reads_interior():
    w, h = ex.var("w"), ex.var("h")

    class Buf:
        sizes = {"h": ex.const(9), "w": ex.const(13)}
    read = ex.read("A", {"h": h - ex.const(1), "w": w - ex.const(2)}, "f32", 0.0)
    assert hoist.guard_cuts([read], "w", {"A": Buf}) == (2, 15)
    assert hoist.guard_cuts([read], "h", {"A": Buf}) == (1, 10)
    plain = ex.read("A", {"h": h, "w": w - ex.const(2)}, "f32")
    assert hoist.guard_cuts([plain], "w", {"A": Buf}) is None


@pytest.mark.parametrize("target", HOST_TARGETS)
@pytest.mark.parametrize("pads,width,batch", [((1, 1, 1, 1), 13, 1), ((0, 2, 3, 0), 13, 2),
                                              ((2, 0, 0, 5), 40, 1), ((1, 0, 1, 0), 224, 1)])
def test_padded_copies_match_ort(target, pads, width, batch):
    m, feeds = pad_case(pads, width, batch)
    check(m, feeds, target)


def test_a_padded_copy_loads_its_interior_unguarded(monkeypatch, capsys):
    """The copy's row splits into its left pad, its image and its right pad
    (``guard_cuts``): three loops, and the image's loads are plain, under no branch or masked
    load (a stem's padded input took a masked load per vector on AVX2)."""
    monkeypatch.setenv("MLPACK_DEBUG", "3")
    compile_cpu(compile_onnx(pad_case((1, 1, 1, 1), 224)[0]), "x86_64-v3")
    err = capsys.readouterr().err
    llvm = err.split("LLVM IR before optimization:")[1]
    kernel = re.search(r'@"k\d+_y\.impl".*?\n}\n', llvm, re.S).group(0)
    assert len(re.findall(r"^j\.\w+\.head(\.\d+)?:", kernel, re.M)) == 3
    asm = err.split("assembly after")[-1] if "assembly after" in err else err
    assert "vmaskmovps" not in re.search(r"k\d+_y:.*?\.Lfunc_end", asm, re.S).group(0)
