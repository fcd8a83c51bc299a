"""benchmarks/ceiling.py: the host's FMA ceiling, and the most ORT/mlpack can be on a run's
models when every contraction ran at it."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks import ceiling


def test_the_widest_vector_fma_is_counted():
    assert ceiling._vector_lanes("+sse4.2,+avx2,+fma,+avx512f,-amx-tile") == 16
    assert ceiling._vector_lanes("+sse4.2,+avx2,+fma,-avx512f") == 8
    assert ceiling._vector_lanes("+neon,+fp-armv8") == 4


def test_the_ceiling_is_measured_on_this_host():
    peak = ceiling.fma_peak(1, tries=2)
    # some GFLOP/s (a 2-core CI guest: about 100 on AVX-512), not a constant
    assert math.isfinite(peak) and peak > 1.0


def _doc():
    timed = {"mlpack": {"median_s": 0.010}, "ort": {"median_s": 0.012}}
    return {"models": [
        {"model": "a", "flops": 2e9, "threads": [{"threads": 1, **timed}]},
        {"model": "uncounted", "flops": None, "threads": [{"threads": 1, **timed}]}]}


def test_the_most_a_ratio_can_be_is_ort_over_the_ceilings_time():
    rows = ceiling.bounds(_doc(), {1: 400.0})
    assert [r["model"] for r in rows] == ["a"]      # no FLOPs, no bound
    r = rows[0]
    floor = 2e9 / 400e9                              # 5 ms at the ceiling
    assert r["most_ratio"] == pytest.approx(0.012 / floor)
    assert r["ratio"] == pytest.approx(1.2)
    assert r["ort_share"] == pytest.approx(floor / 0.012)
    assert r["mlpack_gflops"] == pytest.approx(200.0)


def test_the_report_from_a_run_document(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(ceiling, "fma_peak", lambda t: 400.0)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(_doc()))
    assert ceiling.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "| a | 1 | 2.00 | 166.7 | 42 | 200.0 | 50 | 1.200 | 2.40 |" in out
    assert "the most it can be, every contraction at the ceiling and nothing else: 2.40" in out
