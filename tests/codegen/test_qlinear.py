"""QLinearConv, QLinearMatMul, ConvInteger and MatMulInteger on the int8 kernels
(codegen/precisions/qlinear.py).

Each op's i32 sum becomes a u8 x s8 sum plus per-row and per-column corrections, which must give
the same integers: the rewritten graph's outputs equal ONNX's reference evaluator's bit for bit
(its int32 sums and float64 requantization are what the importer states), and so do the
compiled kernels of every level this host runs, and ONNX Runtime's with its exact int8 kernels
(on x86 CPUs without VNNI its u8 x s8 kernels otherwise add pairs of products in saturating 16
bits, ``vpmaddubsw``: support.oracle_outputs).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import support
from mlpack.codegen import precisions
from mlpack.codegen.compile import compile_onnx
from mlpack.codegen.precisions import int8, qlinear
from mlpack.codegen.targets.cpu import compile_cpu
from mlpack.codegen.targets.cpu.compile import schedule_kernels
from mlpack.codegen.targets.cpu.target import get_target
from mlpack.spec.ir.interp import run_graph

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "targets"))
from plan_runner import run_plan   # noqa: E402  (tests/codegen/targets/plan_runner.py)

Q = support.load_models_module("quantized")
CASES = {
    "QLinearConv s8": lambda: Q.qlinear_conv(),
    "QLinearConv s8, zero point per channel": lambda: Q.qlinear_conv(
        w_zero=np.arange(24) % 7 - 3),
    "QLinearConv u8, zero point per channel, strided": lambda: Q.qlinear_conv(
        np.uint8, np.arange(24) + 100, cin=20, stride=2),
    "QLinearMatMul s8": lambda: Q.qlinear_matmul(),
    "QLinearMatMul u8": lambda: Q.qlinear_matmul(np.uint8, 7),
    "MatMulInteger u8": lambda: Q.matmul_integer(np.uint8, 3),
    "MatMulInteger s8": lambda: Q.matmul_integer(np.int8),
    "ConvInteger u8": lambda: Q.conv_integer(),
    "ConvInteger s8, zero point": lambda: Q.conv_integer(np.int8, 5),
}


def _products(g):
    """The (activation dtype, weight dtype) of each i32 sum's product of two reads."""
    out = []
    for op in g.ops:
        if getattr(op, "reduce", None) == "sum" and op.type.dtype == "i32" \
                and op.body.op == "mul":
            reads = [a.args[0] for a in op.body.args if a.op == "cast" and a.args[0].op == "read"]
            out.append(tuple(r.dtype for r in reads))
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_the_sum_is_u8_by_s8_and_gives_onnx_references_integers(case):
    model, feeds = CASES[case]()
    g = compile_onnx(model)
    assert int8.quantizes(g) and qlinear.has_integer_sums(g)
    out = precisions.apply("int8", g, {})
    assert ("u8", "i8") in _products(out), _products(out)
    [want] = support.oracle_outputs(model, feeds, "reference")
    got = run_graph(out, feeds)["y"]
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("case", list(CASES))
def test_every_level_multiplies_them_with_its_product_instruction(case):
    model, feeds = CASES[case]()
    g = precisions.apply("int8", compile_onnx(model), {})
    [want] = support.oracle_outputs(model, feeds, "reference")
    for target, dot in (("x86_64-v4-vnni", "vpdpbusd"), ("x86_64-v3", "pmadd"),
                        ("x86_64-v2", "pmadd"), ("aarch64-dotprod", "sdot")):
        _, kernels, _, _, _ = schedule_kernels(g, get_target(target))
        ints = [k for k in kernels if k.acc_dtype == "i32" and k.strategy == "gemm"]
        assert ints and all(dot in k.gemm.dot for k in ints), target
    for target in ("x86_64-v2", "x86_64-v3"):
        np.testing.assert_array_equal(run_plan(compile_cpu(g, target), g, feeds)["y"], want)


@pytest.mark.parametrize("case", list(CASES))
def test_onnx_runtime_computes_the_same_integers_with_its_exact_kernels(case):
    model, feeds = CASES[case]()
    g = precisions.apply("int8", compile_onnx(model), {})
    [want] = support.oracle_outputs(model, feeds, "ort-exact")
    np.testing.assert_array_equal(run_graph(g, feeds)["y"], want)


def test_a_weight_span_over_256_values_keeps_the_widened_sum():
    """MatMulInteger of u8 weights with a per-column zero point stays an 8-bit product; an i32
    weight that spans more than a byte per channel (no 8-bit form) keeps the i32 sum."""
    from dataclasses import replace

    model, feeds = Q.matmul_integer(np.uint8, 3)
    g = compile_onnx(model)
    [w] = [n for n, c in g.constants.items() if c.type.dtype == "i32"]
    wide = g.constants[w].data.copy()
    wide[0, 0] = 1000
    g2 = replace(g, constants={**g.constants, w: replace(g.constants[w], data=wide)})
    assert qlinear.has_integer_sums(g) and not qlinear.has_integer_sums(g2)
    assert qlinear.integer_sums(g2) is g2
