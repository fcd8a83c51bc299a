"""benchmarks/amx.py: the bf16 split of f32 values, the split products' accuracy on a small
capsule, the kernels' IR, and (on a host with AMX) the tile-multiply kernels it times."""

from __future__ import annotations

import numpy as np
import pytest
from benchmarks import amx

NO_AMX = amx.amx_usable()   # also asks Linux for the tile state, once


def test_three_bf16_parts_hold_every_f32_exactly():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(10000), rng.standard_normal(100) * 1e30,
                        [0.0, 1.0, -3.0, 1e-30]]).astype(np.float32)
    parts = amx.bf16_parts(x)
    for p in parts:   # each part is a bf16: its f32 pattern has 16 zero low bits
        assert not (p.astype(np.float32).view(np.uint32) & 0xFFFF).any()
    np.testing.assert_array_equal(sum(parts), x.astype(np.float64))
    assert np.all(np.abs(parts[1]) <= np.abs(parts[0]) * 2.0 ** -8)


def test_six_split_products_meet_the_fp32_tolerance_and_three_are_coarser():
    errors = amx.capsule_errors(batch=2, size=7, caps=8)
    (direct, ok_direct), (x3, _), (x6, ok_x6) = (errors[k] for k in ("fp32 direct", "bf16x3",
                                                                     "bf16x6"))
    assert ok_direct and ok_x6
    assert x6 < direct < x3      # bf16x6 keeps every term above 2**-24; bf16x3 drops three


@pytest.mark.skipif(NO_AMX is not None, reason=f"no AMX here: {NO_AMX}")
def test_tile_kernel_runs_and_is_timed():
    rates = amx.tile_rates(0.02)   # raises if a kernel's tile product is wrong
    assert list(rates) == [k[0] for k in amx.KERNELS]
    assert all(r > 0 for r in rates.values())


def test_kernel_ir_loads_each_operand_tile_once_per_step():
    ir = amx._kernel_ir(amx.KERNELS[2][1], loads_in_loop=True)
    loop = ir[ir.index("loop:"):ir.index("exit:")]
    assert loop.count("tileloadd64") == 6 and loop.count("tdpbf16ps") == 6
    held = amx._kernel_ir(amx.KERNELS[0][1], loads_in_loop=False)
    assert "tileloadd64" not in held[held.index("loop:"):]


@pytest.mark.skipif(NO_AMX is not None, reason=f"no AMX here: {NO_AMX}")
def test_capsule_gemm_on_tiles_meets_the_fp32_tolerance():
    """A capsule with every size padded (72 rows to 80, 288 deep, 32 columns) through the
    bf16x6 tile gemm, against float64 at the container's fp32 tolerance."""
    g = amx.CapsuleGemm(batch=2, size=7, caps=8)
    g.run()
    np.testing.assert_allclose(g.out, g.exact, rtol=1e-4, atol=1e-5)
