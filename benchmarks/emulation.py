"""How much slower a model's test vectors run under qemu than natively, per architecture: the
measurement behind a build's prediction of its emulated runs (packager/validation.py,
``EMULATION_SLOWDOWN``).

    python -m benchmarks.emulation MODEL.onnx [MODEL.onnx ...]

Each model is built for this host's x86-64 level, aarch64 and riscv64 (no emulated validation
in the build), then its vectors are run as a build runs them: natively (the fastest of three
runs, the prediction's input), and under qemu-aarch64 and qemu-riscv64 side by side. Prints
each run's seconds and its slowdown, (seconds - start - hashing) / native, with the start and
the per-MB hashing of the artifact's blobs a build assumes. Needs qemu-user and the two
sysroots (Debian: qemu-user libc6-arm64-cross libc6-riscv64-cross).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor


def measure(src: str) -> None:
    from mlpack.packager import emulate, validation
    from mlpack.packager.build import build
    from mlpack.runtime import detect_host, load
    from mlpack.runtime.model import vector_cases
    from mlpack.spec.container import open_container

    host = detect_host()
    native_target = f"x86_64-v{host.x86_level}" if host.x86_level else "x86_64-v2"
    out = os.path.join(tempfile.mkdtemp(prefix="mlpack-emulation-"), "m.mlpack")
    os.environ["MLPACK_QEMU"] = "0"   # the build validates natively only
    try:
        build(src, out, targets=[native_target, "aarch64", "riscv64"])
    finally:
        del os.environ["MLPACK_QEMU"]
    pairs = [("portable", "fp32"), (native_target, "fp32"), ("aarch64", "fp32"),
             ("riscv64", "fp32")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = load(out, trusted_keys="")
    with open_container(out, verify=False) as c:
        native_index = next(i for i, a in enumerate(c.artifacts)
                            if a.device != "portable" and emulate.emulator_for(a, host.arch) is None)
        runs = []
        for _ in range(3):
            t0 = time.perf_counter()
            validation._outputs_of(model, native_index, pairs, out)
            runs.append(time.perf_counter() - t0)
        native = min(runs)
        print(f"{os.path.basename(src)}: native {native * 1e3:.1f} ms", flush=True)
        emulated = [a for a in c.artifacts if emulate.emulator_for(a, host.arch) is not None]

        def one(art):
            emu = emulate.emulator_for(art, host.arch)
            exe = emulate.program(emu)
            t0 = time.perf_counter()
            emulate._run(exe, out, art, vector_cases(c, art), emu, 300, "")
            return emu, time.perf_counter() - t0

        with ThreadPoolExecutor(len(emulated)) as pool:   # side by side, as a build runs them
            for art, (emu, took) in zip(emulated, pool.map(one, emulated)):
                nbytes = validation.hashed_bytes(art)
                fixed = validation.predicted_seconds(0.0, emu.arch, nbytes)
                print(f"  {emu.qemu}: {took:.2f} s, {(took - fixed) / native:.0f}x beyond the "
                      f"start and hashing {nbytes / 2 ** 20:.0f} MB ({fixed:.2f} s; predicted "
                      f"{validation.predicted_seconds(native, emu.arch, nbytes):.1f} s)",
                      flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+")
    for src in ap.parse_args(argv).models:
        measure(src)


if __name__ == "__main__":
    main()
