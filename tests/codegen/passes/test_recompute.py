"""The recompute pass (codegen/passes/recompute.py): what it decides for the capsule routing's
votes under no budget and a small one, that the graph it makes computes what the unfused graph
does (interpreter, and the host's baseline cpu target), what MLPACK_DEBUG says, and how
--memory-budget reaches it."""

import os
import sys

import numpy as np
import pytest

from mlpack.codegen import dsl
from mlpack.codegen.passes import points, recompute
from mlpack.codegen.passes.pipeline import run_pipeline
from mlpack.spec.errors import InputError
from mlpack.spec.ir.graph import Comprehension
from mlpack.spec.ir.interp import run_graph

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")
sys.path.insert(0, os.path.join(ROOT, "examples", "capsules"))
import capsules  # noqa: E402
import reference  # noqa: E402

N, SIZE, CAPS = 2, 9, 8       # votes: 2*4*4*9*8*8*16 floats, 1.2 MB (fits the cache)


def _graph(batch=N, budget=None):
    g = dsl.to_graph(
        lambda P, A, W, beta_v, beta_a: capsules.em_routing(P, A, W, beta_v, beta_a,
                                                            inverse_temperature=0.01),
        inputs={"P": dsl.f32(n=batch, x=SIZE, y=SIZE, ci=CAPS, i=4, k=4),
                "A": dsl.f32(n=batch, x=SIZE, y=SIZE, ci=CAPS),
                "W": dsl.f32(kx=3, ky=3, ci=CAPS, k=4, j=4, co=CAPS),
                "beta_v": dsl.f32(co=CAPS), "beta_a": dsl.f32(co=CAPS)},
        name="em_routing", layouts={"mu": "n x y co i j", "a": "n x y co"})
    with recompute.memory_budget(budget):
        return run_pipeline(g)


def _votes(g) -> list[str]:
    """The tensors that hold the votes: a sum over k alone of P times W."""
    return [op.out for op in g.ops if isinstance(op, Comprehension) and op.reduce == "sum"
            and set(op.rdims) == {"k"}]


@pytest.fixture(scope="module")
def feeds():
    rng = np.random.default_rng(0)
    W = (rng.standard_normal((3, 3, CAPS, CAPS, 4, 4)) / np.sqrt(9 * CAPS * 4)).astype(np.float32)
    return {"P": rng.standard_normal((N, SIZE, SIZE, CAPS, 4, 4)).astype(np.float32),
            "A": rng.uniform(0.2, 1.0, (N, SIZE, SIZE, CAPS)).astype(np.float32),
            "W": np.ascontiguousarray(W.transpose(0, 1, 2, 4, 5, 3)),
            "beta_v": (0.1 * rng.standard_normal(CAPS)).astype(np.float32),
            "beta_a": np.zeros(CAPS, np.float32)}


def _close(got, feeds):
    W = feeds["W"].transpose(0, 1, 2, 5, 3, 4)
    mu, a = reference.em_routing(feeds["P"], feeds["A"], W, feeds["beta_v"], feeds["beta_a"],
                                 inverse_temperature=0.01)
    np.testing.assert_allclose(got["mu"], mu, rtol=1e-4, atol=1e-5 * np.abs(mu).max())
    np.testing.assert_allclose(got["a"], a, rtol=1e-4, atol=1e-6)


def test_small_votes_stay_materialized_and_a_budget_recomputes_them(feeds):
    kept = _graph()                 # 1.2 MB of votes read from cache: cheaper to keep
    assert len(_votes(kept)) == 1
    fused = _graph(budget=0)        # nothing may stay: every read recomputes its vote
    assert _votes(fused) == []
    assert len(fused.ops) < len(kept.ops)
    # the unrolled vote inside a routing reduction: P at k = 0..3 times W at k = 0..3
    bodies = [str(op.body) for op in fused.ops if isinstance(op, Comprehension)]
    assert any("k=3" in b and "%W" in b and "kx" in b for b in bodies)
    _close(run_graph(kept, feeds), feeds)
    _close(run_graph(fused, feeds), feeds)


def test_large_votes_are_held_one_point_at_a_time_or_recomputed(monkeypatch):
    g = _graph(batch=16)            # 9.4 MB of votes, read at 8 places: one position's 36.9 KB
    assert len(_votes(g)) == 1      # at a time (points.py) moves nothing through memory
    assert _votes(_graph(batch=16, budget=1 << 20)) == []   # 32 positions' would pass 1 MB
    monkeypatch.setattr(points, "POINT_BYTES", 0)   # no point fits: streaming costs more
    assert _votes(_graph(batch=16)) == []
    big = _graph(batch=16, budget=1 << 40)   # a budget caps; it never forces materializing
    assert _votes(big) == []


def test_the_debug_log_names_each_choice(monkeypatch, capsys):
    monkeypatch.setenv("MLPACK_DEBUG", "1")
    _graph(batch=16)
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if "materialize sum " in x)
    assert "read at 8 places" in line and "one point of (n, x, y) at a time: 36.9 KB" in line
    assert "materialize mu0" in err
    monkeypatch.setattr(points, "POINT_BYTES", 0)
    _graph(batch=16)
    line = next(x for x in capsys.readouterr().err.splitlines() if "recompute sum" in x)
    assert "read at 8 places" in line and "cheaper" in line and "into " in line
    monkeypatch.setenv("MLPACK_DISABLE_PASSES", "recompute")
    assert len(_votes(_graph(batch=16))) == 1
    assert "pass recompute: disabled" in capsys.readouterr().err


def test_budget_parsing():
    assert recompute.parse_bytes("4096") == 4096
    assert recompute.parse_bytes("64MB") == 64_000_000
    assert recompute.parse_bytes("1.5GiB") == 3 << 29
    assert recompute.as_bytes(None) is None
    with pytest.raises(InputError, match="memory budget '12 parsecs'"):
        recompute.parse_bytes("12 parsecs")


def _twice(tmp_path):
    """v = sum{k} x*w, 64 KB, read by a max and a min (which no pass merges): kept, as it fits
    the cache, unless the budget is 0."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64, 4])
    w = onnx.numpy_helper.from_array(np.ones((64, 4, 4), np.float32), "w")
    nodes = [helper.make_node("Einsum", ["x", "w"], ["v"], equation="abk,bkc->abc"),
             helper.make_node("ReduceMax", ["v"], ["hi"], axes=[0], keepdims=0),
             helper.make_node("ReduceMin", ["v"], ["lo"], axes=[0], keepdims=0)]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [64, 4]) for n in ("hi", "lo")]
    model = helper.make_model(helper.make_graph(nodes, "twice", [x], outs, [w]),
                              opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "twice.onnx"
    onnx.save(model, path)
    return path


def test_cli_memory_budget(tmp_path):
    from support import cli

    path = _twice(tmp_path)
    r = cli("import", path)
    assert r.exit_code == 0 and "ops:        3 comprehensions" in r.output, r.output
    r = cli("import", path, "--memory-budget", "0")
    assert r.exit_code == 0 and "ops:        2 comprehensions" in r.output, r.output
    r = cli("import", path, "--memory-budget", "lots")
    assert r.exit_code != 0 and "memory budget 'lots'" in r.output


def test_fused_routing_on_the_baseline_cpu_target(feeds):
    from mlpack.runtime import detect_host

    target = {"amd64": "x86_64-v2", "arm64": "aarch64"}.get(detect_host().arch)
    if target is None:
        pytest.skip(f"no baseline cpu target for {detect_host().arch}")
    sys.path.insert(0, os.path.join(ROOT, "tests", "codegen", "targets"))
    from plan_runner import run_plan
    from mlpack.codegen.targets.cpu import compile_cpu

    g = _graph(budget=0)
    _close(run_plan(compile_cpu(g, target), g, feeds), feeds)


def test_build_takes_the_budget(tmp_path, monkeypatch, capsys):
    from mlpack.packager.build import build

    path = _twice(tmp_path)
    monkeypatch.setenv("MLPACK_DEBUG", "1")
    for budget, said in ((None, "materialize v "), ("0", "recompute v ")):
        build(path, tmp_path / "twice.mlpack", targets=["portable"], cache=False,
              memory_budget=budget)
        assert said in capsys.readouterr().err
    with pytest.raises(InputError, match="memory budget"):
        build(path, tmp_path / "no.mlpack", targets=["portable"], memory_budget="-1")


# a residual stream as a transformer's LayerNorm reads it: a cheap sum of three 4 MB tensors,
# read by the mean, the variance and the normalized output
RESIDUAL = '''graph "residual" {
  in %a: f32{r=1024, c=1024} (r, c)
  in %b: f32{r=1024, c=1024} (r, c)
  in %p: f32{r=1024, c=1024} (r, c)
  %s: f32{r=1024, c=1024} = %a[r=r, c=c] + %b[r=r, c=c] + %p[r=r, c=c]
  %m: f32{r=1024} = sum{k=1024} %s[r=r, c=k] * 0.0009765625
  %v: f32{r=1024} = sum{k=1024} (%s[r=r, c=k] - %m[r=r]) * (%s[r=r, c=k] - %m[r=r])
  %y: f32{r=1024, c=1024} = (%s[r=r, c=c] - %m[r=r]) * %v[r=r]
  out %y (r, c)
}'''


@pytest.mark.parametrize("operands_priced", [True, False])
def test_recomputing_rereads_the_operands_that_stream_from_memory(operands_priced, monkeypatch):
    """At 4 MB an operand (over CACHE_BYTES), recomputing the 2-flop sum in its three readers
    would stream 12 MB twice more: it stays materialized. Priced by its flops alone (4 Mflop
    against 67 Mflop of traffic for the 4 MB it writes and reads back) it was recomputed."""
    from mlpack.spec.ir import parse_graph
    if not operands_priced:
        monkeypatch.setattr(recompute, "_streamed", lambda p, g: 0)
    g = run_pipeline(parse_graph(RESIDUAL))
    assert ("s" in {op.out for op in g.ops}) == operands_priced
