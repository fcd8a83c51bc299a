"""``mlpack bench`` and what it rests on: the FLOP counter and the alternating timer.

The command runs on a tiny container with --compare (examples/models/mlp.onnx) and must give a
JSON document whose numbers are all there and positive; its refusals are one paragraph with
exit code 2. Kept fast: one thread count, a few runs, short time budgets.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import support
from mlpack.packager.bench import QUIET_S, time_alternating
from mlpack.packager.flops import count_flops

pytest.importorskip("onnxruntime")

HERE = os.path.dirname(os.path.abspath(__file__))
MLP = os.path.join(HERE, "..", "..", "examples", "models", "mlp.onnx")
FAST = ["--threads", "1", "--repeat", "3", "--min-seconds", "0.05", "--max-seconds", "1"]


@pytest.fixture(scope="module")
def container(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "mlp.mlpack"
    result = support.cli("build", MLP, "-o", out, "--quiet")
    assert result.exit_code == 0, result.output
    return out


def test_bench_compare_json_has_positive_numbers(container, monkeypatch):
    from mlpack.packager import bench

    monkeypatch.setattr(bench, "PEAK_N", 512)  # the peak's matmul, small: a test, not a measure
    monkeypatch.setattr(bench, "_PEAKS", {})
    result = support.cli("bench", container, "--compare", MLP, *FAST, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["machine"]["cores"] >= 1 and doc["matmul_peak_gflops"]["1"] > 0
    (model,) = doc["models"]
    assert model["model"] == "mlp" and model["artifact"]["precision"] == "fp32"
    assert model["input_source"].startswith("the container's test vectors")
    assert model["flops"] > 0 and model["build_seconds"] > 0
    assert model["outputs"]["match"] is True
    (row,) = model["threads"]
    assert row["threads"] == 1 and row["ratio"] > 0
    assert 0 <= row["steal_percent"] <= 100   # this machine has /proc/stat
    for side in ("mlpack", "ort"):
        t = row[side]
        assert t["runs"] >= 3 and 0 < t["min_s"] <= t["median_s"]
        assert t["gflops"] > 0 and t["percent_of_peak"] > 0
        assert model["peak_rss"][side]["peak_mib"] > 0
    assert doc["geomean_ratio"]["1"] == pytest.approx(row["ratio"])


def test_bench_without_compare_times_mlpack_alone(container):
    result = support.cli("bench", container, *FAST, "--no-rss", "--dim", "batch=4")
    assert result.exit_code == 0, result.output
    assert "x[4, 16] from seeded random (seed 0)" in result.stdout
    assert "mlpack ms" in result.stdout and "ORT/mlpack" in result.stdout


def test_bench_times_each_precision_side_by_side(tmp_path):
    from mlpack.backend import host_target

    out = tmp_path / "mlp16.mlpack"
    built = support.cli("build", MLP, "-o", out, "-t", host_target(), "-p", "all", "--quiet")
    assert built.exit_code == 0, built.output
    result = support.cli("bench", out, "--compare", MLP, *FAST, "--no-rss", "-p", "all", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    got = [(m["model"], m["artifact"]["precision"], m["artifact"]["target"]) for m in doc["models"]]
    assert got == [(f"mlp16 {p}", p, host_target()) for p in ("fp32", "fp16", "bf16", "int8")]
    for m in doc["models"]:   # a variant is checked against ONNX Runtime within its own rtol
        assert m["outputs"]["match"] is True and m["threads"][0]["mlpack"]["median_s"] > 0
    assert [m["outputs"]["rtol"] for m in doc["models"]] == [1e-3, 0.05, 0.2, 0.5]
    support.assert_user_error(support.cli("bench", container_of_fp32(tmp_path), "-p", "bf16"),
                              "no artifact of precision bf16 (it has fp32)")


def container_of_fp32(tmp_path):
    out = tmp_path / "mlp32.mlpack"
    assert support.cli("build", MLP, "-o", out, "-t", "x86_64-v2", "--quiet").exit_code == 0
    return out


@pytest.mark.parametrize("args, fragment", [
    (["absent.mlpack"], "absent.mlpack: no such file"),
    ([MLP], "not a tar archive"),  # an ONNX file where the container should be
])
def test_bench_refuses_bad_files(args, fragment):
    support.assert_user_error(support.cli("bench", *args), fragment)


def test_bench_refuses_bad_options(container, tmp_path):
    support.assert_user_error(support.cli("bench", container, "--threads", "0"), "--threads")
    not_onnx = tmp_path / "junk.onnx"
    not_onnx.write_bytes(b"\x00not a model")
    support.assert_user_error(support.cli("bench", container, "--compare", not_onnx),
                              "junk.onnx", "not a readable ONNX model")


def _model(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
                                           for n, s in inputs],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
                               for n in outputs], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_flops_of_conv_matmul_gemm_einsum():
    w = numpy_helper.from_array(np.zeros((4, 3, 3, 3), np.float32), "w")
    wg = numpy_helper.from_array(np.zeros((4, 2, 1, 1), np.float32), "wg")  # 2 groups of 2
    b = numpy_helper.from_array(np.zeros((6, 7), np.float32), "b")
    model = _model(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),      # -> [n, 4, 8, 8]
         helper.make_node("Conv", ["c", "wg"], ["g"], group=2),               # -> [n, 4, 8, 8]
         helper.make_node("Relu", ["g"], ["r"]),                               # not counted
         helper.make_node("MatMul", ["m", "b"], ["mm"]),                       # [2,5,6] @ [6,7]
         helper.make_node("Gemm", ["a", "b"], ["gm"], transA=1),               # A is [6, 3]
         helper.make_node("Einsum", ["e", "b"], ["es"], equation="...ij,jk->...ik")],
        [("x", ["n", 3, 8, 8]), ("m", [2, 5, 6]), ("a", [6, 3]), ("e", [4, 2, 6])],
        ["r", "mm", "gm", "es"], [w, wg, b])
    count = count_flops(model, {"x": (2, 3, 8, 8)})  # the symbolic batch pinned to 2
    assert count.by_op == {"Conv": 2 * (2 * 4 * 8 * 8 * 3 * 3 * 3 + 2 * 4 * 8 * 8 * 2),
                           "MatMul": 2 * 2 * 5 * 7 * 6, "Gemm": 2 * 3 * 7 * 6,
                           "Einsum": 2 * 4 * 2 * 6 * 7}
    assert count.total == sum(count.by_op.values()) and count.unknown == []


def _run_time_reshape_model():
    """x [n, 12] reshaped to [n, 3, 4] by a shape computed from x's own (Shape, Gather, a
    float round trip shape inference does not follow), then [n, 3, 4] @ [4, 5]."""
    w = numpy_helper.from_array(np.zeros((4, 5), np.float32), "w")
    k = numpy_helper.from_array(np.array([3, 4], np.float32), "k")
    zero = numpy_helper.from_array(np.array([0], np.int64), "zero")
    return _model(
        [helper.make_node("Shape", ["x"], ["s"]),
         helper.make_node("Gather", ["s", "zero"], ["n"]),
         helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT),
         helper.make_node("Concat", ["nf", "k"], ["sf"], axis=0),
         helper.make_node("Cast", ["sf"], ["shape"], to=TensorProto.INT64),
         helper.make_node("Reshape", ["x", "shape"], ["r"]),
         helper.make_node("MatMul", ["r", "w"], ["y"])],
        [("x", ["n", 12])], ["y"], [w, k, zero])


def test_flops_of_shapes_computed_at_run_time_come_from_one_run():
    model = _run_time_reshape_model()
    blind = count_flops(model, {"x": (2, 12)})
    assert blind.unknown and blind.total == 0   # inference alone cannot count the MatMul
    count = count_flops(model, feeds={"x": np.ones((2, 12), np.float32)})
    assert count.unknown == [] and count.by_op == {"MatMul": 2 * 2 * 3 * 5 * 4}


def test_steal_share_from_proc_stat_lines(tmp_path, monkeypatch):
    from mlpack.packager import bench

    before = bench.cpu_ticks()
    assert before is not None and before[0] >= before[1] >= 0
    # user nice system idle iowait irq softirq steal: 40 of 200 ticks stolen in between
    assert bench.steal_percent((1000, 100), (1200, 140)) == pytest.approx(20.0)
    assert bench.steal_percent(None, (1200, 140)) is None
    assert bench.steal_percent((1200, 140), (1200, 140)) is None   # no time passed
    stat = tmp_path / "stat"
    stat.write_text("cpu  10 0 5 80 0 0 0 5 0 0\ncpu0 10 0 5 80 0 0 0 5 0 0\n")
    real_open = open
    monkeypatch.setattr("builtins.open", lambda path, *a, **k: real_open(
        stat if path == "/proc/stat" else path, *a, **k))
    assert bench.cpu_ticks() == (100, 5)
    stat.write_text("intr 1 2 3\n")
    assert bench.cpu_ticks() is None


def test_time_alternating_gives_each_callable_its_runs():
    calls = {"a": 0, "b": 0}

    def bump(name):
        calls[name] += 1
        return name

    timings, results = time_alternating({"a": lambda: bump("a"), "b": lambda: bump("b")},
                                        repeat=5, min_seconds=0.0, max_seconds=1.0)
    assert results == {"a": "a", "b": "b"}
    for name, t in timings.items():
        assert t.runs >= 5 and 0 <= t.min_s <= t.median_s and calls[name] > t.runs  # + warm-up


def test_time_alternating_pauses_before_the_other_runtime_takes_over():
    """Each slice starts QUIET_S after the other runtime's last run (ONNX Runtime's threads
    spin on after a run and would compete with mlpack's), within a slice runs follow at once."""
    import time
    log = []

    def run(name):
        log.append((name, time.perf_counter()))
        time.sleep(0.002)

    time_alternating({"a": lambda: run("a"), "b": lambda: run("b")}, repeat=1,
                     min_seconds=0.0, max_seconds=0.5, warmup_seconds=0.0)
    timed = log[2:]   # after one warm-up run each
    gaps = [(x[0] != y[0], y[1] - x[1]) for x, y in zip(timed, timed[1:])]
    switches = [g for switch, g in gaps if switch]
    assert switches and min(switches) >= 0.9 * QUIET_S
    assert max(g for switch, g in gaps if not switch) < QUIET_S / 2
