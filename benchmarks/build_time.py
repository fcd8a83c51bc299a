"""What the riscv64 target and validation under qemu cost a build: each light model of
tests/models/light.py (random weights) built with the default targets, against the five targets
of before (portable, x86-64 v2/v3/v4, aarch64) with emulation off (MLPACK_QEMU=0).

    python -m benchmarks.build_time squeezenet resnet50
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

BEFORE = ["portable", "x86_64-v2", "x86_64-v3", "x86_64-v4", "aarch64"]


def main(names: list[str]) -> None:
    import mlpack
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    import support

    light = support.load_light()
    for name in names:
        model = light.random_weight_model(name, 0).SerializeToString()
        for label, qemu, targets in (("5 targets, no qemu", "0", BEFORE), ("default, qemu", "1", None)):
            os.environ["MLPACK_QEMU"] = qemu
            with tempfile.TemporaryDirectory() as d:
                t0 = time.perf_counter()
                r = mlpack.build(model, os.path.join(d, "m.mlpack"), targets=targets)
                print(f"{name:12s} {label:20s} {time.perf_counter() - t0:6.1f} s  (lower "
                      f"{r.timings['lower']:5.1f} s, validate {r.timings['validate']:5.1f} s, "
                      f"{sum(a.validated for a in r.artifacts)} of {len(r.artifacts)} validated)",
                      flush=True)


if __name__ == "__main__":   # the build's compile workers are spawned: they import this module
    main(sys.argv[1:] or ["squeezenet", "resnet50"])
