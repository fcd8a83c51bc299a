"""Two builds of one model, and ONNX Runtime, timed alternating in one process: does a change
to the compiler make the model faster or slower?

    python -m benchmarks.ab MODEL.onnx A.mlpack B.mlpack [--threads 1] [--rounds 15]
                            [--dims name=value,...] [--inputs FEEDS.npz]

A and B are containers of MODEL built before and after a change (``mlpack build MODEL.onnx -o
A.mlpack -t x86_64-v3``). Each round runs A, B and ONNX Runtime three times each on the same
seeded random inputs (``packager.bench.random_inputs``; size symbols 1, ``sequence`` 128, or
``--dims name=value``; or the arrays of ``--inputs``, by input name), so a noisy host's drift
reaches all three alike; the medians and the A/B ratio are printed (above 1: B is faster). A
model ONNX Runtime cannot open (a custom op of the user's domain) is timed as A and B alone.
Absolute times are not comparable between runs on a shared host; the ratio is.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import numpy as np



def size_dims(text: str) -> dict[str, int]:
    """``--dims``' ``name=value,...``: {size symbol: value}."""
    return {k: int(v) for k, v in (kv.split("=") for kv in text.split(",") if kv)}


def main(argv=None) -> None:
    import onnxruntime as ort

    import mlpack
    from mlpack.packager.bench import QUIET_S, SLICE_S, random_inputs

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--dims", default="sequence=128", help="size symbols, name=value,...")
    ap.add_argument("--inputs", help="an .npz of the inputs, an array per input name")
    args = ap.parse_args(argv)
    dims = size_dims(args.dims)
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    try:
        session = ort.InferenceSession(args.model, so, providers=["CPUExecutionProvider"])
    except Exception as e:   # (onnxruntime's own exception types: a custom op it lacks)
        print(f"ONNX Runtime cannot run {args.model} ({str(e).splitlines()[0][:200]}): "
              "A and B alone")
        session = None
    warnings.simplefilter("ignore")   # (unsigned containers: the user's own builds)
    a, b = (mlpack.load(p, threads=args.threads) for p in (args.a, args.b))
    if args.inputs:
        with np.load(args.inputs) as stored:
            feeds = {name: stored[name] for name in stored.files}
    else:
        feeds = random_inputs(a.inputs, dims)
    runs = {"A": lambda: a.run(feeds), "B": lambda: b.run(feeds)}
    if session is not None:
        runs["ORT"] = lambda: session.run(None, feeds)
    for run in runs.values():
        run()
        run()
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(args.rounds):
        # ONNX Runtime's threads spin on after its runs and would take the cores from A, timed
        # next (at 2 threads on 2 cores, A measured 2x B for the same container): a pause.
        # Then each runtime runs untimed for a slice before it is timed, since after a pause
        # a 2-thread run is slow for a few runs (waking idle cores: 8.96 ms for the 2nd to 4th
        # run of MobileNetV2 after 0.1 s idle, 5.08 for the 5th to 7th, 4.43 ms steady). B's
        # threads sleep through A's runs too: with A's slice alone, two identical
        # MobileNetV3-small containers measured B 0.75-0.83x A at 2 threads.
        time.sleep(QUIET_S)
        for name, run in runs.items():
            warm = time.perf_counter() + SLICE_S
            while time.perf_counter() < warm:
                run()
            t0 = time.perf_counter()
            for _ in range(3):
                run()
            times[name].append((time.perf_counter() - t0) / 3)
    med = {k: statistics.median(v) for k, v in times.items()}
    line = f"A {med['A'] * 1e3:.3f} ms  B {med['B'] * 1e3:.3f} ms  "
    if "ORT" in med:
        line += f"ORT {med['ORT'] * 1e3:.3f} ms  "
    line += f"A/B {med['A'] / med['B']:.3f}"
    if "ORT" in med:
        line += f"  ORT/A {med['ORT'] / med['A']:.3f}  ORT/B {med['ORT'] / med['B']:.3f}"
    print(line)


if __name__ == "__main__":
    main()
