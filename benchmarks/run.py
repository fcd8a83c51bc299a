"""The benchmark suite: build every model of benchmarks/models.py, time it in mlpack and in ONNX
Runtime, print a table, and optionally write JSON and a chart.

    python -m benchmarks.run                                   # every model, 1 and 2 threads
    python -m benchmarks.run --models mlp,resnet50 --threads 1 --json out.json --chart out.png
    python benchmarks/run.py --list
    python -m benchmarks.run --set real --models gpt2_small@512,tv_swin_t --threads 1,2
    python -m benchmarks.run --set heldout --threads 1,2

Per model: the ONNX file is made (or reused) in the cache folder, ``mlpack build`` turns it into
a container once (timed: the build time, every default target), then packager/bench.py times
both runtimes in this process, alternating, at each thread count, compares their outputs and
measures each one's peak memory in a child process (the timing code is shared with
``mlpack bench``). Each model gets a time budget per thread count (``--max-seconds``): a model
that is slow today gets fewer runs (never fewer than three) rather than being dropped. A model
that fails to build is reported and the run goes on; the exit code is 1 if any model failed or
any outputs disagree, else 0.

``--set real`` runs issue 20's real-model set instead (benchmarks/real_models.py, ``BENCH``):
torchvision and transformers architectures exported offline with seeded random weights, each
entry timed at its fixed sizes (batch 1; a text model's sequence, e.g. ``gpt2_small@512``) on
seeded random inputs (``--seed`` seeds the inputs here; the weights are the module's). Entries of
one model share its export and its container, built once per run. An entry whose library (torch,
transformers, torchvision) is not installed is reported as skipped, not failed. ``--set heldout``
runs the real models outside that set the same way (``real_models.HELD_OUT``: no schedule was
tuned on them).

With 2 threads or more the run also measures, at its start and at its end, how long a cache
line takes between two of the machine's CPUs (``crosscore.py``): the 2-thread rows of a virtual
machine depend on whether its vCPUs share an L3 at the time, and the report prints both.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
import warnings
from pathlib import Path

if __package__ in (None, ""):  # python benchmarks/run.py: make the checkout importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import crosscore  # noqa: E402
from benchmarks import models as bench_models  # noqa: E402
from benchmarks import real_models  # noqa: E402
from benchmarks import report  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _say(line: str) -> None:
    print(f"  {line}", file=sys.stderr, flush=True)


def _relative(path) -> str | None:
    """A path as the JSON records it: relative to the checkout when inside it (no machine paths)."""
    if path is None:
        return None
    p = Path(path).resolve()
    try:
        return str(p.relative_to(ROOT))
    except ValueError:
        return p.name


def _csv(text: str, what: str, cast=str) -> list:
    items = [x.strip() for x in text.split(",") if x.strip()]
    try:
        return [cast(x) for x in items]
    except ValueError:
        raise SystemExit(f"error: {what} {text!r}: expected a comma-separated list") from None


def build_one(name: str, folder: Path, seed: int, materialize=bench_models.materialize):
    """(onnx path, container path, build seconds, skipped targets) for model ``name`` of the
    set whose ``materialize`` makes its ONNX file."""
    from mlpack.packager.build import SkippedTargetWarning, build

    onnx_path = materialize(name, folder, seed)
    container = folder / f"{name}.mlpack"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SkippedTargetWarning)
        t0 = time.perf_counter()
        built = build(onnx_path, container)
        seconds = time.perf_counter() - t0
    return onnx_path, container, seconds, [f"{t}: {why}" for t, why in built.skipped]


def _real_set_materialize(name: str, folder: Path, seed: int) -> Path:
    # the real models' weights have the module's seed only (its recipe); --seed seeds the inputs
    return real_models.materialize(name, folder)


def run(names, threads, *, folder: Path, seed: int, repeat: int, min_seconds: float,
        max_seconds: float, rss: bool, real: dict | None = None,
        skipped_models: list[str] | None = None) -> tuple[list[dict], list[str]]:
    """Every model's result dict, and one line per model that could not be benchmarked.
    ``real``: the set ``names`` are entries of (real_models.BENCH or HELD_OUT), timed at their
    dims on inputs seeded by ``seed``; an entry whose library is missing is appended to
    ``skipped_models`` (a line saying why) instead of failing."""
    from mlpack.packager import bench

    make = _real_set_materialize if real else bench_models.materialize
    skipped_models = [] if skipped_models is None else skipped_models
    results, failures = [], []
    built = {}  # model -> build_one's result: the entries of one model share its container
    for i, name in enumerate(names):
        model, timing = name, {}
        if real:
            entry = real[name]
            model, timing = entry.model, {"dims": entry.dims, "seed": seed}
            if not real_models.available(model):
                line = (f"{name}: needs torch and {real_models.MODELS[model].library}, "
                        f"not installed")
                skipped_models.append(line)
                print(f"SKIPPED {line}", file=sys.stderr, flush=True)
                continue
        _say(f"[{i + 1}/{len(names)}] {name}: build")
        try:
            if model not in built:
                built[model] = build_one(model, folder, seed, make)
                _say(f"{name}: built in {built[model][2]:.1f}s")
            onnx_path, container, seconds, skipped = built[model]
            r = bench.bench_model(container, onnx_path=onnx_path, name=name, threads=threads,
                                  repeat=repeat, min_seconds=min_seconds,
                                  max_seconds=max_seconds, rss=rss, build_seconds=seconds,
                                  refresh_peak=True, progress=_say, probe=_crossing,
                                  **timing)
        except KeyboardInterrupt:
            raise
        except Exception as e:  # one model's failure is reported; the others still run
            if os.environ.get("MLPACK_DEBUG"):
                traceback.print_exc()
            line = f"{name}: {type(e).__name__}: {' '.join(str(e).split())}"
            failures.append(line)
            print(f"FAILED {line}", file=sys.stderr, flush=True)
            continue
        r["container"], r["onnx"] = _relative(r["container"]), _relative(r["onnx"])
        r["skipped_targets"] = skipped
        results.append(r)
        if r["outputs"] and not r["outputs"]["match"]:
            print(f"MISMATCH {name}: {r['outputs']['detail']}", file=sys.stderr, flush=True)
    return results, failures


def _crossing(threads: int) -> dict:
    """A 2-thread row's cross-core round trips, before and after its timing (crosscore.py: a
    hypervisor may move the two vCPUs apart for some minutes of a run)."""
    return {"cross_core_ns": crosscore.round_trip_ns()} if threads > 1 else {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", choices=("default", "real", "heldout"), default="default",
                        dest="set_",
                        help="the model set: benchmarks/models.py's (default), or issue 20's "
                             "real models (benchmarks/real_models.py, needs torch, transformers "
                             "and torchvision), or the real models outside it (heldout)")
    parser.add_argument("--models", default=None,
                        help="comma-separated names in the set (default: all; --list shows them); "
                             "under --set real a model's name selects all its entries")
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--repeat", type=int, default=20,
                        help="timed runs per runtime and thread count (the time budget may cut it)")
    parser.add_argument("--min-seconds", type=float, default=2.0,
                        help="keep timing at least this long per model and thread count")
    parser.add_argument("--max-seconds", type=float, default=20.0,
                        help="time budget per model and thread count (at least 3 runs each)")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--chart", type=Path, default=None, help="write a bar chart (PNG) here")
    parser.add_argument("--cache", type=Path, default=None,
                        help="folder for the ONNX files and containers (default "
                             "benchmarks/.models; benchmarks/.models/real under --set real)")
    parser.add_argument("--seed", type=int, default=bench_models.SEED,
                        help="weights' seed (under --set real: the inputs' seed)")
    parser.add_argument("--no-rss", action="store_true", help="skip the peak-memory children")
    parser.add_argument("--list", action="store_true", help="list the models and exit")
    args = parser.parse_args(argv)
    real = real_models.SETS.get(args.set_)
    everything = tuple(real) if real else bench_models.NAMES
    if args.list:
        if real:
            width = max(map(len, everything))
            for e in real.values():
                note = "" if real_models.available(e.model) else \
                    f"  (not installed: {real_models.MODELS[e.model].library})"
                dims = " ".join(f"{k}={v}" for k, v in e.dims.items())
                print(f"{e.name.ljust(width)}  {dims}{note}")
        else:
            print("\n".join(everything))
        return 0
    names = _csv(args.models, "--models") if args.models is not None else list(everything)
    if real:  # a model's name stands for its entries (gpt2_small: @128 and @512)
        names = list(dict.fromkeys(e for n in names for e in (
            [n] if n in real else [x.name for x in real.values() if x.model == n] or [n])))
    unknown = [n for n in names if n not in everything]
    if unknown:
        what = ("entry of the real set", "entries") if real else ("model", "models")
        parser.error(f"unknown {what[0]} {unknown[0]!r}; the {what[1]} are: "
                     f"{', '.join(everything)}")
    folder = args.cache if args.cache is not None else (
        real_models.DEFAULT_FOLDER if real else bench_models.DEFAULT_FOLDER)
    threads = _csv(args.threads, "--threads", int)
    if not threads or min(threads) < 1:
        parser.error("--threads: positive integers, e.g. 1,2")
    if args.repeat < 1:
        parser.error("--repeat: at least 1")
    if args.chart is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            parser.error("--chart needs matplotlib (pip install -e '.[bench]')")

    from mlpack.packager import bench

    t0 = time.perf_counter()
    _say("measuring the matmul peak")
    for t in threads:
        bench.matmul_peak(t)
    crossing = {"start": crosscore.round_trip_ns()} if max(threads) > 1 else {}
    skipped = []
    results, failures = run(names, threads, folder=folder, seed=args.seed,
                            repeat=args.repeat, min_seconds=args.min_seconds,
                            max_seconds=args.max_seconds, rss=not args.no_rss, real=real,
                            skipped_models=skipped)
    _say("measuring the matmul peak again (the best of both counts)")
    for t in threads:
        bench.matmul_peak(t, refresh=True)
    command = "python -m benchmarks.run" + "".join(f" {a}" for a in (argv or sys.argv[1:]))
    doc = bench.document(results, command)
    if crossing:   # (the 2-thread rows depend on it: crosscore.py)
        crossing["end"] = crosscore.round_trip_ns()
        doc["machine"]["cross_core_round_trip_ns"] = crossing
    doc["failures"] = failures
    if real:
        doc["set"], doc["skipped"] = args.set_, skipped
    doc["seconds"] = round(time.perf_counter() - t0, 1)
    for line in bench.table_lines(results):
        print(line)
    print()
    for line in bench.summary_lines(doc):
        print(line)
    bad = bench.mismatches(results)
    for line in bad:
        print(f"MISMATCH (outputs disagree beyond rtol {bench.RTOL:g}, atol {bench.ATOL:g}): "
              f"{line}")
    for line in failures:
        print(f"FAILED: {line}")
    for line in skipped:
        print(f"SKIPPED: {line}")
    print(f"({doc['seconds']:.0f}s; load average at the end: {doc['machine']['load_average']})")
    if args.json is not None:
        import json

        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    if args.chart is not None:
        if results:
            report.chart(doc, args.chart)
        else:
            print("no results: no chart written", file=sys.stderr)
    return 1 if bad or failures else 0


if __name__ == "__main__":
    sys.exit(main())
