"""Timing mlpack against ONNX Runtime: the one implementation behind ``mlpack bench`` and the
benchmark suite (benchmarks/run.py).

    result = bench_model("m.mlpack", onnx_path="m.onnx", threads=(1, 2))   # one model's numbers
    doc = document([result], peaks)                                        # the JSON document
    print("\\n".join(table_lines(doc["models"])))

What one model gets, at each thread count T:

* both runtimes in this process on the same inputs: mlpack through ``mlpack.load(path,
  threads=T)``, ONNX Runtime with the CPU provider, every graph optimisation
  (ORT_ENABLE_ALL), ``intra_op_num_threads=T``, one inter-op thread, sequential execution;
* warm-up (at least one run each, more while cheap), then the two runtimes alternate in rounds
  (each runs for a short slice, at least once, after a pause that lets the other's spinning
  threads go idle: ``QUIET_S``; the order flips every round) until each has
  ``repeat`` runs and ``min_seconds`` have passed, or the per-model ``max_seconds`` budget is
  spent with at least ``MIN_RUNS`` runs each. The latency is the median run; min and mean
  are kept too. The garbage collector is off while timing;
* GFLOP/s from the ONNX graph's FLOPs (flops.py) and that as a percent of the machine's
  measured fp32 peak at T threads (``matmul_peak``: ONNX Runtime's MatMul of 2048^3, best of
  several runs), and ORT latency / mlpack latency (above 1: mlpack is faster);
* the outputs compared (rtol 1e-3, atol 1e-4, fp32); a mismatch is recorded and flagged.

Peak resident memory is measured once per runtime in a child process (``peak_rss``) that
imports only that runtime and NumPy, loads the model, runs it a few times and reports its own
peak: ``VmHWM`` from /proc/self/status, which is ``ru_maxrss`` without what Linux carries over
from the parent (a child started with vfork + exec inherits the parent's ``ru_maxrss``); plain
``ru_maxrss`` where there is no /proc. Inputs: the container's first test-vector case, or seeded random arrays when
sizes are given (``dims``) or the container has no vectors.
"""

from __future__ import annotations

import gc
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np

from mlpack.spec.errors import Error, InputError

RTOL, ATOL = 1e-3, 1e-4  # fp32 agreement between the runtimes: summation orders differ
MIN_RUNS = 3  # timed runs each runtime gets even when the time budget is spent
SLICE_S = 0.2  # how long one runtime runs per round before the other takes over
# The pause before a runtime's slice when the other ran last (not counted in the budgets):
# ONNX Runtime's intra-op threads keep spinning some 20-50 ms after a run (allow_spinning, its
# default), and a runtime that starts meanwhile competes with them for the cores. A 2-thread
# mlpack run of squeezenet took 10.4 ms right after ONNX Runtime's runs, 10.0 ms 20 ms later
# and 5.5-5.8 ms from 50 ms on, against 5.2 ms alone.
QUIET_S = 0.1
PEAK_N = 2048  # the matmul that measures the machine's peak: PEAK_N^3


class BenchError(Error):
    """The benchmark cannot run: a model ONNX Runtime refuses, inputs it cannot make."""


# ---------------------------------------------------------------- timing


@dataclass
class Timing:
    """Latencies of one runtime at one thread count, in seconds."""

    runs: int
    median_s: float
    min_s: float
    mean_s: float
    stdev_s: float

    @classmethod
    def of(cls, samples: list[float]) -> Timing:
        return cls(len(samples), statistics.median(samples), min(samples),
                   statistics.fmean(samples),
                   statistics.stdev(samples) if len(samples) > 1 else 0.0)


def time_alternating(fns: dict[str, Callable[[], object]], *, repeat: int = 20,
                     min_seconds: float = 2.0, max_seconds: float = 30.0,
                     warmup_seconds: float = 0.5) -> tuple[dict[str, Timing], dict[str, object]]:
    """Time each callable, alternating between them (see the module docstring).

    Returns ({name: Timing}, {name: the last warm-up run's result})."""
    names = list(fns)
    results = {}
    for name in names:  # warm-up: once, then more while it stays cheap
        t0 = time.perf_counter()
        results[name] = fns[name]()
        while time.perf_counter() - t0 < min(warmup_seconds, max_seconds / 10):
            results[name] = fns[name]()
    samples: dict[str, list[float]] = {n: [] for n in names}
    gc_was = gc.isenabled()
    gc.disable()
    try:
        start, rnd, quiet, last = time.perf_counter(), 0, 0.0, None
        while True:
            for name in names if rnd % 2 == 0 else names[::-1]:
                if last is not None and name != last:
                    time.sleep(QUIET_S)
                    quiet += QUIET_S
                last = name
                fn, got = fns[name], samples[name]
                slice_end = time.perf_counter() + SLICE_S
                while True:
                    t = time.perf_counter()
                    fn()
                    done = time.perf_counter()
                    got.append(done - t)
                    if done >= slice_end:
                        break
            rnd += 1
            elapsed = time.perf_counter() - start - quiet
            fewest = min(len(s) for s in samples.values())
            if fewest >= repeat and elapsed >= min_seconds:
                break
            if elapsed >= max_seconds and fewest >= MIN_RUNS:
                break
    finally:
        if gc_was:
            gc.enable()
    return {n: Timing.of(s) for n, s in samples.items()}, results


# ---------------------------------------------------------------- the runtimes


def ort_session(model, threads: int, config: dict | None = None):
    """An ONNX Runtime CPU session as the benchmark runs it (``model``: a path or bytes;
    ``config``: session config entries, e.g. testvectors.EXACT_INT8)."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise BenchError("comparing with ONNX Runtime needs it installed: pip install "
                         "onnxruntime (or pip install -e '.[bench]')") from None

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.log_severity_level = 3
    for key, value in (config or {}).items():
        opts.add_session_config_entry(key, value)
    try:
        return ort.InferenceSession(os.fspath(model) if not isinstance(model, bytes) else model,
                                    opts, providers=["CPUExecutionProvider"])
    except Exception as e:  # ORT raises its own types for a model it refuses
        raise BenchError(f"{model}: ONNX Runtime cannot load it: {type(e).__name__}: "
                         f"{' '.join(str(e).split())}") from None


def load_mlpack(path, threads: int, precision: str | None = None):
    """``mlpack.load(path, threads=threads, precision=precision)``, the portable-fallback and
    unsigned warnings silenced (the result says which artifact ran)."""
    from mlpack.runtime import load
    from mlpack.spec.errors import PortableFallbackWarning, UnsignedContainerWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PortableFallbackWarning)
        warnings.simplefilter("ignore", UnsignedContainerWarning)
        return load(path, threads=threads, precision=precision)


# How far a variant's outputs may be from ONNX Runtime's fp32 ones here: a check that it computes
# the model (a wrong kernel is off by the outputs' whole scale), not of its accuracy, which the
# build and `mlpack validate` judge against the float64 reference
VARIANT_RTOL = {"fp16": 0.05, "bf16": 0.2, "int8": 0.5}


def _ort_feeds(model_proto, feeds: dict) -> dict:
    """``feeds`` plus zeros for the graph inputs mlpack's signature dropped (unused ones)."""
    from mlpack.packager.testvectors import _ort_feeds as fill

    return fill(model_proto, feeds)


def compare_outputs(got: dict, want: dict, rtol: float = RTOL, atol: float = ATOL,
                    scaled: bool = False) -> dict:
    """mlpack's outputs against ONNX Runtime's, by name: match, worst errors, what differs.
    ``scaled``: ``atol`` is relative to each output's largest magnitude (a variant's check)."""
    worst_abs = worst_rel = 0.0
    problems = []
    for name, a in got.items():
        if name not in want:
            problems.append(f"output {name!r}: ONNX Runtime has no such output")
            continue
        a, b = np.asarray(a), np.asarray(want[name])
        if a.shape != b.shape:
            problems.append(f"output {name!r}: shape {a.shape} vs {b.shape}")
            continue
        if a.dtype.kind not in "fc":
            if not np.array_equal(a, b):
                problems.append(f"output {name!r}: values differ")
            continue
        x, y = a.astype(np.float64), b.astype(np.float64)
        a_tol = atol
        if scaled and np.isfinite(y).any():
            a_tol = atol * max(float(np.max(np.abs(y[np.isfinite(y)]))), 1e-30)
        diff = np.abs(x - y)
        if diff.size:
            worst_abs = max(worst_abs, float(np.nanmax(diff)) if not np.isnan(diff).all() else 0.0)
            rel = diff / np.maximum(np.abs(y), a_tol)
            worst_rel = max(worst_rel, float(np.nanmax(rel)) if not np.isnan(rel).all() else 0.0)
        if not np.allclose(x, y, rtol=rtol, atol=a_tol, equal_nan=True):
            bad = int((~np.isclose(x, y, rtol=rtol, atol=a_tol, equal_nan=True)).sum())
            problems.append(f"output {name!r}: {bad} of {a.size} values outside rtol {rtol:g} "
                            f"atol {a_tol:g} (max abs err {float(np.nanmax(diff)):.3g})")
    return {"match": not problems, "max_abs_error": worst_abs, "max_rel_error": worst_rel,
            "rtol": rtol, "atol": atol, "detail": "; ".join(problems)}


# ---------------------------------------------------------------- inputs


def model_inputs(model, dims: dict | None = None, seed: int = 0) -> tuple[dict, str]:
    """Inputs for a loaded mlpack ``model``: ({name: array}, where they came from).

    The first test-vector case when the container has one and no ``dims`` are given; otherwise
    seeded random arrays (``random_inputs``) with every size symbol bound to ``dims``."""
    if not dims:
        cases = model.test_vectors()
        if cases:
            return {k: np.ascontiguousarray(v) for k, v in cases[0][0].items()}, \
                "the container's test vectors (case 0)"
    dims = dict(dims or {})
    symbols = {s for i in model.inputs for s in i.shape if isinstance(s, str)}
    unknown = sorted(set(dims) - symbols)
    if unknown:
        raise InputError(f"--dim {unknown[0]}: the model has no size symbol {unknown[0]!r} "
                         f"(its symbols: {', '.join(sorted(symbols)) or 'none'})")
    return random_inputs(model.inputs, dims, seed), f"seeded random (seed {seed})"


def random_inputs(inputs, dims: dict, seed: int = 0) -> dict:
    """Seeded random arrays for ``inputs`` (each with a name, an IR dtype and a shape of sizes
    and size symbols), every symbol bound to ``dims`` (default 1): floats N(0, 1), integers in
    [0, 10), booleans fair coins."""
    from mlpack.packager.testvectors import _random_array

    rng = np.random.default_rng(seed)
    feeds = {}
    for info in inputs:
        shape = tuple(s if isinstance(s, int) else dims.get(s, 1) for s in info.shape)
        feeds[info.name] = _random_array(rng, info.dtype, shape)
    return feeds


# ---------------------------------------------------------------- peak and memory


_PEAKS: dict[int, float] = {}


def matmul_peak(threads: int, n: int | None = None, refresh: bool = False) -> float | None:
    """The machine's measured fp32 peak in GFLOP/s at ``threads``: ONNX Runtime's MatMul of
    n x n by n x n, best of several runs (None without ONNX Runtime). Measured once per process;
    ``refresh`` measures again and keeps the higher (a busy machine can only lower it)."""
    if threads in _PEAKS and not refresh:
        return _PEAKS[threads]
    n = n or PEAK_N
    try:
        from onnx import TensorProto, helper
    except ImportError:
        return None
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["c"])], "peak",
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [n, n]) for x in "ab"],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [n, n])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    try:
        session = ort_session(model.SerializeToString(), threads)
    except BenchError:
        return None
    rng = np.random.default_rng(0)
    feeds = {x: rng.standard_normal((n, n), dtype=np.float32) for x in "ab"}
    session.run(None, feeds)
    best, t_end = math.inf, time.perf_counter() + 2.0
    for i in range(20):
        t = time.perf_counter()
        session.run(None, feeds)
        best = min(best, time.perf_counter() - t)
        if i >= 4 and time.perf_counter() > t_end:
            break
    _PEAKS[threads] = max(_PEAKS.get(threads, 0.0), 2 * n ** 3 / best / 1e9)
    return _PEAKS[threads]


# the child that measures one runtime's peak resident memory: imports NumPy and that runtime only
_RSS_CHILD = r"""
import json, resource, sys, time, warnings
import numpy as np
runtime, path, inputs, threads, runs = sys.argv[1:6]
threads, runs = int(threads), int(runs)
with np.load(inputs, allow_pickle=False) as z:
    feeds = {k: z[k] for k in z.files}
def hwm():  # this process image's peak RSS in KiB (VmHWM; ru_maxrss where there is no /proc)
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
base = hwm()
if runtime == "mlpack":
    warnings.simplefilter("ignore")
    from mlpack.runtime import load
    model = load(path, threads=threads)
    names = {i.name for i in model.inputs}
    feeds = {k: v for k, v in feeds.items() if k in names}
    run = lambda: model.run(feeds)
else:
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.log_severity_level = 3
    session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    run = lambda: session.run(None, feeds)
end = time.perf_counter() + 5.0
for i in range(runs):
    run()
    if time.perf_counter() > end:
        break
print(json.dumps({"peak_kib": hwm(), "base_kib": base, "runs": i + 1}))
"""


def peak_rss(runtime: str, path, feeds: dict, threads: int, runs: int = 3) -> dict | None:
    """Peak resident memory (MiB) of a fresh process that loads ``path`` in ``runtime``
    ("mlpack" or "ort") and runs it on ``feeds`` up to ``runs`` times (5 s at most after the
    first): {"peak_mib", "base_mib" (Python, NumPy and the inputs), "runs"}; None if it fails."""
    with tempfile.TemporaryDirectory(prefix="mlpack-bench-") as tmp:
        inputs = os.path.join(tmp, "inputs.npz")
        np.savez(inputs, **feeds)
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        proc = subprocess.run([sys.executable, "-c", _RSS_CHILD, runtime, os.fspath(path), inputs,
                               str(threads), str(runs)], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        tail = " ".join(proc.stderr.split()[-40:])
        warnings.warn(f"peak memory of {runtime} on {path}: the child process failed: {tail}",
                      stacklevel=2)
        return None
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"peak_mib": got["peak_kib"] / 1024, "base_mib": got["base_kib"] / 1024,
            "runs": got["runs"]}


# ---------------------------------------------------------------- one model


def _artifact_doc(model) -> dict:
    a = model.artifact
    return {"index": a.index, "target": a.target, "device": a.device, "precision": a.precision,
            "reason": a.reason}


def _variant_rtol(model) -> float | None:
    """How far this artifact may be from ONNX Runtime (VARIANT_RTOL): by the precision its
    tolerance is of, which is int8's for every artifact of a model that quantizes itself."""
    chosen = next(v.artifact for v in model.verdicts if v.chosen)
    recorded = (chosen.config.get("accuracy") or {}).get("tolerance") or {}
    return VARIANT_RTOL.get(recorded.get("precision", chosen.precision))


def _per_runtime(t: Timing, flops: int | None, peak: float | None) -> dict:
    d = asdict(t)
    gflops = flops / t.median_s / 1e9 if flops and t.median_s > 0 else None
    d["gflops"] = gflops
    d["percent_of_peak"] = 100 * gflops / peak if gflops is not None and peak else None
    return d


def bench_model(container, *, onnx_path=None, name: str | None = None,
                threads=(1, 2), repeat: int = 20, min_seconds: float = 2.0,
                max_seconds: float = 30.0, dims: dict | None = None, seed: int = 0,
                rss: bool = True, build_seconds: float | None = None, refresh_peak: bool = False,
                precision: str | None = None,
                progress: Callable[[str], None] | None = None,
                probe: Callable[[int], dict] | None = None) -> dict:
    """One model's numbers (see the module docstring) as a JSON-ready dict.

    ``container``: the .mlpack file; ``onnx_path``: the ONNX model to compare with (without it
    only mlpack is timed and there are no FLOPs); ``threads``: thread counts; ``repeat``,
    ``min_seconds``, ``max_seconds``: the stopping rule of ``time_alternating`` per thread
    count; ``dims``/``seed``: random inputs instead of the test vectors; ``rss``: measure peak
    memory in child processes; ``build_seconds``: recorded as given; ``refresh_peak``: measure
    the matmul peak again before each thread count (a suite does, so that the best of many
    measurements stands for the peak of a machine that other work keeps busy); ``precision``:
    the artifact of that precision (None: the one ``mlpack.load`` picks); ``probe``: called
    with the thread count right before and right after its timing, each of its values
    recorded in the row as [before, after] (benchmarks/run.py: the cross-core round trip,
    which a 2-thread row depends on)."""
    say = progress or (lambda line: None)
    container = os.fspath(container)
    proto = None
    if onnx_path is not None:
        from mlpack.codegen.onnx.importer import load_model

        proto = load_model(onnx_path)
    threads = list(threads)
    with load_mlpack(container, threads[0], precision) as first:
        feeds, source = model_inputs(first, dims, seed)
        artifact = _artifact_doc(first)
        variant_rtol = _variant_rtol(first)
        out_names = [o.name for o in first.outputs]
    flops = None
    full_feeds = _ort_feeds(proto, feeds) if proto is not None else feeds
    if proto is not None:
        from mlpack.packager.flops import count_flops

        count = count_flops(proto, feeds=full_feeds)
        # a partial count would understate every GFLOP/s figure: none rather than a wrong one
        flops = count.total if count.total and not count.unknown else None
    result = {"model": name or os.path.splitext(os.path.basename(container))[0],
              "container": container, "onnx": os.fspath(onnx_path) if onnx_path else None,
              "artifact": artifact, "input_source": source,
              "inputs": {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in feeds.items()},
              "flops": flops, "build_seconds": build_seconds, "outputs": None, "threads": [],
              "load_average": _load()}
    checks = []
    for t in threads:
        say(f"{result['model']}: timing at {t} thread{'s' * (t != 1)}")
        peak = matmul_peak(t, refresh=refresh_peak) if flops else None
        with load_mlpack(container, t, precision) as model:
            fns = {"mlpack": lambda: model.run(feeds)}
            session = None
            if proto is not None:
                session = ort_session(onnx_path, t)
                fns["ort"] = lambda: session.run(None, full_feeds)
            before = probe(t) if probe else {}
            ticks = cpu_ticks()
            timings, outs = time_alternating(fns, repeat=repeat, min_seconds=min_seconds,
                                             max_seconds=max_seconds)
            steal = steal_percent(ticks, cpu_ticks())
            after = probe(t) if probe else {}
        row = {"threads": t, "matmul_peak_gflops": peak, "steal_percent": steal,
               "mlpack": _per_runtime(timings["mlpack"], flops, peak), "ort": None, "ratio": None,
               **{k: [v, after.get(k)] for k, v in before.items()}}
        if session is not None:
            row["ort"] = _per_runtime(timings["ort"], flops, peak)
            row["ratio"] = timings["ort"].median_s / timings["mlpack"].median_s
            ort_outs = dict(zip([o.name for o in session.get_outputs()], outs["ort"]))
            tol = variant_rtol
            checks.append(compare_outputs({k: outs["mlpack"][k] for k in out_names}, ort_outs,
                                          *((tol, tol, True) if tol else ())))
        result["threads"].append(row)
    if checks:
        tol = variant_rtol
        worst = {"match": all(c["match"] for c in checks),
                 "max_abs_error": max(c["max_abs_error"] for c in checks),
                 "max_rel_error": max(c["max_rel_error"] for c in checks),
                 "rtol": tol or RTOL, "atol": tol or ATOL,
                 "detail": "; ".join(dict.fromkeys(c["detail"] for c in checks if c["detail"]))}
        result["outputs"] = worst
    if rss:
        t = max(threads)
        say(f"{result['model']}: peak memory (child processes, {t} thread{'s' * (t != 1)})")
        result["peak_rss"] = {"threads": t, "mlpack": peak_rss("mlpack", container, feeds, t),
                              "ort": peak_rss("ort", onnx_path, full_feeds, t)
                              if onnx_path is not None else None}
    return result


# ---------------------------------------------------------------- the document and the table


def machine() -> dict:
    """What the numbers were measured on (no paths)."""
    from mlpack.runtime.host import cpu_name

    cpu = cpu_name() or platform.processor() or platform.machine()
    versions = {"python": platform.python_version(), "numpy": np.__version__}
    try:
        from mlpack import __version__

        versions["mlpack"] = __version__
    except ImportError:  # pragma: no cover
        pass
    try:
        import onnxruntime

        versions["onnxruntime"] = onnxruntime.__version__
    except ImportError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "system": platform.system(),
            "architecture": platform.machine(), "versions": versions, "load_average": _load()}


def cpu_ticks() -> tuple[int, int] | None:
    """(all, stolen) CPU time of the machine so far, in clock ticks (/proc/stat's cpu line);
    None where there is no /proc. Stolen time is what a hypervisor gave other guests while
    this one had work: on a shared VM it slows both runtimes, not always alike."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    ticks = [int(x) for x in fields[1:9]]   # user nice system idle iowait irq softirq steal
    return sum(ticks), ticks[7]


def steal_percent(before, after) -> float | None:
    """The share of the machine's CPU time stolen between two ``cpu_ticks`` readings."""
    if before is None or after is None or after[0] <= before[0]:
        return None
    return 100.0 * (after[1] - before[1]) / (after[0] - before[0])


def _load() -> list[float] | None:
    """The 1, 5 and 15 minute load averages: other work on the machine skews every number."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):  # pragma: no cover (not on every system)
        return None


def geomean_ratios(results: list[dict]) -> dict[str, float]:
    """The geometric mean of ORT/mlpack per thread count, over the models that have one."""
    by_t: dict[int, list[float]] = {}
    for r in results:
        for row in r["threads"]:
            if row["ratio"]:
                by_t.setdefault(row["threads"], []).append(row["ratio"])
    return {str(t): math.exp(statistics.fmean(math.log(x) for x in xs))
            for t, xs in sorted(by_t.items())}


def _rebase(results: list[dict]) -> None:
    """Percent of peak against the best peak measured in this process (it may have risen since
    a model was timed)."""
    for r in results:
        for row in r["threads"]:
            peak = _PEAKS.get(row["threads"])
            if not peak:
                continue
            row["matmul_peak_gflops"] = peak
            for side in (row["mlpack"], row["ort"]):
                if side and side.get("gflops") is not None:
                    side["percent_of_peak"] = 100 * side["gflops"] / peak


def document(results: list[dict], command: str = "") -> dict:
    """The JSON document of a benchmark run (percent of peak against the best peak measured)."""
    _rebase(results)
    peaks = {str(t): p for t, p in sorted(_PEAKS.items())}
    return {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "command": command,
            "machine": machine(), "matmul_peak_gflops": peaks,
            "tolerance": {"rtol": RTOL, "atol": ATOL}, "models": results,
            "geomean_ratio": geomean_ratios(results)}


def si(n: float) -> str:
    """``n`` with an SI prefix and a trailing space: 1280 -> "1.28 k", 8.2e9 -> "8.2 G"."""
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {prefix}"
    return f"{n:.3g} "


def _ms(x) -> str:
    return "-" if x is None else f"{x * 1e3:.3g}" if x * 1e3 < 100 else f"{x * 1e3:.0f}"


def _num(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _mib(rss: dict | None, key: str) -> str:
    got = (rss or {}).get(key)
    return "-" if not got else f"{got['peak_mib']:.0f}"


def mismatches(results: list[dict]) -> list[str]:
    """One line per model whose outputs disagree between the runtimes."""
    return [f"{r['model']}: {r['outputs']['detail']}" for r in results
            if r.get("outputs") and not r["outputs"]["match"]]


def table_lines(results: list[dict]) -> list[str]:
    """The results as a text table: a row per model and thread count."""
    head = ("model", "T", "mlpack ms", "ORT ms", "ORT/mlpack", "mlpack GF/s", "%peak",
            "ORT GF/s", "%peak", "steal %", "build s", "RSS mlpack MiB", "RSS ORT MiB",
            "outputs")
    rows = []
    for r in results:
        out = r.get("outputs")
        verdict = "-" if out is None else "ok" if out["match"] else "MISMATCH"
        for i, row in enumerate(r["threads"]):
            m, o = row["mlpack"], row["ort"] or {}
            first = i == 0
            rows.append((
                r["model"] if first else "", str(row["threads"]), _ms(m["median_s"]),
                _ms(o.get("median_s")), _num(row["ratio"], ".3f"), _num(m["gflops"], ".2f"),
                _num(m["percent_of_peak"], ".1f"), _num(o.get("gflops"), ".1f"),
                _num(o.get("percent_of_peak"), ".1f"), _num(row.get("steal_percent"), ".0f"),
                _num(r.get("build_seconds"), ".1f") if first else "",
                _mib(r.get("peak_rss"), "mlpack") if first else "",
                _mib(r.get("peak_rss"), "ort") if first else "", verdict if first else ""))
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    return ["  ".join(x.ljust(w) for x, w in zip(line, widths)).rstrip()
            for line in (head, *rows)]


def summary_lines(doc: dict) -> list[str]:
    """The lines under the table: the peak, the geometric means, any mismatch."""
    lines = []
    peaks = ", ".join(f"{p:.1f} GFLOP/s at {t} thread{'s' * (t != '1')}"
                      for t, p in doc["matmul_peak_gflops"].items() if p)
    if peaks:
        lines.append(f"matmul peak (ONNX Runtime sgemm {PEAK_N}^3): {peaks}")
    for t, g in doc["geomean_ratio"].items():
        lines.append(f"geometric mean ORT/mlpack at {t} thread{'s' * (t != '1')}: {g:.3f} "
                     f"(mlpack is {1 / g:.1f}x slower)" if g < 1 else
                     f"geometric mean ORT/mlpack at {t} thread{'s' * (t != '1')}: {g:.3f}")
    return lines


__all__ = ["bench_model", "time_alternating", "Timing", "ort_session", "load_mlpack",
           "compare_outputs", "model_inputs", "matmul_peak", "peak_rss", "document",
           "table_lines", "summary_lines", "mismatches", "geomean_ratios", "machine", "cpu_ticks",
           "steal_percent",
           "BenchError", "RTOL", "ATOL"]
