"""causal.py: a decoder's attention, its mask built from Ranges as torch exports GPT-2's, runs
each block of query rows over the keys up to its last query only; the artifact agrees with
ONNX Runtime and a float64 NumPy reference (plan_runner.RTOL / ATOL) on every x86 level the
host runs, at sequence lengths across the blocks' edges. Masks whose skipped keys would
change a row (too small a fill, the other direction, a padding input) keep the block whole."""

from __future__ import annotations

import os
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from mlpack.codegen.compile import compile_onnx
from mlpack.codegen.targets.cpu import causal, compile_cpu, rowblocks
from mlpack.codegen.targets.cpu.compile import schedule_kernels
from mlpack.codegen.targets.cpu.target import get_target
from mlpack.spec.ir import parse_graph

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))   # plan_runner
from plan_runner import ATOL, HOST_TARGETS, RTOL, rand, run_plan  # noqa: E402

HEADS, D = 4, 16   # scores of 4 x 512 x 512 floats at a long sequence: a row block
MIN = float(np.finfo(np.float32).min)


def _decoder(fill: float = MIN, later: bool = False, padding: bool = False) -> onnx.ModelProto:
    """softmax(Q K^T / 4 + mask) V, the mask ``where(key <= query, 0, fill)`` (``later``:
    ``key >= query``; ``padding``: and a boolean input per key) over a symbolic sequence."""
    seq = [helper.make_node("Shape", ["q"], ["shape"]),
           helper.make_node("Gather", ["shape", "two"], ["len"], axis=0),
           helper.make_node("Range", ["zero", "len", "one"], ["r"]),
           helper.make_node("Unsqueeze", ["r", "ax0"], ["keys"]),
           helper.make_node("Unsqueeze", ["r", "ax1"], ["queries"]),
           helper.make_node("GreaterOrEqual" if later else "LessOrEqual", ["keys", "queries"],
                            ["seen"])]
    if padding:
        seq += [helper.make_node("Unsqueeze", ["attend", "ax0"], ["attend2"]),
                helper.make_node("And", ["seen", "attend2"], ["seen2"])]
    nodes = seq + [
        helper.make_node("Where", ["seen2" if padding else "seen", "nought", "fill"], ["mask"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["qk"]),
        helper.make_node("Mul", ["qk", "scale"], ["scaled"]),
        helper.make_node("Add", ["scaled", "mask"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["o"]),
        helper.make_node("Transpose", ["o"], ["y"], perm=[0, 2, 1, 3])]
    i64 = lambda name, v: helper.make_tensor(name, TensorProto.INT64, [], [v])  # noqa: E731
    inits = [i64("two", 2), i64("zero", 0), i64("one", 1),
             helper.make_tensor("ax0", TensorProto.INT64, [1], [0]),
             helper.make_tensor("ax1", TensorProto.INT64, [1], [1]),
             helper.make_tensor("nought", TensorProto.FLOAT, [], [0.0]),
             helper.make_tensor("fill", TensorProto.FLOAT, [], [fill]),
             helper.make_tensor("scale", TensorProto.FLOAT, [], [0.25])]
    shape = ["batch", HEADS, "sequence", D]
    inputs = [helper.make_tensor_value_info(x, TensorProto.FLOAT, shape) for x in "qkv"]
    if padding:
        inputs.append(helper.make_tensor_value_info("attend", TensorProto.BOOL, ["sequence"]))
    g = helper.make_graph(nodes, "decoder", inputs, [helper.make_tensor_value_info(
        "y", TensorProto.FLOAT, ["batch", "sequence", HEADS, D])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _reference(feeds: dict) -> np.ndarray:
    q, k, v = (feeds[x].astype(np.float64) for x in "qkv")
    n = q.shape[2]
    s = q @ k.transpose(0, 1, 3, 2) / 4
    s = np.where(np.arange(n)[None, :] <= np.arange(n)[:, None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True) @ v).transpose(0, 2, 1, 3)


def _feeds(batch: int, n: int) -> dict:
    return {x: rand(batch, HEADS, n, D, seed=i) for i, x in enumerate("qkv")}


def _tile(g, target: str) -> rowblocks.BlockTileKernel:
    _, kernels, _, _, _ = schedule_kernels(g, get_target(target))
    (tile,) = [k for k in kernels if isinstance(k, rowblocks.BlockTileKernel)]
    return tile


@pytest.mark.parametrize("target", HOST_TARGETS)
def test_a_causal_block_runs_the_keys_up_to_its_last_query(target):
    from support import oracle_outputs

    model = _decoder()
    g = compile_onnx(model)
    tile = _tile(g, target)
    assert tile.causal
    # Q.K^T's N tiles up to the block's keys; the max, exponentials, sum and P.V's K loop
    # bounded by the block's key count
    assert list(tile.key_tiles) == [tile.gemm_members[0]]
    bounded = [m for m in tile.members if m.bounded is not None]
    assert [m.strategy for m in bounded] == ["inner", "map", "inner", "gemm"]
    assert all(m.bounded[1].arg == causal.KEYS for m in bounded)
    art = compile_cpu(g, target)
    # one token; the first block's rows, one less and one more; several blocks, ragged
    for batch, n in [(1, 1), (2, tile.height - 1), (1, tile.height + 1), (2, 130), (1, 300)]:
        feeds = _feeds(batch, n)
        got = run_plan(art, g, feeds)["y"]
        np.testing.assert_allclose(got, _reference(feeds), rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(got, oracle_outputs(model, feeds)[0], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("variant", ["small fill", "later keys", "padding"])
def test_masks_that_may_change_a_row_keep_the_block_whole(variant):
    """A fill of -1 leaves the later keys' exponentials nonzero; a mask that keeps the later
    keys masks the earlier; a padding input may mask a whole row, whose softmax then spreads
    over every key. Each block runs all its keys, and the artifact agrees."""
    from support import best_host_target, oracle_outputs

    model = _decoder(**{"small fill": {"fill": -1.0}, "later keys": {"later": True},
                        "padding": {"padding": True}}[variant])
    g = compile_onnx(model)
    target = best_host_target("x86_64-v2", "x86_64-v3", "x86_64-v4")
    tile = _tile(g, target)
    assert not tile.causal and not any(m.bounded for m in tile.members)
    feeds = _feeds(1, 70)
    if variant == "padding":   # the first 5 keys padding: the first 5 rows masked whole
        feeds["attend"] = np.arange(70) >= 5
    np.testing.assert_allclose(run_plan(compile_cpu(g, target), g, feeds)["y"],
                               oracle_outputs(model, feeds)[0], rtol=RTOL, atol=ATOL)


def test_what_the_mask_is_folded_to():
    """The proof on the IR: the mask a select of ``t <= s`` inlined into the span's add, and
    -inf or a -1e9 fill; an offset mask (``t <= s + 1``) or a fill of -1 is not taken."""
    def keys(cond: str, fill: str):
        g = parse_graph(f'''graph "attn" {{
  in %q: f32{{h=4, s=512, d=64}} (h, s, d)
  in %k: f32{{h=4, t=512, d=64}} (h, t, d)
  in %v: f32{{h=4, t=512, d=64}} (h, t, d)
  %mask: f32{{s=512, t=512}} = select({cond}, 0.0, {fill})
  %qk: f32{{h=4, s=512, t=512}} = sum{{e=64}} %q[h=h, s=s, d=e] * %k[h=h, t=t, d=e]
  %a: f32{{h=4, s=512, t=512}} = %qk[h=h, s=s, t=t] + %mask[s=s, t=t]
  %m: f32{{h=4, s=512, t=1}} = max{{u=512}} %a[h=h, s=s, t=u]
  %e: f32{{h=4, s=512, t=512}} = exp(%a[h=h, s=s, t=t] - %m[h=h, s=s, t=0])
  %z: f32{{h=4, s=512, t=1}} = sum{{u=512}} %e[h=h, s=s, t=u]
  %pv: f32{{h=4, s=512, d=64}} = sum{{u=512}} %e[h=h, s=s, t=u] * %v[h=h, t=u, d=d]
  %o: f32{{s=512, h=4, d=64}} = div(%pv[h=h, s=s, d=d], %z[h=h, s=s, t=0])
  out %o (s, h, d)
}}''')
        (blk,) = rowblocks.find_row_blocks(g)
        return causal.causal_keys(g, blk.ops, blk.dims, blk.block, {"o"})

    assert keys("le(t, s)", "-inf") == {"qk": "t", "a": "t", "e": "t"}
    assert keys("lt(t, s + 1)", "-1000000000.0") == {"qk": "t", "a": "t", "e": "t"}
    assert keys("le(t, s + 1)", "-inf") is None
    assert keys("le(t, s)", "-1.0") is None
    assert keys("ge(t, s)", "-inf") is None


@pytest.mark.parametrize("target", ["aarch64", "riscv64"])
def test_other_architectures_run_causal_blocks(target, tmp_path, patient_emulation):
    """NEON's and RVV's kernels with the bounds: the build validates the artifact against
    float64 under qemu (natively on its own host) at 130 tokens, three blocks."""
    from support import emulated
    from mlpack.packager.build import build
    from mlpack.runtime import detect_host

    native = {"arm64": "aarch64", "riscv64": "riscv64"}.get(detect_host().arch) == target
    if not native and not emulated(target):
        pytest.skip(f"this host runs no {target} code (qemu-user for it is not installed)")
    model = _decoder()
    assert _tile(compile_onnx(model), target).causal
    path = tmp_path / "decoder.onnx"
    path.write_bytes(model.SerializeToString())
    report = build(path, tmp_path / "decoder.mlpack", targets=[target], inputs=_feeds(1, 130),
                   cache=False)
    (art,) = [a for a in report.artifacts if a.target == target]
    assert art.validated and art.max_error < 1e-4, art
