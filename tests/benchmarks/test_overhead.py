"""benchmarks/overhead.py: the per-run overhead comparison runs the same one-node model in
mlpack (native), in the engine's C call alone and in ONNX Runtime, after checking they agree."""

from __future__ import annotations

import onnx
from benchmarks import overhead


def test_relu_model_is_valid_onnx():
    onnx.checker.check_model(overhead.relu_model(8), full_check=True)


def test_measure_times_each_runtime():
    us = overhead.measure(elements=16, threads=1, seconds=0.05)
    assert list(us) == ["mlpack", "engine", "ONNX Runtime"]
    assert all(v > 0 for v in us.values())
