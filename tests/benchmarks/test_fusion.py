"""benchmarks/fusion.py: an inverted residual block's kernels timed per row at full height and
in a band that fits L2 (what fusing the block could save on this host)."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest

from benchmarks import fusion
from support import best_host_target


def test_the_block_computes_expand_depthwise_project_like_onnx_runtime():
    ort = pytest.importorskip("onnxruntime")
    model = fusion.block_model(9, 9, 4, 12, 6, 2)
    onnx.checker.check_model(model)
    x = np.random.default_rng(0).standard_normal((1, 4, 9, 9)).astype(np.float32)
    (y,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert y.shape == (1, 6, 5, 5)
    w = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    e = np.clip(np.einsum("chw,oc->ohw", x[0], w["w1"][:, :, 0, 0]), 0, 6)
    p = np.pad(e, ((0, 0), (1, 1), (1, 1)))
    d = sum(p[:, i:i + 9:2, j:j + 9:2] * w["w2"][:, 0, i, j, None, None] for i in range(3) for j in range(3))
    want = np.einsum("chw,oc->ohw", np.clip(d, 0, 6), w["w3"][:, :, 0, 0])
    np.testing.assert_allclose(y[0], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("width, cexp, stride, kib, rows", [
    (112, 96, 2, 256, 6),     # 112 x 96 floats a row: 6 rows in 256 KiB (a multiple of the stride)
    (56, 144, 1, 256, 8),
    (14, 384, 1, 256, 12),
    (112, 960, 2, 16, 4),     # never fewer than two strides' rows
])
def test_a_band_holds_the_rows_whose_expanded_tensor_fits(width, cexp, stride, kib, rows):
    assert fusion.band_rows(width, cexp, stride, kib) == rows


def test_a_small_block_is_measured_and_reported():
    try:   # (the host's x86-64 level alone; elsewhere every default target, the engine picks)
        targets = [best_host_target("x86_64-v2", "x86_64-v3", "x86_64-v4")]
    except AssertionError:
        targets = None
    results = fusion.measure([("10x8-24-8", 10, 8, 24, 8, 1)], runs=50, band_kib=2, repeat=1,
                             targets=targets)
    (r,) = results
    assert r["band_rows"] == 2
    for label in ("full", "band"):
        assert set(r[label]) == set(fusion.KERNELS)
        assert all(math.isfinite(v) and v > 0 for v in r[label].values()), r
    # the same kernels over the same rows: at best fused is not an order off the block
    assert 0.2 < r["fused_ms"] / r["full_ms"] < 5, r
    text = fusion.report(results)
    assert "10x8-24-8" in text and "saves" in text
