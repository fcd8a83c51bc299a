"""gather.py: a projection that reads windows of an image (Swin's window partition, folded into
its read as divisions and remainders) reads them from a gathered tensor, as does a 1x1
convolution with columns enough that reads an NCHW image (column-major), and the artifact still
matches ONNX Runtime (fp32 tolerance, rtol 1e-4, atol 1e-5) on x86_64-v2/v3/v4.

The model partitions a 14 x 14 image of 32 channels (a Relu of the input, so that a comprehension
writes it) into four 7 x 7 windows, optionally after a cyclic shift of 3 (Swin's roll, which
ONNX writes as slices and a concatenation), and multiplies every token by a weight matrix; the
batch is fixed or a named dim.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from mlpack.codegen.compile import compile_onnx
from mlpack.codegen.targets.cpu import gather
from onnx import TensorProto as TP
from onnx import helper
from support import one_output_model

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# tests/codegen/targets/plan_runner.py
from plan_runner import HOST_TARGETS, assert_matches_ort, rand

SIZE, WIN, C, N = 14, 7, 32, 24


def _const(name, values):
    return (name, np.array(values, np.int64))


def windows(shift=False, dynamic=False):
    """Relu(x) [b, 14, 14, 32] -> (rolled) -> 4 windows of 49 tokens -> MatMul W [32, 24]."""
    b = 2 if dynamic else 1
    nodes = [helper.make_node("Relu", ["x"], ["o"])]
    inits = [("w", rand(C, N, seed=2, scale=1 / np.sqrt(C)))]
    src = "o"
    if shift:   # torch.roll(x, (-3, -3), (1, 2)): two slices and a concatenation per axis
        for axis in (1, 2):
            nodes += [helper.make_node("Slice", [src, f"s3", f"end{axis}", f"ax{axis}"],
                                       [f"tail{axis}"]),
                      helper.make_node("Slice", [src, "s0", "s3", f"ax{axis}"], [f"head{axis}"]),
                      helper.make_node("Concat", [f"tail{axis}", f"head{axis}"], [f"r{axis}"],
                                       axis=axis)]
            inits += [_const(f"end{axis}", [SIZE]), _const(f"ax{axis}", [axis])]
            src = f"r{axis}"
        inits += [_const("s0", [0]), _const("s3", [3])]
    grid = SIZE // WIN
    nodes += [helper.make_node("Reshape", [src, "split"], ["p"]),
              helper.make_node("Transpose", ["p"], ["t"], perm=[0, 1, 3, 2, 4, 5]),
              helper.make_node("Reshape", ["t", "flat"], ["tok"]),
              helper.make_node("MatMul", ["tok", "w"], ["y"])]
    inits += [_const("split", [-1, grid, WIN, grid, WIN, C]), _const("flat", [-1, WIN * WIN, C])]
    shape = ["batch" if dynamic else b, SIZE, SIZE, C]
    m = one_output_model(nodes, [("x", TP.FLOAT, shape)], inits)
    return m, {"x": rand(b, SIZE, SIZE, C, seed=1)}


def _gathered(m) -> list[str]:
    g = gather.gathered_operands(compile_onnx(m))
    return [op.out for op in g.ops if op.out.endswith("#rows")]


@pytest.mark.parametrize("shift", [False, True])
def test_windows_are_gathered_before_the_projection(shift):
    assert len(_gathered(windows(shift)[0])) == 1


def test_an_affine_read_is_left_to_the_gemm():
    nodes = [helper.make_node("Relu", ["x"], ["o"]), helper.make_node("MatMul", ["o", "w"], ["y"])]
    m = one_output_model(nodes, [("x", TP.FLOAT, [49, C])], [("w", rand(C, N, seed=2))])
    assert _gathered(m) == []


@pytest.mark.parametrize("target", HOST_TARGETS)
@pytest.mark.parametrize("shift, dynamic", [(False, False), (True, False), (True, True)])
def test_gathered_windows_match_ort(shift, dynamic, target):
    m, feeds = windows(shift, dynamic)
    assert_matches_ort(m, feeds, target)


def pointwise(cin=96, cout=384, size=7, dynamic=False):
    """An NCHW image (the graph's input, whose port keeps its order) -> 1x1 Conv -> Relu ->
    GlobalAveragePool: the convolution's output goes channels last, its input is read with each
    K step a plane apart."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["y"])]
    inits = [("w", rand(cout, cin, 1, 1, seed=2, scale=1 / np.sqrt(cin))),
             ("b", rand(cout, seed=3))]
    b = 2 if dynamic else 1
    m = one_output_model(nodes, [("x", TP.FLOAT, ["batch" if dynamic else b, cin, size, size])],
                         inits)
    return m, {"x": rand(b, cin, size, size, seed=1)}


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_column_major_image_is_gathered_rows_first(dynamic):
    g = gather.gathered_operands(compile_onnx(pointwise(dynamic=dynamic)[0]))
    rows = [op for op in g.ops if op.out.endswith("#rows")]
    assert len(rows) == 1
    sizes = [s.value for s in rows[0].type.dims.values() if s.is_const and s.value > 1]
    assert sizes == [7, 7, 96]   # the rows (pixels), then K (the input channels)


@pytest.mark.parametrize("cout", [64, 255])
def test_too_few_columns_leave_the_image_in_place(cout):
    assert _gathered(pointwise(cout=cout)[0]) == []


@pytest.mark.parametrize("target", HOST_TARGETS)
@pytest.mark.parametrize("dynamic", [False, True])
def test_gathered_columns_match_ort(dynamic, target):
    m, feeds = pointwise(dynamic=dynamic)
    assert_matches_ort(m, feeds, target)
