"""rowblocks.py: attention's scores, softmax and P.V run a block of query rows at a time as one
kernel, the score matrix never stored whole; the artifact agrees with ONNX Runtime and a
float64 NumPy reference (fp32 tolerances, plan_runner.RTOL / ATOL) on every x86 level the host
runs, with ragged last blocks, a causal mask, a dynamic batch and several heads."""

from __future__ import annotations

import os
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from mlpack.codegen.compile import compile_onnx
from mlpack.codegen.targets.cpu import compile_cpu, rowblocks
from mlpack.codegen.targets.cpu.compile import schedule_kernels
from mlpack.codegen.targets.cpu.target import get_target
from mlpack.spec.ir import parse_graph

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))   # plan_runner
from plan_runner import ATOL, HOST_TARGETS, RTOL, eval_expr, rand, run_plan  # noqa: E402

HEADS, S, T, D = 3, 302, 700, 64   # scores 3 x 302 x 700 floats: 2.5 MB, over CACHE_BYTES


def _attention(batch, mask: bool) -> onnx.ModelProto:
    """softmax(Q K^T / 8 (+ a causal mask)) V over HEADS heads, as torch exports it."""
    n = batch if isinstance(batch, int) else "batch"
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["qk"]),
             helper.make_node("Mul", ["qk", "scale"], ["scaled"])]
    scores = "scaled"
    inits = [helper.make_tensor("scale", TensorProto.FLOAT, [], [0.125])]
    if mask:   # query s sees keys t <= s + T - S (a decoder's cache of T - S tokens before)
        causal = np.where(np.arange(T)[None, :] <= np.arange(S)[:, None] + T - S, 0, -1e9)
        inits.append(helper.make_tensor("mask", TensorProto.FLOAT, [S, T],
                                        causal.astype(np.float32).ravel()))
        nodes.append(helper.make_node("Add", ["scaled", "mask"], ["masked"]))
        scores = "masked"
    nodes += [helper.make_node("Softmax", [scores], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["o"]),
              helper.make_node("Transpose", ["o"], ["y"], perm=[0, 2, 1, 3])]
    g = helper.make_graph(
        nodes, "attention",
        [helper.make_tensor_value_info("q", TensorProto.FLOAT, [n, HEADS, S, D]),
         helper.make_tensor_value_info("k", TensorProto.FLOAT, [n, HEADS, T, D]),
         helper.make_tensor_value_info("v", TensorProto.FLOAT, [n, HEADS, T, D])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, S, HEADS, D])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _reference(feeds: dict, mask: bool) -> np.ndarray:
    q, k, v = (feeds[x].astype(np.float64) for x in "qkv")
    s = q @ k.transpose(0, 1, 3, 2) / 8
    if mask:
        s = np.where(np.arange(T)[None, :] <= np.arange(S)[:, None] + T - S, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True) @ v).transpose(0, 2, 1, 3)


def _feeds(n: int) -> dict:
    return {"q": rand(n, HEADS, S, D, seed=1), "k": rand(n, HEADS, T, D, seed=2),
            "v": rand(n, HEADS, T, D, seed=3)}


def _tile(g, target: str) -> rowblocks.BlockTileKernel:
    _, kernels, _, _, _ = schedule_kernels(g, get_target(target))
    (tile,) = [k for k in kernels if isinstance(k, rowblocks.BlockTileKernel)]
    return tile


@pytest.mark.parametrize("target", HOST_TARGETS)
@pytest.mark.parametrize("batch, mask", [(1, False), (2, True), ("batch", True)])
def test_attention_runs_a_block_of_query_rows_at_a_time(target, batch, mask):
    from support import oracle_outputs

    model = _attention(batch, mask)
    g = compile_onnx(model)
    tile = _tile(g, target)
    gemms = [tile.members[j] for j in tile.gemm_members]
    assert len(gemms) == 2 and all(m.ranged for m in tile.members)
    # the scores and the exponentials are a block's, in the scratch; the output in place
    scores = gemms[0].out
    assert scores in tile.locals and gemms[1].out not in tile.locals
    assert tile.height % gemms[0].gemm.mr == 0 and S % tile.height   # a ragged last block
    assert tile.slice_bytes.value < 2 * tile.height * T * 4 + 4096
    art = compile_cpu(g, target)
    feeds = _feeds(2 if batch == "batch" else batch)
    got = run_plan(art, g, feeds)["y"]
    np.testing.assert_allclose(got, oracle_outputs(model, feeds)[0], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(got, _reference(feeds, mask), rtol=RTOL, atol=ATOL)
    if batch == "batch":   # the scratch does not grow with the batch: the scores did
        whole = compile_cpu(g, target, disabled={"row_blocks"})
        syms = {"batch": 16}
        assert eval_expr(art.plan["arena_size"], syms) < 0.3 * eval_expr(
            whole.plan["arena_size"], syms)
        np.testing.assert_allclose(run_plan(whole, g, feeds)["y"], got, rtol=RTOL, atol=ATOL)


def test_short_sequences_and_a_stored_softmax_get_no_row_block():
    """Scores that fit in cache stay whole (a block would only add calls), and so do scores
    whose softmax is an output (the whole matrix is then the result)."""
    small = parse_graph('''graph "short" {
  in %q: f32{h=4, s=128, d=64} (h, s, d)
  in %k: f32{h=4, t=128, d=64} (h, t, d)
  %qk: f32{h=4, s=128, t=128} = sum{e=64} %q[h=h, s=s, d=e] * %k[h=h, t=t, d=e]
  %m: f32{h=4, s=128} = max{u=128} %qk[h=h, s=s, t=u]
  %e: f32{h=4, s=128, t=128} = exp(%qk[h=h, s=s, t=t] - %m[h=h, s=s])
  %z: f32{h=4, s=128} = sum{u=128} %e[h=h, s=s, t=u]
  out %z (h, s)
}''')
    assert rowblocks.find_row_blocks(small) == []
    stored = parse_graph('''graph "stored" {
  in %q: f32{h=4, s=512, d=64} (h, s, d)
  in %k: f32{h=4, t=512, d=64} (h, t, d)
  %qk: f32{h=4, s=512, t=512} = sum{e=64} %q[h=h, s=s, d=e] * %k[h=h, t=t, d=e]
  %m: f32{h=4, s=512} = max{u=512} %qk[h=h, s=s, t=u]
  %e: f32{h=4, s=512, t=512} = exp(%qk[h=h, s=s, t=t] - %m[h=h, s=s])
  out %e (h, s, t)
}''')
    assert rowblocks.find_row_blocks(stored) == []


def test_a_block_is_the_rows_r_and_its_contractions_m():
    """The span runs from the scores through every reader of the exponentials and the maps
    after that read it (the division; not the graph's output): its rows are (h, s), the block
    cuts s, read by one operand of each contraction (their M); h is read by both (their
    batch)."""
    g = parse_graph('''graph "attn" {
  in %q: f32{h=4, s=512, d=64} (h, s, d)
  in %k: f32{h=4, t=512, d=64} (h, t, d)
  in %v: f32{h=4, t=512, d=64} (h, t, d)
  %qk: f32{h=4, s=512, t=512} = sum{e=64} %q[h=h, s=s, d=e] * %k[h=h, t=t, d=e]
  %m: f32{h=4, s=512, t=1} = max{u=512} %qk[h=h, s=s, t=u]
  %e: f32{h=4, s=512, t=512} = exp(%qk[h=h, s=s, t=t] - %m[h=h, s=s, t=0])
  %z: f32{h=4, s=512, t=1} = sum{u=512} %e[h=h, s=s, t=u]
  %pv: f32{h=4, s=512, d=64} = sum{u=512} %e[h=h, s=s, t=u] * %v[h=h, t=u, d=d]
  %o: f32{s=512, h=4, d=64} = div(%pv[h=h, s=s, d=d], %z[h=h, s=s, t=0])
  %y: f32{s=512, h=4, d=64} = %o[s=s, h=h, d=d] * 2.0
  out %y (s, h, d)
}''')
    (blk,) = rowblocks.find_row_blocks(g)
    assert blk.ops == ("qk", "m", "e", "z", "pv", "o")
    assert blk.dims == ("h", "s") and blk.block == ("s",)


def test_a_block_its_kernels_cannot_run_runs_them_whole(monkeypatch):
    """Where the kernels do not fit a block (here: told so), each runs over every row, the
    row kernels still scheduled with the rows as their points, and the artifact agrees."""
    from support import oracle_outputs

    monkeypatch.setattr(rowblocks, "_fits", lambda *a: "told so")
    model = _attention(2, True)
    g = compile_onnx(model)
    _, kernels, _, _, _ = schedule_kernels(g, get_target("x86_64-v2"))
    assert not any(isinstance(k, rowblocks.BlockTileKernel) for k in kernels)
    assert any(k.points for k in kernels) and not any(k.ranged for k in kernels)
    art = compile_cpu(g, "x86_64-v2")
    feeds = _feeds(2)
    np.testing.assert_allclose(run_plan(art, g, feeds)["y"], oracle_outputs(model, feeds)[0],
                               rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("target", HOST_TARGETS)
def test_a_block_spans_whole_tiles_of_every_gemm(target, monkeypatch):
    """197 keys (ViT's tokens): the scores' tiles are not as tall as P.V's on every level
    (9 and 6 rows on AVX-512); a block is a multiple of both, and the artifact agrees."""
    from support import oracle_outputs

    monkeypatch.setattr(sys.modules[__name__], "T", 197)
    monkeypatch.setattr(rowblocks, "MIN_BYTES", 0)
    model = _attention(1, False)
    g = compile_onnx(model)
    tile = _tile(g, target)
    mrs = [tile.members[j].gemm.mr for j in tile.gemm_members]
    assert all(tile.height == m * tile.members[j].gemm.group
               for j, m in zip(tile.gemm_members, mrs))
    if target == "x86_64-v4":
        assert mrs == [9, 6] and tile.height == 36
    feeds = _feeds(1)
    got = run_plan(compile_cpu(g, target), g, feeds)["y"]
    np.testing.assert_allclose(got, oracle_outputs(model, feeds)[0], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("target", ["aarch64", "riscv64"])
def test_other_architectures_run_the_blocks(target, tmp_path, patient_emulation):
    """The same kernels on NEON and RVV: the build validates the artifact against float64
    where it runs (under qemu on an x86 host, natively on its own), with the block tile in it."""
    from support import emulated
    from mlpack.packager.build import build
    from mlpack.runtime import detect_host

    native = {"arm64": "aarch64", "riscv64": "riscv64"}.get(detect_host().arch) == target
    if not native and not emulated(target):
        pytest.skip(f"this host runs no {target} code (qemu-user for it is not installed)")
    model = _attention(1, True)
    assert len(rowblocks.find_row_blocks(compile_onnx(model))) == 1
    _tile(compile_onnx(model), target)   # (one block tile in its schedule)
    path = tmp_path / "attention.onnx"
    path.write_bytes(model.SerializeToString())
    report = build(path, tmp_path / "attention.mlpack", targets=[target], inputs=_feeds(1),
                   cache=False)
    (art,) = [a for a in report.artifacts if a.target == target]
    assert art.validated and art.max_error < 1e-4, art
