"""tiles.py: EM routing's span runs one output position at a time as one kernel, its votes held
one position at a time, and the artifact agrees with the float64 NumPy reference (fp32: 1e-5 of
each output's largest magnitude) with a fixed and with a dynamic batch; a member repeated (an
iteration's) is lowered once; no other kind of model gets a tile (attention's scores, a sum of 64 terms, stay a GEMM)."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from mlpack.codegen.passes import points
from mlpack.codegen.targets.cpu import compile_cpu, sharing, tiles
from mlpack.codegen.targets.cpu.compile import schedule_kernels
from mlpack.codegen.targets.cpu.target import get_target

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))                     # plan_runner
sys.path.insert(0, os.path.join(HERE, "..", "..", "dsl"))     # dsl_support
from dsl_support import assert_close, em_routing_graph, example  # noqa: E402
from plan_runner import eval_expr, run_plan  # noqa: E402

C = 16
TARGET = "x86_64-v2"   # every x86-64 host runs it (run_plan skips elsewhere)


def _feeds(n: int) -> dict:
    rng = np.random.default_rng(3)
    return {"P": rng.standard_normal((n, 9, 9, C, 4, 4)).astype(np.float32),
            "A": rng.uniform(0.2, 1, (n, 9, 9, C)).astype(np.float32),
            "W": (rng.standard_normal((3, 3, C, 4, 4, C)) / 12).astype(np.float32),
            "beta_v": (0.1 * rng.standard_normal(C)).astype(np.float32),
            "beta_a": np.zeros(C, np.float32)}


def _reference(feeds: dict) -> dict:
    """mu [n, x, y, i, j, co] and a [n, x, y, co], as the graph lays them out, in float64."""
    ref = example("reference")
    W = feeds["W"].transpose(0, 1, 2, 5, 3, 4)   # (kx, ky, ci, k, j, co) -> (.., co, k, j)
    mu, a = ref.em_routing(feeds["P"], feeds["A"], W, feeds["beta_v"], feeds["beta_a"],
                           inverse_temperature=0.01)
    return {"mu": mu.transpose(0, 1, 2, 4, 5, 3), "a": a}


@pytest.mark.parametrize("batch", [1, 2, "batch"])
def test_the_routing_runs_one_position_at_a_time(batch):
    g = em_routing_graph(C, n=batch)
    votes = [op.out for op in g.ops if getattr(op, "rdims", None) and set(op.rdims) == {"k"}]
    assert len(votes) == 1   # kept (recompute.py), not recomputed in each of its 8 readers
    found = tiles.find_tiles(g)
    assert len(found) == 1 and votes[0] in found[0].ops
    assert found[0].dims == (("x", "y") if batch == 1 else ("n", "x", "y"))   # (n=1: no dim)
    _, kernels, bufs, _, _ = schedule_kernels(g, get_target(TARGET))
    (tile,) = [k for k in kernels if isinstance(k, tiles.TileKernel)]
    assert votes[0] in tile.locals and len(tile.members) > 20
    # a position's votes (3*3*16*16*4*4 floats) in each of the scratch's slices
    assert tile.locals[votes[0]][1] == 3 * 3 * C * C * 16 * 4
    slices = 32 if batch == 2 else 16   # the positions of a batch of one, or at most 32
    assert tile.slices == slices
    assert tile.slice_bytes * slices == 4 * bufs[tile.scratch].sizes["slot"].value
    for m in tile.members:   # no member's row nor row block runs across positions
        assert m.points == found[0].dims and not set(m.blocked) & set(m.points)
    art = compile_cpu(g, TARGET)
    feeds = _feeds(2 if batch == "batch" else batch)
    got = run_plan(art, g, feeds)
    want = _reference(feeds)
    for name in want:
        assert_close(got[name], want[name])
    whole = compile_cpu(g, TARGET, disabled={"point_tiles"})   # each op over every position
    if batch == "batch":   # the scratch does not grow with the batch: the votes did
        syms = {"batch": 64}
        assert eval_expr(art.plan["arena_size"], syms) < 0.1 * eval_expr(
            whole.plan["arena_size"], syms)
    assert len(art.plan["dispatches"]) < len(whole.plan["dispatches"]) // 5
    plain = run_plan(whole, g, feeds)
    for name in want:
        assert_close(plain[name], want[name])


def test_a_repeated_routing_iteration_is_lowered_once(monkeypatch):
    """The second and third EM iterations are the same members on other tensors: each distinct
    member is one function, which the tile calls with each member's own tensors (the
    artifact still agrees with the reference)."""
    g = em_routing_graph(C, n=1)
    seen = []
    emit = tiles.TileLowering._emit_impl

    def spy(self, f):
        emit(self, f)
        seen.append((self.k.members, self.impls))
    monkeypatch.setattr(tiles.TileLowering, "_emit_impl", spy)
    art = compile_cpu(g, TARGET)
    ((members, impls),) = seen
    _, _, bufs, _, _ = schedule_kernels(g, get_target(TARGET))
    keys = {sharing.kernel_key(m, bufs)[0] for m in members}
    assert len(impls) == len(keys) <= len(members) - 5
    feeds = _feeds(1)
    got, want = run_plan(art, g, feeds), _reference(feeds)
    for name in want:
        assert_close(got[name], want[name])


def test_no_tile_where_a_point_would_not_fit_or_the_sum_is_long(monkeypatch):
    g = em_routing_graph(C, n=2)
    monkeypatch.setattr(points, "POINT_BYTES", 3 * 3 * C * C * 16 * 4 - 1)
    assert tiles.find_tiles(g) == []
    monkeypatch.setattr(points, "POINT_BYTES", 1 << 20)
    monkeypatch.setattr(points, "MAX_TERMS", 3)   # the votes sum 4 products
    assert tiles.find_tiles(g) == []


def test_attention_scores_get_no_tile():
    """Scores over 64-wide heads, read by a softmax's max, exp and sum: their rows would each
    be a matrix-vector product in a tile, so they stay a GEMM's."""
    from mlpack.spec.ir import parse_graph

    g = parse_graph('''graph "attn" {
  in %q: f32{h=4, s=512, d=64} (h, s, d)
  in %k: f32{h=4, t=512, d=64} (h, t, d)
  %qk: f32{h=4, s=512, t=512} = sum{e=64} %q[h=h, s=s, d=e] * %k[h=h, t=t, d=e]
  %m: f32{h=4, s=512} = max{u=512} %qk[h=h, s=s, t=u]
  %e: f32{h=4, s=512, t=512} = exp(%qk[h=h, s=s, t=t] - %m[h=h, s=s])
  out %e (h, s, t)
}''')
    assert points.point_span(g, "qk") is None
    assert tiles.find_tiles(g) == []


def test_a_convolution_read_twice_at_one_index_gets_no_tile():
    """An expand convolution (a sum of 16 terms, 4.8 MB) whose SiLU, x * sigmoid(x), reads it
    twice at one index: one place, not two, so no span (EfficientNet-B0's first one ran 18 ms
    as a tile against 1.2 ms as a convolution with the SiLU in its epilogue)."""
    from mlpack.spec.ir import parse_graph

    g = parse_graph('''graph "expand" {
  in %x: f32{n=1, h=112, w=112, ci=16} (n, h, w, ci)
  in %wt: f32{co=96, ci=16} (co, ci)
  %c: f32{n=1, h=112, w=112, co=96} = sum{k=16} %x[n=n, h=h, w=w, ci=k] * %wt[co=co, ci=k]
  %y: f32{n=1, h=112, w=112, co=96} = %c[n=n, h=h, w=w, co=co] * sigmoid(%c[n=n, h=h, w=w, co=co])
  out %y (n, h, w, co)
}''')
    assert points.point_span(g, "c") is None


def test_the_custom_op_model_builds_its_tile_for_each_cpu_target(monkeypatch, tmp_path,
                                                                  patient_emulation):
    """benchmarks/capsule_routing.py's model (one EMRouting node) at 9x9 with 16 capsule types:
    its graph gets the tile, and the build validates it on this host's baseline target and,
    where qemu runs it, on aarch64: the same kernels, another instruction set."""
    from benchmarks import capsule_routing as cr
    from support import emulated
    from mlpack.codegen.compile import compile_onnx
    from mlpack.packager import customops
    from mlpack.packager.build import build
    from mlpack.runtime import detect_host

    for name, value in (("BATCH", 2), ("SIZE", 9), ("C", C), ("OUT", 4)):
        monkeypatch.setattr(cr, name, value)
    ops = [os.path.join(cr.CAPS, "capsules.py")]
    customops.load(ops)
    assert len(tiles.find_tiles(compile_onnx(cr.custom_model()))) == 1
    host = {"amd64": "x86_64-v2", "arm64": "aarch64"}.get(detect_host().arch)
    if host is None:
        pytest.skip(f"no cpu target for {detect_host().arch}")
    targets = [host] + (["aarch64"] if host != "aarch64" else [])
    path = tmp_path / "em.onnx"
    onnx_model = cr.custom_model()
    path.write_bytes(onnx_model.SerializeToString())
    report = build(path, tmp_path / "em.mlpack", targets=targets, inputs=cr.inputs(), ops=ops,
                   cache=False)
    by_target = {a.target: a for a in report.artifacts}
    assert by_target[host].validated and by_target[host].max_error < 1e-4, by_target[host]
    if host != "aarch64" and emulated("aarch64"):
        arm = by_target["aarch64"]
        assert arm.validated and arm.emulator and arm.max_error < 1e-4, arm


def test_the_custom_op_model_runs_where_no_native_artifact_does(monkeypatch, tmp_path):
    """Built for another architecture only, the container runs on this host through its
    portable artifact in the C engine, whose ops' tensors may have more dims than a model's
    inputs (the routing reads the votes over 9); it failed to open there, and so did the
    build, which validates that artifact."""
    from benchmarks import capsule_routing as cr
    import mlpack
    from mlpack.packager.build import build
    from mlpack.runtime import detect_host

    for name, value in (("BATCH", 1), ("SIZE", 9), ("C", C), ("OUT", 4)):
        monkeypatch.setattr(cr, name, value)
    monkeypatch.setenv("MLPACK_QEMU", "0")
    other = "aarch64" if detect_host().arch != "arm64" else "x86_64-v2"
    path = tmp_path / "em.onnx"
    path.write_bytes(cr.custom_model().SerializeToString())
    feeds = cr.inputs()
    report = build(path, tmp_path / "em.mlpack", targets=[other], inputs=feeds,
                   ops=[os.path.join(cr.CAPS, "capsules.py")], cache=False)
    portable = next(a for a in report.artifacts if a.target == "portable")
    assert portable.validated and portable.max_error < 1e-4, portable
    with mlpack.load(str(tmp_path / "em.mlpack"), device="portable") as interpreted, \
            mlpack.load(str(tmp_path / "em.mlpack")) as engine:
        want, got = interpreted.run(feeds), engine.run(feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5)
