"""What Intel AMX gives an fp32 contraction on this machine: its bf16 tile-multiply rate next
to the fp32 matmul peak, how many bf16 products an fp32 product needs, and what the
x86_64-v4-amx target (codegen/targets/cpu/amx.py) makes of it on whole models.

``python -m benchmarks.amx [--seconds 0.2] [--rounds 5] [--models NAMES --runs 20
--compare-rounds 3 --threads 1]``

AMX multiplies bf16 tiles only. An fp32 value splits exactly into three bf16 parts
(x = x1 + x2 + x3, 8 significant bits each), so an fp32 product is emulated by summing the
part products of order above 2**-24: three (x1y1, x1y2, x2y1: bf16x3) or six (adding x1y3,
x2y2, x3y1: bf16x6). This tool measures

* the capsule primitive (tests/models/capsule.py, the benchmark's shapes and data) computed
  with bf16x3 and bf16x6 against float64, at the container's fp32 tolerance
  (packager/build.py: rtol 1e-4, atol 1e-5);
* the tile-multiply rate of the inner steps in ``KERNELS``: a 2x2 block with its operands held
  in tiles (the ceiling), and the bf16x3 and bf16x6 steps with their parts loaded from L1 at
  every step, into one accumulator tile or two (one chain of dependent multiplies, or two);
  each next to ONNX Runtime's fp32 matmul peak, alternating, best of ``--rounds``;
* with ``--models``, models of the benchmark set built for x86_64-v4 and for x86_64-v4-amx,
  each round alternating both artifacts with ONNX Runtime (``compare_targets``).

The AMX level is built only when named (``mlpack build -t x86_64-v4-amx``); the results and
why are in benchmarks/RESULTS.md, "AMX".
"""

from __future__ import annotations

import argparse
import ctypes
import platform
import time

import numpy as np
from mlpack.codegen.targets.cpu import amx as tiles
from mlpack.spec import accuracy
from mlpack.runtime.host import request_amx

from .models import tests_module

TILE_FLOPS = 16 * 16 * 32 * 2   # one tdpbf16ps: a 16x16 f32 tile += 16x32 by 32x16 bf16

_DECLS = """
declare void @llvm.x86.ldtilecfg(ptr)
declare void @llvm.x86.tilezero(i8 immarg)
declare void @llvm.x86.tileloadd64(i8 immarg, ptr, i64)
declare void @llvm.x86.tdpbf16ps(i8 immarg, i8 immarg, i8 immarg)
declare void @llvm.x86.tilestored64(i8 immarg, ptr, i64)
declare void @llvm.x86.tilerelease()
"""


def _kernel_ir(products, loads_in_loop: bool) -> str:
    """``void amx(cfg, a, b, c, n)``: n steps of the tile products ``(c, a, b)`` (tile numbers:
    accumulators 0-3, A parts 4-5 or 1-3, B parts 6-7 or 4-6), each A tile loaded from ``a`` +
    1 KB per tile and each B from ``b``, once before the loop or at every step."""
    accs = sorted({c for c, _, _ in products})
    a_tiles = sorted({x for _, x, _ in products})
    b_tiles = sorted({x for _, _, x in products})
    loads = [f"call void @llvm.x86.tileloadd64(i8 {t}, ptr %{src}{i}, i64 64)"
             for src, tiles in (("a", a_tiles), ("b", b_tiles)) for i, t in enumerate(tiles)]
    ptrs = [f"%{src}{i} = getelementptr i8, ptr %{src}, i64 {1024 * i}"
            for src, tiles in (("a", a_tiles), ("b", b_tiles)) for i in range(len(tiles))]
    muls = [f"call void @llvm.x86.tdpbf16ps(i8 {c}, i8 {x}, i8 {y})" for c, x, y in products]
    lines = ["define void @amx(ptr %cfg, ptr %a, ptr %b, ptr %c, i64 %n) {", "entry:",
             "call void @llvm.x86.ldtilecfg(ptr %cfg)",
             *[f"call void @llvm.x86.tilezero(i8 {c})" for c in accs], *ptrs,
             *([] if loads_in_loop else loads), "br label %loop", "loop:",
             "%i = phi i64 [0, %entry], [%i1, %loop]", *(loads if loads_in_loop else []), *muls,
             "%i1 = add i64 %i, 1", "%done = icmp eq i64 %i1, %n",
             "br i1 %done, label %exit, label %loop", "exit:",
             "call void @llvm.x86.tilestored64(i8 0, ptr %c, i64 64)",
             "call void @llvm.x86.tilerelease()", "ret void", "}"]
    return _DECLS + "\n".join(lines)


# an fp32-grade step, (accumulator, A part, B part) per product: A1..A3 in tiles 1-3, B1..B3 in
# 4-6; the products alternate between accumulators 0 and 7, so two chains run at once
BF16X6_STEP = ((0, 1, 4), (7, 1, 5), (0, 2, 4), (7, 1, 6), (0, 2, 5), (7, 3, 4))
# (what, tile products per step, loads every step, bf16 products per fp32 product)
KERNELS = (
    ("2x2 block, operands held in tiles (the ceiling)",
     ((0, 4, 6), (1, 4, 7), (2, 5, 6), (3, 5, 7)), False, 1),
    ("bf16x3 step: A1 A2 B1 B2 loaded, C += A1B1 + A1B2 + A2B1",
     ((0, 1, 4), (0, 1, 5), (0, 2, 4)), True, 3),
    ("bf16x6 step: A1-A3 B1-B3 loaded, C += the six products",
     ((0, 1, 4), (0, 1, 5), (0, 2, 4), (0, 1, 6), (0, 2, 5), (0, 3, 4)), True, 6),
    ("bf16x3 step, two accumulators (C and C' summed at the end)",
     ((0, 1, 4), (7, 1, 5), (0, 2, 4)), True, 3),
    ("bf16x6 step, two accumulators", BF16X6_STEP, True, 6),
)


def amx_usable() -> str | None:
    """Why AMX cannot run here, or None: the cpu flags, then the kernel's permission to use
    the tile state (Linux asks each process to request it)."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"not x86-64 Linux ({platform.system()} {platform.machine()})"
    with open("/proc/cpuinfo") as f:
        flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    missing = [x for x in ("amx_tile", "amx_bf16") if x not in flags]
    if missing:
        return f"the cpu lacks {', '.join(missing)}"
    return request_amx()


def _require_amx() -> None:
    """Raise unless this process may run tile instructions (it asks Linux for the state)."""
    why = amx_usable()
    if why:
        raise RuntimeError(f"no AMX here: {why}")


def _tile_config() -> np.ndarray:
    """ldtilecfg's 64 bytes: palette 1, 8 tiles of 16 rows x 64 bytes."""
    cfg = np.zeros(64, np.uint8)
    cfg[0], cfg[48:56] = 1, 16
    cfg[16:32].view(np.uint16)[:] = 64
    return cfg


def _jit(ir: str, name: str, pointers: int, *rest):
    """(engine, ctypes function) for ``name`` in ``ir``, compiled for this host with AMX; the
    engine must outlive the function."""
    import llvmlite.binding as llvm
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    tm = llvm.Target.from_default_triple().create_target_machine(   # the engine owns it
        features="+amx-tile,+amx-bf16,+avx512f", opt=2)
    ee = llvm.create_mcjit_compiler(llvm.parse_assembly(ir), tm)
    ee.finalize_object()
    fn = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * pointers, *rest)(ee.get_function_address(name))
    return ee, fn


def tile_rates(seconds: float) -> dict[str, float]:
    """bf16 GFLOP/s of each of KERNELS, best of 5 calls of about ``seconds`` / 5 each."""
    _require_amx()
    cfg = _tile_config()
    a = np.full(1536, 0x3F80, np.uint16)         # bf16 ones: 3 tiles each of A and B
    b, c = a.copy(), np.zeros(256, np.float32)
    rates, keep = {}, []
    for name, products, in_loop, _ in KERNELS:
        ee, fn = _jit(_kernel_ir(products, in_loop), "amx", 4, ctypes.c_int64)
        keep.append(ee)
        args = (cfg.ctypes.data, a.ctypes.data, b.ctypes.data, c.ctypes.data)
        fn(*args, 10)
        want = 10 * 32 * sum(1 for p in products if p[0] == 0)   # dot products of ones
        if c[0] != want:
            raise RuntimeError(f"AMX kernel computed {c[0]}, not {want}")
        n, best = 1000, float("inf")
        while True:                              # grow n until one call takes ~seconds/5
            t0 = time.perf_counter()
            fn(*args, n)
            if time.perf_counter() - t0 > seconds / 5:
                break
            n *= 4
        for _ in range(5):
            t0 = time.perf_counter()
            fn(*args, n)
            best = min(best, time.perf_counter() - t0)
        rates[name] = len(products) * n * TILE_FLOPS / best / 1e9
    return rates


def compare_targets(names, runs: int, rounds: int, threads: int = 1) -> list[dict]:
    """Per model of the benchmark set (benchmarks/models.py) and per round: median ms of its
    x86_64-v4 artifact, its x86_64-v4-amx artifact and ONNX Runtime, alternating, at least
    ``runs`` runs each; rounds a second apart, since this machine's speed drifts by phases
    and its tile unit's more than the FMA units' (benchmarks/RESULTS.md)."""
    import tempfile
    from pathlib import Path

    import mlpack
    import onnx
    from mlpack.packager.bench import ort_session, time_alternating
    from mlpack.packager.bench import model_inputs

    from . import models as bench_models
    _require_amx()
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            model = onnx.load(bench_models.materialize(name, Path(tmp)))
            sess = ort_session(model.SerializeToString(), threads)
            loaded = {}
            for t in ("x86_64-v4", "x86_64-v4-amx"):
                mlpack.build(model, f"{tmp}/{name}.{t}.mlpack", targets=[t])
                loaded[t] = mlpack.load(f"{tmp}/{name}.{t}.mlpack", threads=threads)
            feeds, _ = model_inputs(loaded["x86_64-v4"])
            try:
                for r in range(rounds):
                    time.sleep(1 if r else 0)
                    timings, _ = time_alternating(
                        {**{t: (lambda m=m: m.run(feeds)) for t, m in loaded.items()},
                         "ONNX Runtime": lambda: sess.run(None, feeds)}, repeat=runs)
                    out.append({"model": name, "round": r, **{
                        k: v.median_s * 1e3 for k, v in timings.items()}})
            finally:
                for m in loaded.values():
                    m.close()
    return out


def bf16_parts(x: np.ndarray) -> list[np.ndarray]:
    """f32 ``x`` as its three bf16 parts (in float64) summing to it, largest first: the split
    the x86_64-v4-amx target's kernels make (codegen/targets/cpu/amx.py)."""
    return [tiles.join(p[None]) for p in tiles.split(x)]


SPLITS = {"bf16x3": ((0, 0), (0, 1), (1, 0)),
          "bf16x6": ((0, 0), (0, 1), (1, 0), (0, 2), (1, 1), (2, 0))}


def capsule_errors(batch: int = 8, size: int = 16, caps: int = 32) -> dict[str, tuple[float, bool]]:
    """Max abs error of the capsule computed with each split against float64, and whether it
    passes the fp32 rule (spec/accuracy.py) with the fp32 direct sum as the baseline; plus the
    direct sum's own, for scale."""
    capsule = tests_module("capsule")
    p, w = capsule.poses(batch, size, caps), capsule.weights(caps)
    exact = capsule.reference(p.astype(np.float64), w.astype(np.float64))
    ps, ws = bf16_parts(p), bf16_parts(w)
    out = {"fp32 direct": capsule.reference(p, w)}
    for name, terms in SPLITS.items():
        out[name] = sum(capsule.reference(ps[i], ws[j]) for i, j in terms)
    tol, base = accuracy.TOLERANCES["fp32"], accuracy.measure(out["fp32 direct"], exact)
    return {name: (float(np.abs(v - exact).max()),
                   accuracy.judge(name, accuracy.measure(v, exact), base, tol).ok)
            for name, v in out.items()}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=0.2, help="time per measurement")
    ap.add_argument("--models", default="", metavar="NAMES",
                    help="also build these models of the benchmark set (comma-separated) for "
                         "x86_64-v4 and x86_64-v4-amx and time both against ONNX Runtime")
    ap.add_argument("--runs", type=int, default=20, help="--models: alternating runs a round")
    ap.add_argument("--compare-rounds", type=int, default=3, help="--models: rounds per model")
    ap.add_argument("--threads", type=int, default=1, help="--models: threads")
    ap.add_argument("--rounds", type=int, default=5,
                    help="rounds of (fp32 peak, AMX rates); the best of each is reported")
    a = ap.parse_args(argv)
    errors = capsule_errors()
    tol = accuracy.TOLERANCES["fp32"]
    print(f"capsule against float64 (fp32 rule: within {tol.multiple:g}x the direct sum's "
          f"error, or {tol.floor:.2g}):")
    for name, (err, ok) in errors.items():
        print(f"  {name:12s} max abs error {err:.2e}  {'within' if ok else 'outside'}")
    why = amx_usable()
    if why:
        print(f"AMX: not measured: {why}")
        return
    from mlpack.packager.bench import matmul_peak
    peak, rounds = float("nan"), []
    for i in range(a.rounds):   # interleaved: this machine's speed drifts between phases
        peak = matmul_peak(1, refresh=i > 0) or float("nan")
        rounds.append(tile_rates(a.seconds))
    print(f"fp32 matmul peak (ONNX Runtime's MatMul, 1 thread, best of {a.rounds}): "
          f"{peak:.0f} GFLOP/s")
    for name, _, _, split in KERNELS:
        r = max(x[name] for x in rounds)
        each = " ".join(f"{x[name]:.0f}" for x in rounds)
        print(f"{name}:\n  bf16 best {r:.0f} GFLOP/s (rounds: {each}); as fp32 products, "
              f"{r / split:.0f} GFLOP/s = {r / split / peak:.2f}x the fp32 peak")
    if a.models:
        print(f"the x86_64-v4 and x86_64-v4-amx artifacts and ONNX Runtime, {a.threads} "
              f"thread(s), medians of at least {a.runs} alternating runs, per round:")
        print(f"  {'model':18s} {'v4 ms':>8s} {'amx ms':>8s} {'ORT ms':>8s} {'ORT/v4':>7s} "
              f"{'ORT/amx':>7s} {'v4/amx':>7s}")
        for row in compare_targets(a.models.split(","), a.runs, a.compare_rounds, a.threads):
            v4, tl, ort = row["x86_64-v4"], row["x86_64-v4-amx"], row["ONNX Runtime"]
            print(f"  {row['model']:18s} {v4:8.3f} {tl:8.3f} {ort:8.3f} {ort / v4:7.2f} "
                  f"{ort / tl:7.2f} {v4 / tl:7.2f}", flush=True)


if __name__ == "__main__":
    main()
