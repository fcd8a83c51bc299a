"""Two builds of one model, and ONNX Runtime, timed alternating in one process: does a change
to the compiler make the model faster or slower?

    python -m benchmarks.ab MODEL.onnx A.mlpack B.mlpack [--threads 1] [--rounds 15]

A and B are containers of MODEL built before and after a change (``mlpack build MODEL.onnx -o
A.mlpack -t x86_64-v3``). Each round runs A, B and ONNX Runtime three times each on the same
seeded random inputs (``packager.bench.random_inputs``; size symbols 1, ``sequence`` 128, or
``--dims name=value``), so a noisy host's drift reaches all three alike; the medians and the
A/B ratio are printed (above 1: B is faster). Absolute times are not comparable between runs on a shared host; the ratio is.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings



def main(argv=None) -> None:
    import onnxruntime as ort

    import mlpack
    from mlpack.packager.bench import random_inputs

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--dims", default="sequence=128", help="size symbols, name=value,...")
    args = ap.parse_args(argv)
    dims = {k: int(v) for k, v in (kv.split("=") for kv in args.dims.split(",") if kv)}
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    session = ort.InferenceSession(args.model, so, providers=["CPUExecutionProvider"])
    warnings.simplefilter("ignore")   # (unsigned containers: the user's own builds)
    a, b = (mlpack.load(p, threads=args.threads) for p in (args.a, args.b))
    feeds = random_inputs(a.inputs, dims)
    runs = {"A": lambda: a.run(feeds), "B": lambda: b.run(feeds),
            "ORT": lambda: session.run(None, feeds)}
    for run in runs.values():
        run()
        run()
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(args.rounds):
        for name, run in runs.items():
            t0 = time.perf_counter()
            for _ in range(3):
                run()
            times[name].append((time.perf_counter() - t0) / 3)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"A {med['A'] * 1e3:.3f} ms  B {med['B'] * 1e3:.3f} ms  ORT {med['ORT'] * 1e3:.3f} ms  "
          f"A/B {med['A'] / med['B']:.3f}  ORT/A {med['ORT'] / med['A']:.3f}  "
          f"ORT/B {med['ORT'] / med['B']:.3f}")


if __name__ == "__main__":
    main()
