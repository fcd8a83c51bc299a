"""int8 contractions on the cpu target (codegen/precisions/int8.py, contraction.py's
``_int8_view``, microkernel.py's ``_quad_step`` and ``_int_step``).

The B panel's quad layout is checked element by element. Every int8 contraction becomes a GEMM
kernel: on x86_64-v4-vnni K is grouped in fours along the dim A reads at unit stride and
multiplied with ``vpdpbusd`` (aarch64-i8mm: ``USDOT``); the x86 levels without VNNI take the
same quads as two i16 pairs each (``pmaddwd``); aarch64 without DotProd widens u8 and s8 to i32
lanes. The sums are exact
integers, so each artifact that runs here must give the interpreter's outputs of the same int8
graph (the epilogues' f32 arithmetic is the same sequence of operations), whatever the level.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper

from mlpack.codegen import precisions
from mlpack.codegen.compile import compile_onnx
from mlpack.codegen.targets.cpu import compile_cpu
from mlpack.codegen.targets.cpu.compile import schedule_kernels
from mlpack.codegen.targets.cpu.gemm import pack_pairs, pair_halves
from mlpack.codegen.targets.cpu.target import get_target
from mlpack.spec.ir.interp import run_graph
from support import host_lacks, host_params, one_output_model

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from plan_runner import rand, run_plan   # noqa: E402  (tests/codegen/targets/plan_runner.py)

VNNI = "x86_64-v4-vnni"
X86 = ("x86_64-v2", "x86_64-v3", "x86_64-v4", VNNI)   # pmaddwd pairs, then vpdpbusd quads


def test_pair_halves_split_each_quad_into_its_two_pairs():
    quads = np.arange(2 * 3 * 16 * 4, dtype=np.int8).reshape(1, 2, 3, 16, 4)
    halves = pair_halves(quads)
    assert halves.shape == (1, 2, 3, 2, 16, 2)
    for h in range(2):
        assert (halves[:, :, :, h] == quads[..., 2 * h:2 * h + 2]).all()


def test_quads_are_four_adjacent_k_of_one_column():
    panel = np.arange(1 * 2 * 24 * 16, dtype=np.float32).reshape(1, 2, 24, 16)
    out = pack_pairs(panel, [3, 8], 1, 4)
    assert out.shape == (1, 2, 6, 16, 4)
    for blk in range(2):
        for k0 in range(3):
            for k1 in range(0, 8, 4):
                for lane in range(16):
                    want = panel[0, blk, [k0 * 8 + k1 + j for j in range(4)], lane]
                    assert (out[0, blk, k0 * 2 + k1 // 4, lane] == want).all()


def _dense(batch=6, k=96, n=40):
    x = rand(batch, k, seed=1)
    w = rand(k, n, seed=2, scale=1 / np.sqrt(k))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    return one_output_model(nodes, [("x", TP.FLOAT, [batch, k])], [("w", w)]), {"x": x}


def _conv(cin=32, mid=36, size=9, k=3):
    """Two padded convolutions with a relu between (the second's input quantized in the first's
    epilogue, its zero point the padding)."""
    x = rand(1, cin, size, size, seed=3)
    w1 = rand(mid, cin, k, k, seed=4, scale=1 / np.sqrt(cin * k * k))
    w2 = rand(20, mid, k, k, seed=5, scale=1 / np.sqrt(mid * k * k))
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], pads=[k // 2] * 4),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"], pads=[k // 2] * 4, strides=[2, 2])]
    return one_output_model(nodes, [("x", TP.FLOAT, list(x.shape))], [("w1", w1), ("w2", w2)]), \
        {"x": x}


CASES = {"matmul": _dense, "conv 3x3": _conv, "conv 1x1": lambda: _conv(k=1)}


def _int8(case):
    m, feeds = CASES[case]()
    g = compile_onnx(m)
    calib = [{"x": rand(*feeds["x"].shape, seed=s)} for s in (11, 12, 13)]
    return precisions.apply("int8", g, precisions.calibrate("int8", g, calib)), feeds


@pytest.mark.parametrize("case", list(CASES))
def test_every_int8_contraction_is_a_gemm_on_the_levels_product_instruction(case):
    g, _ = _int8(case)
    for target, dot in ((VNNI, "llvm.x86.avx512.vpdpbusd.512"),
                        ("x86_64-v4", "llvm.x86.avx512.pmaddw.d.512"),
                        ("x86_64-v3", "llvm.x86.avx2.pmadd.wd"),
                        ("x86_64-v2", "llvm.x86.sse2.pmadd.wd"),
                        ("aarch64-i8mm", "llvm.aarch64.neon.usdot.v4i32.v16i8"),
                        ("aarch64-dotprod", "llvm.aarch64.neon.sdot.v4i32.v16i8"), ("aarch64", None)):
        _, kernels, bufs, _, _ = schedule_kernels(g, get_target(target))
        ints = [k for k in kernels if k.acc_dtype == "i32" and not k.prepare]   # (not SDOT's correction)
        assert ints and all(k.strategy == "gemm" for k in ints)
        # (pmaddwd reads A's copy widened to u16, each pair of K one 32-bit broadcast)
        assert all(bufs[k.gemm.packed].dtype == "i8" and bufs[k.gemm.a.arg[0]].dtype
                   == ("u16" if dot and "pmadd" in dot else "u8") for k in ints), target
        assert all(k.gemm.dot == dot and (k.gemm.pair is not None) == (dot is not None)
                   for k in ints), target


@pytest.mark.parametrize("target", host_params(*X86))
@pytest.mark.parametrize("case", list(CASES))
def test_int8_kernels_give_the_interpreters_outputs(case, target):
    g, feeds = _int8(case)
    got = run_plan(compile_cpu(g, target), g, feeds)[g.outputs[0].name]
    want = run_graph(g, feeds)[g.outputs[0].name]
    scale = np.abs(want).max()
    # integer sums are exact; what may differ is an f32 epilogue's last bit, and through a
    # requantization that bit can move one quantization step (1/255 of the range)
    assert np.abs(got - want).max() <= 2e-2 * scale
    assert np.mean(np.abs(got - want) <= 1e-6 * scale) > 0.98


def test_every_level_computes_the_same_integers_chunked_k_included(tmp_path, patient_emulation,
                                                                   monkeypatch):
    """A convolution whose K runs in several chunks (the accumulators go through the tile
    buffer, SDOT's correction starting them), built for every int8 level: each one this host
    runs, natively or under qemu, validates with the same error as the others. (A packed
    panel's chunk is an L2's worth, hundreds of KB: the chunks are made L1-sized here so that a
    small model has several; it compiles in this process, where the patch holds.)"""
    import onnx

    from mlpack.codegen.targets.cpu import contraction
    from mlpack.packager.build import build
    from support import emulated

    monkeypatch.setattr(contraction, "L2_PANEL_BYTES", contraction.L1_PANEL_BYTES)
    m, _ = _conv(cin=64, mid=256, size=6)
    onnx.save(m, tmp_path / "conv.onnx")
    targets = [*X86, "aarch64", "aarch64-dotprod", "aarch64-i8mm"]
    g = precisions.apply("int8", compile_onnx(m), precisions.calibrate(
        "int8", compile_onnx(m), [{"x": rand(1, 64, 6, 6, seed=s)} for s in (1, 2)]))
    _, kernels, _, _, _ = schedule_kernels(g, get_target("aarch64-dotprod"))
    assert any(k.gemm.init is not None and k.gemm.kc < 256 for k in kernels
               if k.strategy == "gemm" and k.acc_dtype == "i32")
    report = build(tmp_path / "conv.onnx", tmp_path / "conv.mlpack", targets=targets,
                   precisions=["int8"])
    ran = {a.target: a.max_error for a in report.artifacts if a.precision == "int8" and a.validated}
    for t in targets:
        if host_lacks(t) is None or emulated(t):
            assert t in ran, t
    assert len(ran) >= 2 and max(ran.values()) <= min(ran.values()) * (1 + 1e-3), ran
