"""benchmarks/crosscore.py: the cross-core round trip a benchmark run records beside its
2-thread rows (the probe is built with zig's C compiler and run on two CPUs of the process)."""

from __future__ import annotations

import os

import pytest

from benchmarks import crosscore, report

CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1


@pytest.mark.skipif(CPUS < 2, reason="one CPU (or no affinity to read): nothing to cross")
def test_a_round_trip_between_two_cpus_is_measured():
    ns = crosscore.round_trip_ns(rounds=500, batches=1)   # (fast even if a CPU is busy)
    # a cache line's round trip between two cores: tens of ns (one L3) to a few microseconds
    # (sockets, a busy hypervisor); the probe's own loop adds nanoseconds
    assert ns is not None and 5 < ns < 100_000


def test_one_cpu_measures_nothing(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert crosscore.round_trip_ns() is None


def test_the_report_prints_the_round_trips_of_a_run():
    doc = {"date": "2026-12-01", "command": "python -m benchmarks.run",
           "machine": {"cpu": "AMD EPYC", "cores": 2, "system": "Linux",
                       "architecture": "x86_64", "versions": {},
                       "cross_core_round_trip_ns": {"start": 380.2, "end": None}},
           "matmul_peak_gflops": {"1": 240.0}, "models": [], "geomean_ratio": {}}
    assert "cross-core round trip (one cache line, benchmarks/crosscore.py): 380 ns at the " \
           "start, - at the end" in report.markdown(doc)
    doc["machine"].pop("cross_core_round_trip_ns")
    assert "cross-core round trip" not in report.markdown(doc)


def test_the_report_prints_each_two_thread_rows_round_trips():
    """benchmarks.run probes the round trip right before and after each 2-thread row's timing
    (packager.bench's ``probe``): the report's column shows both, a 1-thread row none."""
    row = lambda t, **kw: {"threads": t, "ratio": 1.1, "steal_percent": 0.0, "ort": None,  # noqa
                           "mlpack": {"median_s": 0.002, "gflops": None, "percent_of_peak": None,
                                      "runs": 10}, **kw}
    doc = {"date": "2026-12-01", "command": "python -m benchmarks.run",
           "machine": {"cpu": "AMD EPYC", "cores": 2, "system": "Linux",
                       "architecture": "x86_64", "versions": {}},
           "matmul_peak_gflops": {"1": 240.0}, "geomean_ratio": {},
           "models": [{"model": "m", "threads": [row(1), row(2, cross_core_ns=[110.4, 431.0])]}]}
    text = report.markdown(doc)
    assert "| steal % | cross-core ns |" in text
    assert "| 0 | 110 / 431 |" in text and "| 0 | - |" in text
