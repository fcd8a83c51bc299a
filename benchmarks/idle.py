"""Latency after idle: a model's first runs after a pause, beside ONNX Runtime's.

    python -m benchmarks.idle MODEL.onnx MODEL.mlpack [--threads 2] [--idle 0.01,0.1,1]
                              [--rounds 6] [--dims name=value,...]

A server answers requests that come apart: its runtime's threads have gone idle between them.
For each pause length, each runtime (mlpack's container and ONNX Runtime on the ONNX file, on
the same seeded inputs) sleeps that long, then its first run and the mean of the next three
are timed, ``--rounds`` times (medians printed), beside its steady latency (runs back to back).
mlpack is measured first, then ONNX Runtime, whose threads spin on after its runs (a pause
comes before every timed run, so neither's threads are busy when the other's are timed). A
runtime whose threads sleep soon after a job wakes them for every dispatch of the next run;
on a virtual machine a core that has idled wakes slowly for a while (runtime/c/src/pool.c's
polling, RESULTS.md).
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

from benchmarks.ab import size_dims


def _profile(run, idles: list[float], rounds: int) -> dict:
    """{"steady": ms, pause: (first run ms, next three runs' mean ms)} of ``run``."""
    for _ in range(5):
        run()

    def block(n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            run()
        return (time.perf_counter() - t0) / n * 1e3
    out: dict = {"steady": statistics.median(block(3) for _ in range(max(rounds, 5)))}
    for idle in idles:
        first, after = [], []
        for _ in range(rounds):
            time.sleep(idle)
            first.append(block(1))
            after.append(block(3))
        out[idle] = (statistics.median(first), statistics.median(after))
    return out


def main(argv=None) -> None:
    import mlpack
    from mlpack.packager.bench import ort_session, random_inputs

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("container")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--idle", default="0.01,0.1,1", help="pause lengths in seconds")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--dims", default="sequence=128", help="size symbols, name=value,...")
    args = ap.parse_args(argv)
    idles = [float(x) for x in args.idle.split(",") if x]
    warnings.simplefilter("ignore")   # (unsigned containers: the user's own builds)
    model = mlpack.load(args.container, threads=args.threads)
    session = ort_session(args.model, args.threads)
    feeds = random_inputs(model.inputs, size_dims(args.dims))
    runs = {"mlpack": lambda: model.run(feeds), "ORT": lambda: session.run(None, feeds)}
    got = {name: _profile(run, idles, args.rounds) for name, run in runs.items()}
    print(f"{args.threads} thread(s), medians of {args.rounds} rounds, ms")
    print(f"{'pause':>8}  " + "  ".join(f"{n + ' first':>12}  {n + ' next 3':>12}" for n in runs))
    print(f"{'steady':>8}  " + "  ".join(f"{got[n]['steady']:>12.3f}  {'':>12}" for n in runs))
    for idle in idles:
        print(f"{idle:>7g}s  " + "  ".join(f"{got[n][idle][0]:>12.3f}  {got[n][idle][1]:>12.3f}"
                                          for n in runs))


if __name__ == "__main__":
    main()
