"""benchmarks/amx.py: the split products' accuracy on a small capsule, the kernels' IR, and
(on a host with AMX) the tile-multiply kernels it times and its target comparison on a model.
The split itself is tested with the compiler's (tests/codegen/targets/cpu/test_amx_gemm.py)."""

from __future__ import annotations

import pytest
from benchmarks import amx

NO_AMX = amx.amx_usable()   # also asks Linux for the tile state, once


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
def test_targets_are_compared_on_a_model():
    (row,) = amx.compare_targets(["mlp"], runs=2, rounds=1)
    assert row["model"] == "mlp" and all(
        row[k] > 0 for k in ("x86_64-v4", "x86_64-v4-amx", "ONNX Runtime"))
