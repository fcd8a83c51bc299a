"""How far any fp32 engine can go on a model here: the cores' FMA ceiling against the model's
FLOPs, beside what ONNX Runtime and mlpack reached in a run of benchmarks/run.py.

    python -m benchmarks.run --set real --threads 1,2 --json real.json
    python -m benchmarks.ceiling real.json

The ceiling is measured, not looked up: a loop of independent fused multiply-adds on the widest
vectors the host has (AVX-512, AVX2 or NEON; as many accumulators as keep both FMA pipes of any
core of the last ten years busy), JIT-compiled with llvmlite for this CPU and run on each thread
count at once, best of several tries. No engine multiplies faster than that in fp32.

Per model and thread count the report gives the model's contraction FLOPs (packager/flops.py,
as the run recorded them), each engine's GFLOP/s and share of the ceiling, and **the most
ORT/mlpack can be**: ONNX Runtime's time over the time the contractions alone would take at the
ceiling (as if mlpack ran every one of them at the ceiling and nothing else cost anything). A
bar on ORT/mlpack above that number cannot be met by scheduling fp32 arithmetic; only doing less
of it could (fewer multiplies, another precision).
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import math
import sys
import threading
import time

ACCUMULATORS = 12   # FMA latency 4 x 2 pipes needs 8 in flight; 12 leave room on any core
STEPS = 1 << 22     # loop trips of one timed call (x ACCUMULATORS FMAs each)


def _vector_lanes(features: str) -> int:
    """fp32 lanes of the widest vector FMA the host's LLVM features name."""
    have = {f[1:] for f in features.split(",") if f.startswith("+")}
    if "avx512f" in have:
        return 16
    if "fma" in have and "avx2" in have:
        return 8
    return 4   # SSE without FMA still multiplies and adds; NEON has FMA at 4 lanes


@functools.lru_cache(maxsize=None)
def _kernel():
    """(the JIT-compiled loop as a ctypes function of the trip count, lanes, the engine): made
    once per process, for every thread count measured."""
    import llvmlite.binding as llvm
    import llvmlite.ir as ir

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    features = llvm.get_host_cpu_features().flatten()
    lanes = _vector_lanes(features)
    vec = ir.VectorType(ir.FloatType(), lanes)
    module = ir.Module("fma_ceiling")
    module.triple = llvm.get_process_triple()
    fma = ir.Function(module, ir.FunctionType(vec, [vec] * 3), f"llvm.fma.v{lanes}f32")
    fn = ir.Function(module, ir.FunctionType(ir.FloatType(), [ir.IntType(64)]), "fma_loop")
    entry, loop, done = (fn.append_basic_block(n) for n in ("entry", "loop", "done"))
    b = ir.IRBuilder(entry)
    b.branch(loop)
    b.position_at_end(loop)
    i = b.phi(ir.IntType(64))
    accs = [b.phi(vec) for _ in range(ACCUMULATORS)]
    # the multiplier and addend are loop-invariant, the accumulators independent chains
    x = ir.Constant(vec, [1.0000001] * lanes)
    nxt = [b.call(fma, [a, x, ir.Constant(vec, [1e-7 * (k + 1)] * lanes)])
           for k, a in enumerate(accs)]
    i2 = b.add(i, ir.Constant(ir.IntType(64), 1))
    b.cbranch(b.icmp_unsigned("<", i2, fn.args[0]), loop, done)
    i.add_incoming(ir.Constant(ir.IntType(64), 0), entry)
    i.add_incoming(i2, loop)
    for k, (a, n) in enumerate(zip(accs, nxt)):
        a.add_incoming(ir.Constant(vec, [float(k)] * lanes), entry)
        a.add_incoming(n, loop)
    b.position_at_end(done)
    total = nxt[0]
    for n in nxt[1:]:
        total = b.fadd(total, n)
    b.ret(b.extract_element(total, ir.Constant(ir.IntType(32), 0)))
    tm = llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=features, opt=3)
    mod = llvm.parse_assembly(str(module))
    engine = llvm.create_mcjit_compiler(mod, tm)
    engine.finalize_object()
    func = ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_int64)(engine.get_function_address("fma_loop"))
    return func, lanes, engine


def fma_peak(threads: int, tries: int = 5) -> float:
    """The host's fp32 FMA ceiling in GFLOP/s with ``threads`` threads running at once: the
    best of ``tries`` (a busy or throttled moment can only lower it)."""
    func, lanes, _engine = _kernel()
    flops = 2.0 * lanes * ACCUMULATORS * STEPS * threads
    func(STEPS // 16)   # warm: the core's vector units wake up
    best = 0.0
    for _ in range(tries):
        workers = [threading.Thread(target=func, args=(STEPS,)) for _ in range(threads)]
        t0 = time.perf_counter()
        for w in workers:   # ctypes lets go of the GIL for the call: the threads run at once
            w.start()
        for w in workers:
            w.join()
        best = max(best, flops / (time.perf_counter() - t0) / 1e9)
    return best


def bounds(doc: dict, peaks: dict[int, float]) -> list[dict]:
    """One row per model and thread count of a benchmarks/run.py document: FLOPs, each engine's
    GFLOP/s and share of the ceiling, and the most ORT/mlpack can be (see the module doc).
    Models without a FLOP count or an ONNX Runtime time are left out."""
    rows = []
    for model in doc["models"]:
        flops = model.get("flops")
        if not flops:
            continue
        for row in model["threads"]:
            ort, mine = (row.get("ort") or {}).get("median_s"), row["mlpack"]["median_s"]
            t = int(row["threads"])
            if not ort or not mine or t not in peaks:
                continue
            floor = flops / (peaks[t] * 1e9)   # seconds of the contractions at the ceiling
            rows.append({"model": model["model"], "threads": t, "gflop": flops / 1e9,
                         "ort_gflops": flops / ort / 1e9, "ort_share": floor / ort,
                         "mlpack_gflops": flops / mine / 1e9, "mlpack_share": floor / mine,
                         "ratio": ort / mine, "most_ratio": ort / floor})
    return rows


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def markdown(rows: list[dict], peaks: dict[int, float]) -> list[str]:
    lines = ["- FMA ceiling (benchmarks/ceiling.py): " + ", ".join(
        f"{p:.1f} GFLOP/s at {t} thread{'s' * (t != 1)}" for t, p in sorted(peaks.items())), "",
        "| model | T | GFLOP | ORT GFLOP/s | ORT % ceiling | mlpack GFLOP/s | mlpack % ceiling "
        "| ORT/mlpack | most ORT/mlpack can be |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['threads']} | {r['gflop']:.2f} | {r['ort_gflops']:.1f} | "
                     f"{100 * r['ort_share']:.0f} | {r['mlpack_gflops']:.1f} | "
                     f"{100 * r['mlpack_share']:.0f} | {r['ratio']:.3f} | {r['most_ratio']:.2f} |")
    lines.append("")
    for t in sorted({r["threads"] for r in rows}):
        mine = [r for r in rows if r["threads"] == t]
        lines.append(f"At {t} thread{'s' * (t != 1)}: geomean ORT/mlpack "
                     f"{_geomean([r['ratio'] for r in mine]):.3f}; the most it can be, every "
                     f"contraction at the ceiling and nothing else: "
                     f"{_geomean([r['most_ratio'] for r in mine]):.2f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ceiling", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", help="a benchmarks/run.py --json document")
    args = parser.parse_args(argv)
    try:
        with open(args.results) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        parser.error(f"{args.results}: {e}")
    threads = sorted({int(r["threads"]) for m in doc.get("models", []) for r in m["threads"]})
    if not threads:
        parser.error(f"{args.results}: no timed models")
    peaks = {t: fma_peak(t) for t in threads}
    for line in markdown(bounds(doc, peaks), peaks):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
