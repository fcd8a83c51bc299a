"""The micro-kernel's K loop keeps its whole tile in vector registers (microkernel.py): the
rows and panels advanced before the loop and walked by offsets carried beside its counter, a
whole tile's panels at constant steps from its first. Written as offsets of the counter, the
loop held a pointer per panel, the counter and a countdown, and on x86-64 v4 a 6x4 tile of
AVX-512 accumulators (24 of 32 registers) was spilled and rotated through the stack in every
step (GoogLeNet 10-13% slower). Checked in the assembly LLVM emits for the target, which needs
no host that runs it."""

from __future__ import annotations

import os
import re
import sys

import pytest
from onnx import TensorProto as TP
from onnx import helper

from mlpack.codegen.compile import compile_onnx
from mlpack.codegen.targets.cpu import compile as cpu_compile
from mlpack.codegen.targets.cpu import module, objects
from mlpack.codegen.targets.cpu.target import get_target

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from plan_runner import rand  # noqa: E402

F = TP.FLOAT
_VECTOR_ON_STACK = re.compile(r"[xyz]mm\d+.*\(%rsp\)|\(%rsp\).*[xyz]mm\d+")


def _conv(cin: int, cout: int, size: int):
    w = helper.make_tensor("w", F, [cout, cin, 3, 3], rand(cout, cin, 3, 3).ravel().tolist())
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "c",
                          [helper.make_tensor_value_info("x", F, [1, cin, size, size])],
                          [helper.make_tensor_value_info("y", F, None)], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _k_loop(target: str, model, monkeypatch, graph=None, product: str = "vfmadd") -> list[str]:
    """The instructions of the loop block with the most ``product`` instructions (multiply-
    adds), up to its branch; ``graph``: the model's graph to build instead (a precision's)."""
    texts = []
    build = module.build_module
    monkeypatch.setattr(cpu_compile, "build_module",
                        lambda *a, **k: texts.extend(build(*a, **{**k, "parts": 1})) or texts)
    cpu_compile.compile_cpu(graph or compile_onnx(model), target)
    t = get_target(target)
    tm = objects.machine(t.triple, t.cpu, t.feature_string)
    asm = tm.emit_assembly(objects.optimize(texts[0], tm))
    bodies = []
    for block in re.split(r"\n(?=\.LBB\d+_\d+:)", asm):
        lines = []
        for line in block.splitlines():
            if line.startswith("\tj"):
                break
            lines.append(line)
        bodies.append(lines)
    return max(bodies, key=lambda lines: sum(product in line for line in lines))


@pytest.mark.parametrize("cin, cout, size", [(64, 192, 28), (96, 96, 14)])
def test_a_wide_tiles_k_loop_keeps_its_accumulators_in_registers(cin, cout, size, monkeypatch):
    loop = _k_loop("x86_64-v4", _conv(cin, cout, size), monkeypatch)
    fmas = sum("vfmadd231ps" in line for line in loop)
    assert fmas >= 24   # (a 6x4 or 9x3 tile of 16-lane vectors)
    spills = [line.strip() for line in loop if _VECTOR_ON_STACK.search(line)]
    assert not spills, spills


def _matmul(m: int, k: int, n: int):
    w = helper.make_tensor("w", F, [k, n], rand(k, n).ravel().tolist())
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "m",
                          [helper.make_tensor_value_info("x", F, [m, k])],
                          [helper.make_tensor_value_info("y", F, None)], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("k, fetched", [(768, True), (256, False)])
def test_weights_past_l2_are_fetched_a_chunk_ahead_in_the_k_loop(k, fetched, monkeypatch):
    """GPT-2's 768 x 768 weights (2.4 MB, past a core's L2) come from memory once per group of
    rows: the K loop fetches a line of the next chunk's panel into L2 (prefetcht1) beside its
    multiply-adds, still with its whole tile in registers; 256 x 768 (768 KiB) stays in L2
    and is not fetched."""
    loop = _k_loop("x86_64-v4", _matmul(128, k, 768), monkeypatch)
    assert sum("vfmadd231ps" in line for line in loop) >= 24
    assert any("prefetcht1" in line for line in loop) == fetched
    assert not [line for line in loop if _VECTOR_ON_STACK.search(line)]


@pytest.mark.parametrize("precision, target, product", [
    ("bf16", "x86_64-v4-bf16", "vdpbf16ps"), ("int8", "x86_64-v4-vnni", "vpdpbusd")])
def test_a_precisions_products_fetch_the_next_chunk_too(precision, target, product,
                                                        monkeypatch):
    """bf16 pairs and int8 quads read 64 bytes of each panel a step, as f32 does: their K loop
    fetches the next chunk's slice of 768 x 3072 weights (4.7 and 2.4 MB) the same way."""
    from mlpack.codegen import precisions

    g = compile_onnx(_matmul(128, 768, 3072))
    calib = [{"x": rand(128, 768, seed=s)} for s in (1, 2)] if precision == "int8" else None
    g = precisions.apply(precision, g, precisions.calibrate(precision, g, calib)
                         if calib else None)
    loop = _k_loop(target, None, monkeypatch, graph=g, product=product)
    assert sum(product in line for line in loop) >= 12
    assert any("prefetcht1" in line for line in loop)
