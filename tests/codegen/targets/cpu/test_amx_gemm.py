"""AMX gemm kernels (codegen/targets/cpu/amx.py, the x86_64-v4-amx target) against ONNX Runtime.

Everywhere: the bf16 split is exact, the B tiles are laid out as tdpbf16ps reads them, and the
contractions that should take the tile path do (the capsule without a copy of its poses,
a matmul whose A needs one), the small or narrow ones keep the f32 micro-kernel, and the code
holds the tile instructions. On a host with AMX (which grants this process the tile state):
convolutions, ragged matmuls, a dynamic batch and the capsule run by the plan runner match
ONNX Runtime at the fp32 tolerance (rtol 1e-4 / atol 1e-5).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from mlpack.codegen.compile import compile_onnx
from mlpack.codegen.targets.cpu import amx
from mlpack.runtime.host import detect_host

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from plan_runner import assert_matches_ort, rand  # noqa: E402
from test_contraction import _gemms, capsule_case, matmul_case  # noqa: E402

TARGET = "x86_64-v4-amx"
NO_AMX = "amx_tile" not in detect_host().cpu_features   # (detection asks for the tile state)


def test_split_is_exact():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(4096).astype(np.float32),
                        (rng.standard_normal(512) * 1e30).astype(np.float32),
                        (rng.standard_normal(512) * 1e-30).astype(np.float32),
                        np.float32([0.0, -0.0, 1.0, -1.0, 3.4e38, 1.17549435e-38, 1 + 2 ** -23])])
    parts = amx.split(x)
    assert parts.shape == (3, x.size) and parts.dtype == np.uint16
    assert np.array_equal(amx.join(parts), x.astype(np.float64))
    # each part holds what the ones before it leave, rounded: 8 significant bits a step
    big = (np.abs(x) > 1e-30) & (np.abs(x) < 1e38)   # (near the largest f32: truncated)
    second = np.abs(amx.join(parts[1:2]))[big]
    assert np.all(second <= np.abs(x[big]) * 2.0 ** -8)


def test_split_keeps_nan_and_infinity():
    parts = amx.split(np.float32([np.nan, np.inf, -np.inf]))
    head = amx.join(parts[:1])
    assert np.isnan(head[0]) and head[1] == np.inf and head[2] == -np.inf
    assert not parts[1:, 1:].any()   # an infinity is its first part alone


def test_pack_b_tiles_pair_k_values():
    blocked = rand(2, 3, 40, 16)   # [batch, N blocks, K, 16 lanes]: K pads to 64, two steps
    tiles = amx.pack_b(blocked)
    assert tiles.shape == (2, 3, 2, 3, 16, 16, 2)
    b, nb, k, col = 1, 2, 37, 11
    step, within = divmod(k, 32)
    got = amx.join(tiles[b, nb, step, :, within // 2, col, within % 2])
    assert got == np.float64(blocked[b, nb, k, col])
    assert not tiles[:, :, 1, :, 4:].any()   # K 40..63: zero


def conv_chain_case(cin, cout, size, batch=1, dyn=False):
    """Conv 3x3 + Relu + Conv 1x1: the first convolution's output lies channels last."""
    from onnx import TensorProto, helper
    from support import one_output_model
    w1 = rand(cout, cin, 3, 3, seed=1, scale=1 / np.sqrt(cin * 9))
    w2 = rand(cout, cout, 1, 1, seed=2, scale=1 / np.sqrt(cout))
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c"], pads=[1] * 4),
             helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Conv", ["r", "w2"], ["y"])]
    shape = ["N" if dyn else batch, cin, size, size]
    m = one_output_model(nodes, [("x", TensorProto.FLOAT, shape)],
                         [("w1", w1), ("b1", rand(cout, seed=3)), ("w2", w2)])
    return m, {"x": rand(batch, cin, size, size)}


def _amx_gemms(m):
    """The AMX gemms of ``m`` as compile_cpu schedules them (channels last, Winograd)."""
    from mlpack.codegen.targets.cpu.compile import schedule_kernels
    from mlpack.codegen.targets.cpu.target import get_target
    _, kernels, _, _, _ = schedule_kernels(compile_onnx(m), get_target(TARGET))
    return [k.gemm for k in kernels if getattr(k.gemm, "amx", False)]


def test_which_contractions_run_on_tiles():
    # the capsule's poses read in place (no copy): 4 floats of k per run, 4 runs (ci) a vector
    caps, _ = capsule_case(4, 16, 32)
    (c,) = _amx_gemms(caps)
    assert (c.run_dims, c.run_group) == (1, 4)
    assert c.k_steps == 3 * 3 * 32 * 4 // 32 and c.data.dtype == np.uint16
    # rows enough, columns enough: tiles; a convolution inside the model (channels last),
    # not the one writing the model's NCHW output (its stores would cross channels)
    assert _amx_gemms(matmul_case(256, 208, 384, bias=True)[0])
    assert len(_amx_gemms(conv_chain_case(64, 128, 16)[0])) == 1
    # too few columns (the split of A would not pay), rows, or 49 rows padded to 64; a K run
    # of A that is no whole number of vectors
    assert not _amx_gemms(matmul_case(256, 208, 64)[0])
    assert not _amx_gemms(matmul_case(16, 208, 384)[0])
    assert not _amx_gemms(matmul_case(256, 200, 384)[0])
    assert not _amx_gemms(conv_chain_case(512, 512, 7)[0])
    assert not _gemms(compile_onnx(caps), "x86_64-v4")[0].amx   # other targets: no tiles


def test_tile_instructions_in_the_code(monkeypatch, capsys):
    """The library holds the tile config, products and release (checked on any host)."""
    from mlpack.codegen.targets.cpu import compile_cpu
    monkeypatch.setenv("MLPACK_DEBUG", "3")
    compile_cpu(compile_onnx(matmul_case(128, 96, 256)[0]), TARGET)
    text = capsys.readouterr().err
    for call in ("llvm.x86.ldtilecfg", "llvm.x86.tdpbf16ps", "llvm.x86.tilerelease"):
        assert call in text


CASES = {
    # K 208 pads to 224; 384 columns in one unit; 90 rows in three blocks, the last ragged
    "matmul_ragged_bias": lambda: matmul_case(90, 208, 384, bias=True),
    # 19 blocks of 16 columns: a lone last block in its pair, not stored
    "matmul_odd_blocks": lambda: matmul_case(96, 64, 300),
    # N past MAX_N: two units of columns
    "matmul_wide": lambda: matmul_case(64, 128, 1100),
    "matmul_batched_const": lambda: matmul_case(96, 64, 256, batch=2),
    "conv3x3_pad_relu": lambda: conv_chain_case(64, 128, 16, batch=2),
    "conv3x3_dynamic_batch": lambda: conv_chain_case(32, 128, 16, batch=3, dyn=True),
    "capsule_einsum": lambda: capsule_case(2, 16, 32),
}


@pytest.mark.skipif(NO_AMX, reason="the host has no AMX (or Linux does not grant it)")
@pytest.mark.parametrize("case", list(CASES))
def test_amx_matches_ort(case):
    m, feeds = CASES[case]()
    assert _amx_gemms(m), case
    assert_matches_ort(m, feeds, TARGET)


# ---------------------------------------------------------------- the target, built and chosen


def test_the_amx_level_is_opt_in_and_chosen_where_it_runs(tmp_path):
    """``mlpack build`` makes it only when named; the engine then picks it on an AMX host (its
    features rank it above v4) and a host without AMX passes it over, naming the feature."""
    import dataclasses

    import mlpack
    from mlpack.packager.build import DEFAULT_TARGETS
    from mlpack.runtime import select
    from mlpack.spec.container import open_container
    assert TARGET not in DEFAULT_TARGETS
    m, feeds = matmul_case(128, 96, 256, bias=True)
    out = tmp_path / "m.mlpack"
    report = mlpack.build(m, out, targets=["x86_64-v4", TARGET])
    assert [a.target for a in report.artifacts] == ["portable", "x86_64-v4", TARGET]
    assert report.artifacts[2].validated == (not NO_AMX)
    with open_container(out) as c:
        art = c.artifacts[2]
        assert art.config["artifact"]["cpu_features"][-2:] == ["amx_tile", "amx_bf16"]
        assert select.describe(art) == "x86-64 v4+amx cpu fp32 (artifact 2)"
        # an AVX-512 host without AMX (whatever this one is): the artifact's features less AMX
        wanted = set(art.config["artifact"]["cpu_features"]) | set(detect_host().cpu_features)
        plain = dataclasses.replace(detect_host(), x86_level=4, cpu_features=frozenset(
            f for f in wanted if "amx" not in f))
        assert select.host_fault(art, plain) == "needs amx_tile, amx_bf16, this host lacks them"
    if NO_AMX:
        return
    with mlpack.load(out) as loaded:
        assert loaded.artifact.target == TARGET
        assert loaded.artifact.reason.startswith("chosen: x86-64 v4+amx cpu fp32 (artifact 2)")
        got = loaded.run(feeds)["y"]
    from support import oracle_outputs
    np.testing.assert_allclose(got, oracle_outputs(m, feeds)[0], rtol=1e-4, atol=1e-5)
