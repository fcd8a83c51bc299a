"""cpu kernel building (codegen/targets/cpu/kernels.py): small pooling windows unrolled.

A max or min pooling over a window of at most MAX_WINDOW positions becomes a map that combines
the window's terms (unroll_window), with a bias and relu taken out of the window where they
are non-decreasing; a larger window stays a reduction. On x86_64-v2/v3/v4, outputs equal ONNX
Runtime's on finite inputs, and the IR interpreter's (whose reduction propagates NaN, as the
cpu reduction did before unrolling; ONNX Runtime's MaxPool drops a NaN that is not first) with
NaN, -inf and inf among the inputs; exact, since max and min do no arithmetic. Rows cut into
chunks for the threads: a dynamic batch is cut as a batch of one.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from mlpack.codegen.compile import compile_onnx
from mlpack.codegen.targets.cpu.kernels import MAX_WINDOW, build_kernels
from mlpack.codegen.targets.cpu.plan import tensor_buffers
from onnx import TensorProto as TP
from onnx import helper
from support import one_output_model, oracle_outputs

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from plan_runner import HOST_TARGETS, compile_and_run, eval_expr, run_plan  # tests/codegen/targets/plan_runner.py

F = TP.FLOAT


def specials(x):
    x = x.copy()
    flat = x.reshape(-1)
    flat[::37] = np.nan
    flat[5::41] = -np.inf
    flat[9::43] = np.inf
    return x


def pool_case(op="MaxPool", k=3, stride=2, size=15, pads=0, bias_relu=True, concat=False):
    nodes, inits, src = [], [], "x"
    if bias_relu:
        nodes += [helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Relu", ["a"], ["r"])]
        inits.append(("b", np.linspace(-1, 1, 6, dtype=np.float32).reshape(1, 6, 1, 1)))
        src = "r"
    if concat:
        nodes.append(helper.make_node("Neg", ["x"], ["nx"]))
        nodes.append(helper.make_node("Concat", [src, "nx"], ["c"], axis=1))
        src = "c"
    attrs = {} if op.startswith("Global") else dict(kernel_shape=[k, k], strides=[stride] * 2,
                                                     pads=[pads] * 4)
    nodes.append(helper.make_node(op, [src], ["y"], **attrs))
    m = one_output_model(nodes, [("x", F, [1, 6, size, size])], inits)
    x = np.random.default_rng(0).standard_normal((1, 6, size, size)).astype(np.float32)
    return m, {"x": x}


CASES = {
    "maxpool3x3_s2_bias_relu": lambda: pool_case(),
    "maxpool2x2_plain": lambda: pool_case(k=2, stride=2, size=14, bias_relu=False),
    "maxpool3x3_padded": lambda: pool_case(stride=1, size=9, pads=1),
    "maxpool_over_concat": lambda: pool_case(concat=True),
    "global_maxpool_7x7": lambda: pool_case(op="GlobalMaxPool", size=7),   # 49 > MAX_WINDOW
}
UNROLLED = {"maxpool3x3_s2_bias_relu": 9, "maxpool2x2_plain": 4, "maxpool3x3_padded": 9,
            "maxpool_over_concat": 9, "global_maxpool_7x7": 1}


@pytest.mark.parametrize("target", HOST_TARGETS)
@pytest.mark.parametrize("case", list(CASES))
def test_pooling_matches_ort_and_the_interpreter(case, target):
    from mlpack.spec.ir import run_graph
    m, feeds = CASES[case]()
    g, art, got = compile_and_run(m, feeds, target)
    name = g.outputs[0].name
    np.testing.assert_array_equal(got, oracle_outputs(m, feeds)[0])
    odd = {"x": specials(feeds["x"])}
    got, want = run_plan(art, g, odd)[name], run_graph(g, odd)[name]
    np.testing.assert_array_equal(got, want)   # NaN where NaN, infinities where they are


@pytest.mark.parametrize("case", list(CASES))
def test_small_windows_become_maps(case):
    m, _ = CASES[case]()
    g = compile_onnx(m)
    bufs = tensor_buffers(g)
    k = [k for k in build_kernels(g, bufs) if k.out == g.outputs[0].name][0]
    assert k.window == UNROLLED[case]
    assert (k.reduce is None) == (k.window > 1)
    assert UNROLLED[case] <= MAX_WINDOW


# ---------------------------------------------------------------- row blocks (block_rows)


def _routing():
    """examples/capsules' EM routing, small: its weighted sums over the votes are row
    reductions along co whose transformation matrices W do not move with the pose row i."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                    "dsl"))
    from dsl_support import em_routing_graph
    c = 16
    g = em_routing_graph(c, tiles=False)
    rng = np.random.default_rng(2)
    feeds = {"P": rng.standard_normal((1, 9, 9, c, 4, 4)).astype(np.float32),
             "A": rng.uniform(0.2, 1, (1, 9, 9, c)).astype(np.float32),
             "W": (rng.standard_normal((3, 3, c, 4, 4, c)) / 12).astype(np.float32),
             "beta_v": (0.1 * rng.standard_normal(c)).astype(np.float32),
             "beta_a": np.zeros(c, np.float32)}
    return g, feeds


def test_row_blocks_walk_the_rows_that_share_an_operand(monkeypatch):
    """The routing's sums over the votes walk the pose rows i in each unit (W is read once per
    unit and step), and give the outputs of one row per unit and the interpreter's within
    fp32 (sums may reassociate: FAST_SUM), never more than 64 workgroups at this size."""
    from mlpack.codegen.targets.cpu import compile_cpu, kernels as kmod
    from mlpack.codegen.targets.cpu.compile import schedule_kernels
    from mlpack.codegen.targets.cpu.target import get_target
    from mlpack.spec.ir.interp import run_graph

    g, feeds = _routing()
    target = "x86_64-v2"   # every x86-64 host runs it
    _, ks, bufs, _, _ = schedule_kernels(g, get_target(target))
    blocked = {k.name: k.blocked for k in ks if k.blocked}
    assert blocked and all("i" in b for b in blocked.values()), blocked
    art = compile_cpu(g, target)
    units = {d["kernel"]: d["workgroups"] for d in art.plan["dispatches"]}
    assert all(isinstance(w, int) and w <= 64 for w in units.values())
    got = run_plan(art, g, feeds)
    with monkeypatch.context() as m:
        m.setattr(kmod, "ROW_BLOCK", 0)   # no room for a block: one row per unit
        plain = run_plan(compile_cpu(g, target), g, feeds)
    want = run_graph(g, feeds)
    for name in want:
        scale = np.abs(want[name]).max()   # errors of the output's scale, as the build's
        assert np.abs(got[name] - plain[name]).max() / scale < 1e-5, name
        assert np.abs(got[name] - want[name]).max() / scale < 1e-5, name


def test_rows_of_a_dynamic_batch_are_cut_for_the_threads():
    """A LayerNorm's statistics over a dynamic batch, [$batch, 1500] summed over 384: one row
    per batch item, cut into chunks as a batch of one would be (before, a symbol anywhere kept
    the kernel in one workgroup: one core at any thread count); the sums match NumPy's at
    batches 1 and 3."""
    from mlpack.codegen.targets.cpu import compile_cpu
    from mlpack.spec.ir import parse_graph
    g = parse_graph('''graph "stats" {
      in %x: f32{n=$batch, r=1500, c=384} (n, r, c)
      %m: f32{n=$batch, r=1500} = sum{k=384} %x[n=n, r=r, c=k]
      out %m (n, r)
    }''')
    art = compile_cpu(g, "x86_64-v2")
    (dispatch,) = art.plan["dispatches"]
    assert eval_expr(dispatch["workgroups"], {"batch": 1}) >= 8
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 1500, 384)).astype(np.float32)
        got = run_plan(art, g, {"x": x})["m"]
        np.testing.assert_allclose(got, x.astype(np.float64).sum(-1), rtol=1e-4, atol=1e-4)

