"""bf16 products (codegen/targets/cpu/bf16dot.py): the x86_64-v4-bf16 (AVX512_BF16) and
aarch64-bf16 (BFDOT) targets.

The B panel's pair layout is checked element by element; the pass rounds the f32 operand of
every contraction with bf16 weights (one shared copy per tensor) and of nothing else; the
micro-kernel pairs K along the dim A reads at unit stride (a matmul's K, an NHWC convolution's
channels, Winograd's gemm) and, where the host has AVX512_BF16, the kernels run through the plan
runner and match the interpreter's computation of the same rounded operands (bf16 products of
bf16 values are exact in f32; only the f32 sums' order differs) and ONNX Runtime within bf16's
tolerance. Hosts without the feature still compile the kernels and check the schedule.
"""

from __future__ import annotations

import os
import sys

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper

from mlpack.codegen import precisions
from mlpack.codegen.compile import compile_onnx
from mlpack.codegen.targets.cpu import bf16dot, compile_cpu
from mlpack.codegen.targets.cpu.compile import schedule_kernels
from mlpack.codegen.targets.cpu.gemm import pack_pairs
from mlpack.codegen.targets.cpu.target import get_target
from mlpack.spec.ir.interp import run_graph
from support import host_lacks, one_output_model, oracle_outputs

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from plan_runner import rand, run_plan   # noqa: E402  (tests/codegen/targets/plan_runner.py)

TARGET = "x86_64-v4-bf16"
needs_bf16 = pytest.mark.skipif(host_lacks(TARGET) is not None, reason=str(host_lacks(TARGET)))


def test_pairs_are_adjacent_k_of_one_column():
    # panel [batch 1, blocks 2, K = 4 x 6 (loop order), 16 lanes]; pair the second K dim
    panel = np.arange(1 * 2 * 24 * 16, dtype=np.float32).reshape(1, 2, 24, 16)
    out = pack_pairs(panel, [4, 6], 1)
    assert out.shape == (1, 2, 12, 16, 2)
    for blk in range(2):
        for k0 in range(4):
            for k1 in range(0, 6, 2):
                for lane in range(16):
                    got = out[0, blk, k0 * 3 + k1 // 2, lane]
                    want = panel[0, blk, [k0 * 6 + k1, k0 * 6 + k1 + 1], lane]
                    assert (got == want).all()


def _dense(batch=8, k=96, n=48):
    x = rand(batch, k, seed=1)
    w = rand(k, n, seed=2, scale=1 / np.sqrt(k))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    return one_output_model(nodes, [("x", TP.FLOAT, [batch, k])], [("w", w)]), {"x": x}


def _conv(cin=32, mid=48, size=12, k=3):
    """Two convolutions with a relu between: the second reads its input channels-last (the
    layout pass), channels at unit stride, which it pairs; the first reads the NCHW input."""
    x = rand(1, cin, size, size, seed=3)
    w1 = rand(mid, cin, k, k, seed=4, scale=1 / np.sqrt(cin * k * k))
    w2 = rand(32, mid, k, k, seed=5, scale=1 / np.sqrt(mid * k * k))
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], pads=[k // 2] * 4),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"], pads=[k // 2] * 4)]
    return one_output_model(nodes, [("x", TP.FLOAT, list(x.shape))], [("w1", w1), ("w2", w2)]), \
        {"x": x}


def _winograd_chain():
    from test_winograd import chain   # two 3x3 convolutions where Winograd pays
    return chain()


CASES = {"matmul": _dense, "conv 3x3": _conv, "conv 1x1": lambda: _conv(k=1),
         "winograd": _winograd_chain}


def test_the_pass_rounds_each_contractions_activation_once():
    m, _ = _dense()
    g = precisions.apply("bf16", compile_onnx(m))
    out, n = bf16dot.round_activations(g)
    assert n == 1
    copies = [op for op in out.ops if op.out.endswith("#bf16")]
    assert len(copies) == 1 and copies[0].type.dtype == "bf16"
    # fp32 graphs (no bf16 weights) are left alone
    assert bf16dot.round_activations(compile_onnx(m)) == (compile_onnx(m), 0)


@pytest.mark.parametrize("target, dot", [(TARGET, "llvm.x86.avx512bf16.dpbf16ps.512"),
                                         ("aarch64-bf16", "llvm.aarch64.neon.bfdot.v4f32.v8bf16")])
@pytest.mark.parametrize("case", list(CASES))
def test_contractions_multiply_bf16_pairs(case, target, dot):
    m, _ = CASES[case]()
    g = precisions.apply("bf16", compile_onnx(m))
    _, kernels, bufs, _, state = schedule_kernels(g, get_target(target))
    gemms = [k for k in kernels if k.strategy == "gemm"]
    paired = [k for k in gemms if k.gemm.pair is not None]
    # every rounded activation is paired, along a dim A reads at unit stride
    assert state.bf16_products == len(paired) >= 1
    assert all(bufs[k.gemm.a.arg[0]].dtype == "bf16" and k.gemm.dot == dot for k in paired)
    assert all(bufs[k.gemm.a.arg[0]].dtype == "f32" for k in gemms if k.gemm.pair is None)
    # the plain level reads the same bf16 weights without pairing
    plain = "x86_64-v4" if target == TARGET else "aarch64"
    _, kernels, _, _, state = schedule_kernels(g, get_target(plain))
    assert state.bf16_products == 0
    assert all(k.gemm.pair is None for k in kernels if k.strategy == "gemm")


@needs_bf16
@pytest.mark.parametrize("case", list(CASES))
def test_bf16_products_match_the_rounded_computation_and_onnxruntime(case):
    m, feeds = CASES[case]()
    g = precisions.apply("bf16", compile_onnx(m))
    art = compile_cpu(g, TARGET)
    assert "bf16_products" in art.inexact
    got = run_plan(art, g, feeds)[g.outputs[0].name]
    # the same products by the interpreter: the graph as the target rewrote it (weights and
    # activations in bf16, Winograd's Wt too), whose products of bf16 values are exact in f32
    rewritten = schedule_kernels(g, get_target(TARGET))[0]
    exact = run_graph(rewritten, feeds)[g.outputs[0].name]
    scale = np.abs(exact).max()   # (f32 sums in another order, and vdpbf16ps rounds its pair
    # of products as the CPU's maker defines; Winograd's transforms amplify both: 1.05e-4 of the
    # scale on the conv 3x3 on an AMD Zen 4, still far below bf16's own rounding, asserted next)
    assert np.abs(got - exact).max() / scale < 4e-4
    want = oracle_outputs(m, feeds)[0]
    err = np.abs(got - want).max() / np.abs(want).max()
    assert 1e-4 < err < 2 ** -5   # bf16's rounding of both operands shows (two layers), no more


def test_operand_values_round_to_nearest_even():
    x = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, -2.5e-3], np.float32)
    g = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    assert g[0] == 1.0 and g[1] == 1 + 2 ** -6   # ties to even
