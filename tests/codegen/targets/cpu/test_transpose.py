"""B panels packed by transposing 16 x 16 blocks in registers (codegen/targets/cpu/transpose.py).

The shuffle network, compiled for this host, transposes a block; attention's scores (B = the
keys, contiguous along K) and a Gemm with transB pack this way, with N and K that are not
multiples of 16 (columns past N zero, a last K block loaded masked), batch dims and a symbolic
sequence, and match float64 on every x86-64 level the host runs (fp32 tolerances); a B that
is contiguous along N keeps the plain map kernel.
"""

from __future__ import annotations

import ctypes
import os
import sys

import numpy as np
import pytest
from llvmlite import binding as llvm
from llvmlite import ir
from mlpack.codegen.compile import compile_onnx
from mlpack.codegen.targets.cpu import compile_cpu
from mlpack.codegen.targets.cpu.transpose import PACK, transpose_rows
from onnx import TensorProto as TP
from onnx import helper

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# tests/codegen/targets/plan_runner.py
from plan_runner import ATOL, HOST_TARGETS, RTOL, rand, run_plan

F = TP.FLOAT


def test_the_shuffles_transpose_a_block():
    vty = ir.VectorType(ir.FloatType(), PACK)
    module = ir.Module("t")
    module.triple = llvm.get_process_triple()
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ir.PointerType(), ir.PointerType()]), "t")
    b = ir.IRBuilder(fn.append_basic_block())
    src, dst = fn.args
    rows = [b.load(b.gep(src, [ir.Constant(ir.IntType(64), PACK * i)], source_etype=ir.FloatType()),
                   typ=vty, align=4) for i in range(PACK)]
    for i, row in enumerate(transpose_rows(b, rows)):
        b.store(row, b.gep(dst, [ir.Constant(ir.IntType(64), PACK * i)], source_etype=ir.FloatType()),
                align=4)
    b.ret_void()
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    tm = llvm.Target.from_default_triple().create_target_machine(opt=2)
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(str(module)), tm)
    engine.finalize_object()
    run = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(engine.get_function_address("t"))
    a = np.arange(PACK * PACK, dtype=np.float32).reshape(PACK, PACK)
    out = np.zeros_like(a)
    run(a.ctypes.data, out.ctypes.data)
    np.testing.assert_array_equal(out, a.T)


def scores_model(dh: int, heads: int = 3, dyn: bool = True):
    """q[b, s, h*dh] and k[b, s, h*dh] (one fused row per token, as GPT-2's projection) to the
    scores q.k^T per head: B is the keys, K (dh) contiguous, N (tokens) a row apart."""
    shape = ["B" if dyn else 2, "S" if dyn else 37, heads * dh]
    split = helper.make_tensor("split", TP.INT64, [4], [0, 0, heads, dh])
    nodes = [helper.make_node("Reshape", [t, "split"], [t + "4"]) for t in "qk"]
    nodes += [helper.make_node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
              helper.make_node("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
              helper.make_node("MatMul", ["qt", "kt"], ["y"])]
    g = helper.make_graph(nodes, "scores", [helper.make_tensor_value_info(t, F, shape) for t in "qk"],
                          [helper.make_tensor_value_info("y", F, None)], [split])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def gemm_trans_b_model(m: int, k: int, n: int):
    """x[m, k] times a weight stored [n, k] (transB): its panel is packed once, at load."""
    w = helper.make_tensor("w", F, [n, k], rand(n, k, seed=3).ravel().tolist())
    g = helper.make_graph([helper.make_node("Gemm", ["x", "w"], ["y"], transB=1)], "g",
                          [helper.make_tensor_value_info("x", F, [m, k])],
                          [helper.make_tensor_value_info("y", F, None)], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _transposing(g, target) -> list[str]:
    """The kernels of ``g`` that pack by transposing blocks."""
    from mlpack.codegen.targets.cpu import contraction
    from mlpack.codegen.targets.cpu.kernels import build_kernels
    from mlpack.codegen.targets.cpu.plan import tensor_buffers
    from mlpack.codegen.targets.cpu.target import get_target
    bufs = tensor_buffers(g)
    return [k.name for k in contraction.apply(g, build_kernels(g, bufs), bufs, get_target(target))
            if k.strategy == "transpose"]


@pytest.mark.parametrize("target", HOST_TARGETS)
@pytest.mark.parametrize("dh, seq", [(16, 37), (40, 37), (8, 5), (64, 33)])
def test_attention_scores_pack_transposed_and_match_float64(target, dh, seq):
    m = scores_model(dh)
    g = compile_onnx(m)
    assert _transposing(g, target), "the keys' pack did not take the transposed kernel"
    q, k = rand(2, seq, 3 * dh, seed=1), rand(2, seq, 3 * dh, seed=2)
    got = run_plan(compile_cpu(g, target), g, {"q": q, "k": k})[g.outputs[0].name]
    q4, k4 = (t.astype(np.float64).reshape(2, seq, 3, dh) for t in (q, k))
    np.testing.assert_allclose(got, np.einsum("bmhk,bnhk->bhmn", q4, k4), rtol=RTOL, atol=ATOL)


def sdpa_model(dh: int, heads: int = 2):
    """Attention as torch exports scaled_dot_product_attention: q, k and v slices of one fused
    projection p[b, s, 3*h*dh], q and k^T each multiplied by dh ** -0.25, softmax, P.V."""
    c = helper.make_tensor("c", F, [], [dh ** -0.25])
    split = helper.make_tensor("split", TP.INT64, [4], [0, 0, heads, dh])
    nodes = [helper.make_node("Split", ["p"], ["q", "k", "v"], axis=2, num_outputs=3)]
    nodes += [helper.make_node("Reshape", [t, "split"], [t + "4"]) for t in "qkv"]
    nodes += [helper.make_node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
              helper.make_node("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
              helper.make_node("Transpose", ["v4"], ["vt"], perm=[0, 2, 1, 3]),
              helper.make_node("Mul", ["qt", "c"], ["qs"]),
              helper.make_node("Mul", ["kt", "c"], ["ks"]),
              helper.make_node("MatMul", ["qs", "ks"], ["s"]),
              helper.make_node("Softmax", ["s"], ["a"], axis=-1),
              helper.make_node("MatMul", ["a", "vt"], ["y"])]
    g = helper.make_graph(nodes, "sdpa", [helper.make_tensor_value_info("p", F, ["B", "S", 3 * heads * dh])],
                          [helper.make_tensor_value_info("y", F, None)], [c, split])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)


@pytest.mark.parametrize("target", HOST_TARGETS)
def test_scaled_attention_reads_the_projection_and_scales_its_scores(target):
    """Q and K^T scaled by maps of their own (scale_after, passes/divide_after.py): the scores'
    product reads both slices of the projection in place, its keys packed transposed, and no
    kernel writes a scaled copy of either; outputs match float64 at 37 tokens."""
    from mlpack.codegen.targets.cpu.compile import schedule_kernels
    from mlpack.codegen.targets.cpu.target import get_target

    dh, seq = 16, 37
    g = compile_onnx(sdpa_model(dh))
    assert _transposing(g, target), "the keys' pack did not take the transposed kernel"
    _, kernels, _, _, _ = schedule_kernels(g, get_target(target))
    gemm_reads = {r for k in kernels if k.strategy == "gemm" for r in k.reads}
    assert g.inputs[0].name in gemm_reads   # (the projection, read in place as A)
    p = rand(2, seq, 6 * dh, seed=5)
    got = run_plan(compile_cpu(g, target), g, {"p": p})[g.outputs[0].name]
    q, k, v = (t.reshape(2, seq, 2, dh).transpose(0, 2, 1, 3)
               for t in np.split(p.astype(np.float64), 3, axis=2))
    s = np.einsum("bhmk,bhnk->bhmn", q, k) / np.sqrt(dh)
    a = np.exp(s - s.max(-1, keepdims=True))
    want = (a / a.sum(-1, keepdims=True)) @ v
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("target", HOST_TARGETS)
def test_a_weight_stored_n_by_k_is_packed_transposed_at_load(target):
    m = gemm_trans_b_model(9, 21, 35)
    g = compile_onnx(m)
    assert _transposing(g, target)
    x = rand(9, 21, seed=4)
    got = run_plan(compile_cpu(g, target), g, {"x": x})[g.outputs[0].name]
    w = rand(35, 21, seed=3)
    np.testing.assert_allclose(got, x.astype(np.float64) @ w.astype(np.float64).T, rtol=RTOL, atol=ATOL)


def test_a_b_contiguous_along_n_is_packed_by_the_map_kernel():
    x = helper.make_tensor_value_info("x", F, [2, 9, 13])
    w = helper.make_tensor_value_info("w", F, [2, 13, 37])
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm", [x, w],
                          [helper.make_tensor_value_info("y", F, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    assert _transposing(compile_onnx(m), "x86_64-v4") == []


def test_a_long_k_is_a_loop_of_blocks_not_written_out(monkeypatch):
    """A classifier's weight stored [N, K] with K = 2048: one block's shuffles in a loop and the
    last steps' once, not 128 blocks' (written out, a riscv64 build took LLVM 15 minutes)."""
    from mlpack.codegen.targets.cpu import compile as cpu_compile
    from mlpack.codegen.targets.cpu import module

    texts = []
    build = module.build_module
    monkeypatch.setattr(cpu_compile, "build_module",
                        lambda *a, **k: texts.extend(build(*a, **{**k, "parts": 1})) or texts)
    cpu_compile.compile_cpu(compile_onnx(gemm_trans_b_model(3, 2043, 20)), "x86_64-v3")
    (text,) = texts
    panel = text[text.index("_panel.impl"):]
    panel = panel[:panel.index("\n}\n")]
    rounds = 4 * (PACK // 2)   # shuffle pairs per block: 4 rounds of 8
    assert panel.count("shufflevector") == 2 * 2 * rounds, "not one block in a loop plus the rest"
