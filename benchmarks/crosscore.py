"""How long two cores take to hand a cache line back and forth: a machine property that the
2-thread rows of a benchmark depend on, recorded beside them.

A virtual machine's two vCPUs may sit on one core complex (sharing an L3) or on two (every
line one core wrote and the other reads crosses the package's fabric), and a hypervisor may
move them between the two while a benchmark runs. On the Zen 5 guest of benchmarks/RESULTS.md
the same GoogLeNet container ran at 5.6 ms a run at 2 threads for some minutes and 7.4 ms in
the next, its 1-thread time unchanged: a ping-pong of one cache line between the two CPUs
took 380 ns a round trip in the slow state, where one L3 would answer in well under half that.
So the benchmark measures it at the start and at the end of a run (``run.py``), and the report
prints both.

The probe is a small C program (two threads pinned to two CPUs of the process's affinity set,
each waiting for the other's store to a shared counter), compiled with zig's C compiler from
the ``ziglang`` wheel that linking already needs. ``python -m benchmarks.crosscore`` prints
one measurement.
"""

from __future__ import annotations

import functools
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROUNDS = 100_000     # round trips a measurement times (about 40 ms at 400 ns)
BATCHES = 5          # measurements; the median is reported

_SOURCE = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static _Atomic long flag __attribute__((aligned(64)));
static long rounds;
static int cpu_a, cpu_b;

static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

static void *answer(void *unused) {
    (void)unused;
    pin(cpu_b);
    for (long i = 0; i < rounds; i++) {
        while (atomic_load(&flag) != 2 * i + 1) {
        }
        atomic_store(&flag, 2 * i + 2);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 4) return 2;
    cpu_a = atoi(argv[1]);
    cpu_b = atoi(argv[2]);
    rounds = atol(argv[3]);
    pin(cpu_a);
    atomic_store(&flag, 0);
    pthread_t t;
    if (pthread_create(&t, 0, answer, 0)) return 1;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long i = 0; i < rounds; i++) {
        atomic_store(&flag, 2 * i + 1);
        while (atomic_load(&flag) != 2 * i + 2) {
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    pthread_join(t, 0);
    double ns = (t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec);
    printf("%.1f\n", ns / rounds);
    return 0;
}
"""

@functools.cache
def _probe() -> Path:
    """The compiled probe, once per process."""
    folder = Path(tempfile.mkdtemp(prefix="mlpack-crosscore-"))
    src = folder / "crosscore.c"
    src.write_text(_SOURCE)
    exe = folder / "crosscore"
    subprocess.run([sys.executable, "-m", "ziglang", "cc", "-O2", "-o", str(exe), str(src),
                    "-lpthread"], check=True, capture_output=True, timeout=120)
    return exe


def round_trip_ns(rounds: int = ROUNDS, batches: int = BATCHES) -> float | None:
    """The median over ``batches`` of the time one cache line takes to go from the first CPU
    of this process's affinity set to the second and back, in ns; None where the process may
    run on one CPU only, or the probe cannot be built or run (no C compiler for this host)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cpus) < 2:
        return None
    try:
        exe = _probe()
        got = [float(subprocess.run([str(exe), str(cpus[0]), str(cpus[1]), str(rounds)],
                                    check=True, capture_output=True, text=True,
                                    timeout=10).stdout) for _ in range(batches)]
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    return round(statistics.median(got), 1)


def main() -> None:
    ns = round_trip_ns()
    print("cross-core round trip: " + ("not measurable here (one CPU, or no C compiler)"
                                       if ns is None else f"{ns:.0f} ns"))


if __name__ == "__main__":
    main()
