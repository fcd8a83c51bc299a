"""How long ``mlpack build`` takes for the capsule layer with three EM routing iterations, for
every default target (issue 23's build-time bar).

    python -m benchmarks.capsule_build [--batch 1,8] [--runs 1]

The model is benchmarks/capsule_routing.py's custom-op model (one ``EMRouting`` node of the
domain ``capsules.example``: 16x16 input, 32 capsule types in and out, 4x4 poses, 3x3 kernel,
stride 2) with a symbolic batch, as a deployed model has; it is built with the default targets
(portable, x86-64 v2/v3/v4, aarch64, riscv64; those of another architecture validated under
qemu where it is installed, 10 s at most each), no kernel cache, on one test case of the
bar's seeded inputs at each ``--batch`` (random ones would make the activations negative). The
float64 reference and the fp32 baseline are the NumPy interpreter's (ONNX Runtime cannot run
the op). Prints the wall time, the CPU time of this process and its workers, each step's time
and which artifacts were validated where.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time

import onnx

from benchmarks import capsule_routing as cr


def symbolic_model() -> onnx.ModelProto:
    """capsule_routing's custom-op model with its batch axis named, not fixed."""
    m = cr.custom_model()
    for vi in list(m.graph.input) + list(m.graph.output):
        dim = vi.type.tensor_type.shape.dim[0]
        if vi.name not in ("W", "beta_v", "beta_a"):
            dim.ClearField("dim_value")
            dim.dim_param = "batch"
    return m


def cpu_seconds() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def build_once(tmp: str, batch: int) -> str:
    from mlpack.packager.build import build

    cr.BATCH = batch
    feeds = cr.inputs()
    src = os.path.join(tmp, "em_routing.onnx")
    onnx.save(symbolic_model(), src)
    out = os.path.join(tmp, f"em_routing_b{batch}.mlpack")
    t0, c0 = time.perf_counter(), cpu_seconds()
    report = build(src, out, inputs=feeds, ops=[os.path.join(cr.CAPS, "capsules.py")],
                   cache=False)
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    steps = ", ".join(f"{k} {v:.1f} s" for k, v in report.timings.items() if v >= 0.05)
    where = "; ".join(f"{a.target} " + (f"validated{' under ' + a.emulator if a.emulator else ''}"
                                        if a.validated else "not validated")
                      for a in report.artifacts)
    return (f"vectors at batch {batch}: {wall:.1f} s wall, {cpu:.1f} CPU-s ({steps}); "
            f"{where}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", default="1,8", help="test-vector batch sizes, one build each")
    ap.add_argument("--runs", type=int, default=1, help="builds per batch size")
    args = ap.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.2f}", flush=True)
    for batch in [int(b) for b in args.batch.split(",")]:
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory(prefix="caps-build-") as tmp:
                print(build_once(tmp, batch), flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":   # the build's compile workers are spawned: they import this module
    sys.exit(main())
