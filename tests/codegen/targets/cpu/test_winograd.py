"""Winograd convolutions (codegen/targets/cpu/winograd.py) against ONNX Runtime.

The F(4, 3) matrices are checked exactly; then 3x3 convolutions where Winograd pays (a bias and
relu epilogue, a height that is no multiple of 4, no padding, uneven padding, a batch, a batch
that is a named dim, a raw graph output, two in a chain, two feeding a concatenation) are
compiled for x86_64-v2/v3/v4, run by the plan runner and compared with ONNX Runtime at the
fp32 tolerance (rtol 1e-4, atol 1e-5). Which convolutions are rewritten is checked too (small
images, strides, 1x1 and depthwise ones are not), and that a build whose Winograd artifact
misses its test vectors compiles it direct.
"""

from __future__ import annotations

import os
import sys
from fractions import Fraction

import numpy as np
import pytest
from mlpack.codegen.compile import compile_onnx
from mlpack.codegen.targets.cpu import compile_cpu, winograd
from mlpack.codegen.targets.cpu.concat import split_concats
from onnx import TensorProto as TP
from onnx import helper
from support import one_output_model, oracle_outputs

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# tests/codegen/targets/plan_runner.py
from plan_runner import ATOL, HOST_TARGETS, RTOL, assert_matches_ort, rand

F = TP.FLOAT


def conv_node(x, y, prefix, k=3, pads=None, stride=1, group=1):
    return helper.make_node("Conv", [x, f"{prefix}w", f"{prefix}b"], [y],
                            pads=[k // 2] * 4 if pads is None else pads, strides=[stride] * 2,
                            group=group)


def weights(prefix, cin, cout, k=3, seed=0, group=1):
    return [(f"{prefix}w", rand(cout, cin // group, k, k, seed=seed,
                                scale=1 / np.sqrt(cin // group * k * k))),
            (f"{prefix}b", rand(cout, seed=seed + 1, scale=0.1))]


def model(nodes, inits, cin=24, size=32, batch=1, dynamic=False):
    """``dynamic``: the batch is a named dim of the model (as in every exported classifier),
    fed with ``batch`` items."""
    x = rand(batch, cin, size, size, seed=42)
    shape = ["batch" if dynamic else batch, cin, size, size]
    return one_output_model(nodes, [("x", F, shape)], inits), {"x": x}


def conv_relu(cin=24, cout=32, size=32, batch=1, pads=None, dynamic=False):
    nodes = [conv_node("x", "c", "a", pads=pads), helper.make_node("Relu", ["c"], ["y"])]
    return model(nodes, weights("a", cin, cout), cin, size, batch, dynamic)


def raw_output():
    return model([conv_node("x", "y", "a")], weights("a", 24, 20), batch=2)


def chain():
    nodes = [conv_node("x", "c1", "a"), helper.make_node("Relu", ["c1"], ["r1"]),
             conv_node("r1", "c2", "b"), helper.make_node("Relu", ["c2"], ["y"])]
    return model(nodes, [*weights("a", 24, 32, seed=1), *weights("b", 32, 24, seed=3)], size=24)


def into_concat():
    """Two Winograd convolutions written into their slices of a concatenation (concat.py),
    which the graph input as its third part keeps in its type's order (layout.py)."""
    nodes = [conv_node("x", "c1", "a"), helper.make_node("Relu", ["c1"], ["r1"]),
             conv_node("x", "c2", "b"), helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Concat", ["r1", "r2", "x"], ["cat"], axis=1),
             conv_node("cat", "y", "o", k=1)]
    return model(nodes, [*weights("a", 24, 24, seed=1), *weights("b", 24, 16, seed=3),
                         *weights("o", 64, 8, k=1, seed=5)])


CASES = {
    "conv_bias_relu": conv_relu,
    "height_not_a_multiple_of_4": lambda: conv_relu(size=30),
    "no_padding": lambda: conv_relu(size=34, pads=[0, 0, 0, 0]),
    "uneven_padding": lambda: conv_relu(size=29, pads=[2, 0, 1, 1]),
    "batch_of_3": lambda: conv_relu(batch=3, size=24),
    "dynamic_batch": lambda: conv_relu(batch=2, size=24, dynamic=True),
    "raw_graph_output": raw_output,
    "chain": chain,
    "into_concat": into_concat,
}
REWRITTEN = {"conv_bias_relu": 1, "height_not_a_multiple_of_4": 1, "no_padding": 1,
             "uneven_padding": 1, "batch_of_3": 1, "dynamic_batch": 1,
             "raw_graph_output": 1, "chain": 2,
             "into_concat": 2}


def test_transforms_compute_the_window_exactly():
    """AT ((G w) * (BT d)) is the 3-tap correlation of d with w, in exact arithmetic."""
    rng = np.random.default_rng(0)
    bt, g, at = ([[Fraction(v).limit_denominator(1000) for v in row] for row in m]
                 for m in (winograd.BT, winograd.G, winograd.AT))
    for _ in range(20):
        d = [Fraction(int(v)) for v in rng.integers(-9, 10, 6)]
        w = [Fraction(int(v)) for v in rng.integers(-9, 10, 3)]
        u = [sum(bt[p][i] * d[i] for i in range(6)) for p in range(6)]
        v = [sum(g[p][k] * w[k] for k in range(3)) for p in range(6)]
        y = [sum(at[o][p] * u[p] * v[p] for p in range(6)) for o in range(4)]
        assert y == [sum(w[k] * d[o + k] for k in range(3)) for o in range(4)]


@pytest.mark.parametrize("target", HOST_TARGETS)
@pytest.mark.parametrize("case", list(CASES))
def test_winograd_matches_ort(case, target):
    m, feeds = CASES[case]()
    _, art = assert_matches_ort(m, feeds, target)
    assert art.winograd == REWRITTEN[case]


def _rewritten(m) -> int:
    g, aliases, parents = split_concats(compile_onnx(m))
    return winograd.rewrite(g, aliases, parents)[1]


@pytest.mark.parametrize("why, case", [
    ("a 7x7 image: too few rows per point", lambda: conv_relu(size=7)),
    ("16 channels in: too shallow", lambda: conv_relu(cin=16, size=32)),
    ("a 13x13 image of 48 channels: rows too short for the transforms",
     lambda: conv_relu(cin=48, size=13)),
    ("stride 2", lambda: model([conv_node("x", "y", "a", stride=2)], weights("a", 24, 24))),
    ("1x1", lambda: model([conv_node("x", "y", "a", k=1)], weights("a", 24, 24, k=1))),
    ("depthwise", lambda: model([conv_node("x", "y", "a", group=24)],
                                weights("a", 24, 24, group=24))),
])
def test_where_winograd_does_not_pay_convolutions_stay_direct(why, case):
    m, _ = case()
    assert _rewritten(m) == 0, why


def test_a_narrow_image_takes_winograd_when_the_gemm_is_deep_enough():
    """Rows of 14 are short for the transforms' vector loops; 96 channels in (a depth of 288 a
    point: GoogLeNet's inception4a) repay them, 64 (192) do not."""
    assert _rewritten(conv_relu(cin=96, size=14)[0]) == 1
    assert _rewritten(conv_relu(cin=64, size=14)[0]) == 0


def test_rewrite_leaves_the_shared_graph_alone_and_disable_passes_switches_it_off(monkeypatch):
    m, feeds = chain()
    g = compile_onnx(m)
    before = list(g.ops)
    g2, n = winograd.rewrite(g)
    assert n == 2 and g.ops == before and g2 is not g
    assert all(w not in g2.constants for w in ("aw", "bw")) and "aw" in g.constants
    assert compile_cpu(g, "x86_64-v4").winograd == 2
    assert compile_cpu(g, "x86_64-v4", disabled={"winograd"}).winograd == 0
    monkeypatch.setenv("MLPACK_DISABLE_PASSES", "winograd")
    assert compile_cpu(g, "x86_64-v4").winograd == 0


@pytest.mark.parametrize("precision, dtype", [("bf16", "bf16"), ("fp16", "f16")])
def test_16_bit_weights_are_folded_too_and_stay_16_bit(precision, dtype):
    """A precision's 16-bit weights (codegen/precisions/weights16.py) take Winograd like f32
    ones: Wt is folded from them in float64 and kept in their dtype, read widened."""
    from mlpack.codegen import precisions
    from mlpack.spec.ir.interp import run_graph

    m, feeds = chain()
    g16 = precisions.apply(precision, compile_onnx(m))
    g2, n = winograd.rewrite(g16)
    assert n == 2
    wts = [c for name, c in g2.constants.items() if "#wt" in name]
    assert len(wts) == 2 and all(c.type.dtype == dtype for c in wts)
    want, got = run_graph(g16, feeds)["y"], run_graph(g2, feeds)["y"]
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < (2 ** -6 if precision == "bf16" else 2 ** -9), err   # Wt's rounding, no more
    assert compile_cpu(g16, "x86_64-v4").winograd == 2


def test_a_build_whose_winograd_artifact_misses_its_vectors_compiles_it_direct(tmp_path, monkeypatch):
    """With a wrong output transform this host's artifact fails its vectors; the build then
    compiles it without Winograd, and the container validates."""
    import mlpack
    from mlpack.backend import host_target
    target = host_target()   # (validated only where it runs)
    wrong = winograd.AT.copy()
    wrong[0, 0] += 1e-2
    monkeypatch.setattr(winograd, "AT", wrong)
    m, feeds = conv_relu()
    lines = []
    report = mlpack.build(m, tmp_path / "m.mlpack", targets=[target], progress=lines.append)
    assert any(f"{target}: winograd misses the fp32 tolerance; compiling without it" in line
               for line in lines)
    (art,) = [a for a in report.artifacts if a.target == target]
    assert art.validated and art.max_abs_error < 1e-4
    assert art.dropped_passes == ("winograd",)   # the report says so, not only the progress line
    assert all(a.dropped_passes == () for a in report.artifacts if a is not art)
    with mlpack.load(tmp_path / "m.mlpack") as loaded:
        got = loaded.run(feeds)["y"]
    np.testing.assert_allclose(got, oracle_outputs(m, feeds)[0], rtol=RTOL, atol=ATOL)
