"""One container timed in several fresh processes: does its speed depend on the process?

    python -m benchmarks.processes MODEL.mlpack [--processes 8] [--runs 30] [--threads 1]

Each process loads the container, runs it on seeded random inputs (packager.bench.random_inputs)
a few times to warm up, and prints the median of ``--runs`` timed runs made on its main thread,
and the median of as many made on a thread it starts. A thread's stack starts on a page, while
the main thread's lies wherever this process's address-space randomization put it; a kernel
whose speed depends on where its frame lies (a spill or a tile buffer across two cache lines)
shows up as processes whose main-thread median stands apart from the others and from their own
thread's. Comparing medians across processes is the point: a whole-set run measures each model
in a single process and cannot tell such a model from a noisy minute.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = r"""
import json, statistics, sys, threading, time, warnings
warnings.simplefilter("ignore")
import mlpack
from mlpack.packager.bench import random_inputs
path, runs, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
model = mlpack.load(path, threads=threads)
feeds = random_inputs(model.inputs, {}, 0)
def median():
    for _ in range(3):
        model.run(feeds)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        model.run(feeds)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3
out = {"main": median()}
worker = threading.Thread(target=lambda: out.__setitem__("thread", median()))
worker.start()
worker.join()
print(json.dumps(out))
"""


def measure(path: str, processes: int, runs: int, threads: int) -> list[dict[str, float]]:
    """Per process, {"main": ms, "thread": ms}: the medians on its main thread and on another."""
    out = []
    for _ in range(processes):
        done = subprocess.run([sys.executable, "-c", CHILD, path, str(runs), str(threads)],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"{path}: the child process failed:\n{done.stderr.strip()}")
        out.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return out


def main(argv=None) -> list[dict[str, float]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("container")
    ap.add_argument("--processes", type=int, default=8)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    if args.processes < 1 or args.runs < 1 or args.threads < 1:
        ap.error("--processes, --runs and --threads: positive integers")
    got = measure(args.container, args.processes, args.runs, args.threads)
    for side in ("main", "thread"):
        values = [g[side] for g in got]
        print(f"{side:6s} ms per run, one process each: " + " ".join(f"{v:.2f}" for v in values)
              + f"   (spread {max(values) / min(values):.2f}x)")
    return got


if __name__ == "__main__":
    main()
