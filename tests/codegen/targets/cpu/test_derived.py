"""What the cpu target computes from the model's weights when the engine opens the artifact
(kernel ABI 1.4): a depthwise convolution's weights stored channels last and Winograd's folded
weights (codegen/targets/cpu/derived.py), in f32 and in the 16-bit precisions, against the data
the passes computed at build time in NumPy (float64 for Winograd, rounded once); and the GEMM
panels, against gemm.py's reference layouts (pack_b, pack_pairs, signed_correction). The
artifacts run here through the plan runner on x86-64 v2, which every x86-64 host runs; the
panels of other targets are checked by interpreting their prepare kernels' IR."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # plan_runner
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))                   # the models

from plan_runner import prepared, run_plan  # noqa: E402
from test_layout import depthwise  # noqa: E402
from test_winograd import chain  # noqa: E402

from mlpack.codegen import precisions  # noqa: E402
from mlpack.codegen.compile import compile_onnx  # noqa: E402
from mlpack.codegen.passes.pipeline import run_passes  # noqa: E402
from mlpack.codegen.targets.cpu import compile_cpu  # noqa: E402
from mlpack.codegen.targets.cpu.compile import _Rewritten, target_passes  # noqa: E402
from mlpack.codegen.targets.cpu.kernels import tensors_read  # noqa: E402
from mlpack.codegen.targets.cpu.target import get_target  # noqa: E402
from mlpack.runtime import detect_host  # noqa: E402
from mlpack.spec.ir import dtypes as dt  # noqa: E402

TARGET = "x86_64-v2"
pytestmark = pytest.mark.skipif(detect_host().arch != "amd64", reason="runs x86-64 code")


def _recipe_value(g, name: str, recipes: dict) -> np.ndarray:
    """The recorded comprehension of ``name`` run by the IR interpreter on ``g``'s weights."""
    from mlpack.spec.ir.graph import Graph, Port
    from mlpack.spec.ir.interp import run_graph

    op = recipes[name]
    h = Graph("recipe")
    for t in tensors_read(op.body):
        h.add_constant(g.constants[t])
    h.add_op(op)
    h.outputs.append(Port(name, tuple(op.type.dims)))
    return run_graph(h, {})[name]


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_winograd_folds_the_weights_at_load_as_at_build(precision):
    """Winograd's folded weights: the recipe gives the build-time data (float64, rounded once),
    and the artifact, which folds them in its panels' prepare kernels, computes the model as
    the interpreter does."""
    from mlpack.spec.ir.interp import run_graph

    m, feeds = chain()
    g = precisions.apply(precision, compile_onnx(m))
    state = _Rewritten()
    rewritten = run_passes(g, target_passes(state, get_target(TARGET)))
    names = [n for n in state.derived if "#wt" in n]
    assert len(names) == 2
    for name in names:
        c = rewritten.constants[name]
        value = np.asarray(_recipe_value(g, name, state.derived), np.float64)
        # (the interpreter's arrays are in the type's dims order, the data in the layout's)
        data = np.transpose(c.data.astype(np.float64), [c.layout.index(d) for d in c.type.dims])
        step = np.abs(data) * 2.0 ** -{"f32": 23, "bf16": 7, "f16": 10}[c.type.dtype]
        assert (np.abs(value - data) <= step + 1e-12 * np.abs(data).max()).all(), name
    art = compile_cpu(g, TARGET)
    assert set(art.weights) == set(g.constants)   # the weights as the model has them, no more
    assert not [b for b in art.plan["buffers"] if "#wt" in b.get("name", "")
                and "#pack" not in b["name"]]    # folded inside the panels, never stored
    got = run_plan(art, g, feeds)["y"]
    want = run_graph(rewritten, feeds)["y"]   # (Winograd with the weights folded at build)
    # f32 sums in another order; a 16-bit fold may round a weight one step the other way
    tol = {"fp32": 1e-4, "bf16": 2.0 ** -8, "fp16": 2.0 ** -11}[precision]
    assert np.abs(got - want).max() <= tol * np.abs(want).max()


def test_a_depthwise_convolutions_weights_are_relaid_at_load():
    g = compile_onnx(depthwise()[0])
    state = _Rewritten()
    rewritten = run_passes(g, target_passes(state, get_target(TARGET)))
    [name] = [n for n in state.derived if n.endswith("#last")]
    art = compile_cpu(g, TARGET)
    assert set(art.weights) == set(g.constants)
    c = rewritten.constants[name]
    got = prepared(art)[name].view(np.float32).reshape(c.data.shape)
    np.testing.assert_array_equal(got, c.data)


# ---------------------------------------------------------------- the GEMM panels


def _prepared_by_interpreter(g, target: str) -> dict[str, np.ndarray]:
    """What each prepare kernel of ``g`` for ``target`` computes, by the IR interpreter on its
    body (target independent: what its code computes on any CPU), by tensor, in its layout."""
    from mlpack.codegen.targets.cpu.compile import schedule_kernels
    from mlpack.spec.ir.graph import Comprehension, Constant, Graph, Port, TensorType
    from mlpack.spec.ir.interp import run_graph

    g2, kernels, bufs, _, _ = schedule_kernels(g, get_target(target))
    known = {**g.constants, **g2.constants}
    out: dict[str, np.ndarray] = {}
    for k in [k for k in kernels if k.prepare]:
        h = Graph("prepare")
        for name in k.reads:
            if name in out:
                b = bufs[name]
                known[name] = Constant(name, TensorType(b.dtype, dict(b.sizes)), b.layout, out[name])
            h.add_constant(known[name])
        buf = bufs[k.out]
        h.add_op(Comprehension(k.out, TensorType(buf.dtype, {d: buf.sizes[d] for d in buf.layout}),
                               k.body, k.reduce, k.rdims))
        h.outputs.append(Port(k.out, buf.layout))
        out[k.out] = run_graph(h, {})[k.out]
    return out


def _matmul(k=64, n=40):   # (int8 quantizes contractions 32 products deep or more)
    from onnx import TensorProto as TP
    from onnx import helper
    from support import one_output_model

    w = np.random.default_rng(2).standard_normal((k, n)).astype(np.float32)
    x = np.random.default_rng(1).standard_normal((16, k)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    return one_output_model(nodes, [("x", TP.FLOAT, [16, k])], [("w", w)]), {"x": x}


def _panel(w: np.ndarray) -> np.ndarray:
    """gemm.pack_b of a [K, N] matmul's weights: [1, N blocks, K, PACK], zero-padded."""
    from mlpack.codegen.targets.cpu.gemm import PACK

    kk, n = w.shape
    padded = np.zeros((kk, -(-n // PACK) * PACK), w.dtype)
    padded[:, :n] = w
    return padded.reshape(kk, -1, PACK).transpose(1, 0, 2)[None]


@pytest.mark.parametrize("precision, target", [("fp32", "x86_64-v2"), ("fp16", "x86_64-v2"),
                                               ("fp16", "x86_64-v3"), ("bf16", "x86_64-v4-bf16"),
                                               ("int8", "aarch64-dotprod"),
                                               ("int8", "x86_64-v4-vnni"),
                                               ("int8", "x86_64-v3")])
def test_the_panels_prepared_at_load_are_the_packed_layout(precision, target):
    """The prepare kernels of a matmul's weights write gemm.py's layouts: pack_b's blocks, in
    the weights' dtype where the micro-kernel widens it (f16 without F16C as f32), bf16 pairs
    and int8 quads (pack_pairs), pmaddwd's quads split into their pairs (pair_halves, x86
    without VNNI) and SDOT's column correction (signed_correction)."""
    from mlpack.codegen.targets.cpu.gemm import pack_pairs, pair_halves, signed_correction

    m, feeds = _matmul()
    g = compile_onnx(m)
    calibration = precisions.calibrate("int8", g, [feeds]) if precision == "int8" else None
    g = precisions.apply(precision, g, calibration)
    got = _prepared_by_interpreter(g, target)
    [name] = [n for n in got if "#pack" in n and not n.endswith("#init")]
    [w] = [c for c in g.constants.values() if c.data.size == 64 * 40 and
           c.type.dtype == {"fp32": "f32", "fp16": "f16", "bf16": "bf16", "int8": "i8"}[precision]]
    want = _panel(w.data if w.data.shape == (64, 40) else w.data.T)   # ([N, K] per channel)
    if precision == "fp16" and target == "x86_64-v2":
        want = want.astype(np.float32)   # (no F16C: the panel is widened when packed)
    group = {"bf16": 2, "int8": 4}.get(precision)
    if group:
        want = pack_pairs(want, [64], 0, group)
    if precision == "int8" and target == "x86_64-v3":
        want = pair_halves(want)
    np.testing.assert_array_equal(got[name].reshape(want.shape), want)
    if target == "aarch64-dotprod":
        np.testing.assert_array_equal(got[f"{name}#init"].reshape(1, -1, 16),
                                      signed_correction(want))
