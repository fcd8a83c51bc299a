"""aarch64 for real: libmlpack and examples/c cross-compiled with zig's C compiler
(aarch64-linux-gnu, dynamically linked against glibc so the kernel library's memfd can be
dlopen()ed), run under qemu-aarch64 on containers with an aarch64 cpu artifact. Under qemu the
host is arm64, so the engine must choose that artifact, load its ELF and run its plan; the
outputs must match ONNX Runtime computed on this (x86) machine, fp32 rtol 1e-4 atol 1e-5.

Models: the MLP, the BERT block (int64 ids < 100) and a random-weight SqueezeNet. Skips, with
the reason, where qemu-aarch64 (Debian: qemu-user), the aarch64 glibc (libc6-arm64-cross) or the
ziglang wheel is missing; .ci/run installs the first two. Timings under qemu are printed (-s).
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from test_example_c import (
    EXAMPLE,
    MODELS,
    assert_matches,
    make_container,
    make_example,
    reference,
    run_example,
)

SYSROOT = Path("/usr/aarch64-linux-gnu")


def _missing() -> str | None:
    if not shutil.which("qemu-aarch64"):
        return "qemu-aarch64 is not installed (Debian package qemu-user)"
    if not (SYSROOT / "lib" / "ld-linux-aarch64.so.1").exists():
        return f"no aarch64 glibc in {SYSROOT} (Debian package libc6-arm64-cross)"
    if importlib.util.find_spec("ziglang") is None:
        return "the ziglang wheel (zig's C cross-compiler) is not installed"
    if not shutil.which("make"):
        return "make is not installed"
    return None


@pytest.fixture(scope="module")
def qemu_example() -> list[str]:
    why = _missing()
    if why:
        pytest.skip(why)
    proc = make_example("cross", "ARCH=aarch64")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    exe = EXAMPLE / "build" / "aarch64" / "mlpack_run_example"
    return ["qemu-aarch64", "-L", str(SYSROOT), str(exe)]


def _mlp():
    feeds = {"x": np.random.default_rng(0).standard_normal((3, 784)).astype(np.float32)}
    return onnx.load(MODELS / "mlp.onnx"), feeds


def _bert():
    feeds = {"ids": np.random.default_rng(1).integers(0, 100, (2, 7)).astype(np.int64)}
    return onnx.load(MODELS / "bert_block.onnx"), feeds


def _squeezenet():
    import support

    model = support.load_light().random_weight_model("squeezenet", 0)
    feeds = {"data_0": np.random.default_rng(2).standard_normal((1, 3, 224, 224)).astype(np.float32)}
    return model, feeds


# repeats for the timing; SqueezeNet takes seconds a run under qemu, so one
@pytest.mark.parametrize("name,make,repeat", [("mlp", _mlp, 3), ("bert_block", _bert, 3),
                                              ("squeezenet", _squeezenet, 1)])
def test_arm64_artifact_chosen_under_qemu_matches_onnxruntime(qemu_example, tmp_path, name, make,
                                                              repeat):
    model, feeds = make()
    # an x86 artifact beside the arm64 one: the engine must pass it over on an arm64 host; -S:
    # no silent (and, for SqueezeNet, minutes-long) fallback to the portable interpreter
    path = make_container(model, tmp_path / f"{name}.mlpack", ["aarch64", "x86_64-v2"])
    run = run_example(qemu_example, path, feeds, tmp_path, "-S", "-t", "2", "-r", str(repeat))
    print(f"\n{name} under qemu-aarch64: {run.mean_ms:.1f} ms mean, {run.best_ms:.1f} ms best "
          f"({run.chosen['device']} {run.chosen['platform']})")
    assert (run.chosen["device"], run.chosen["platform"]) == ("cpu", "arm64/v8"), run.stdout
    assert "amd64" in run.stdout and "this host is arm64" in run.stdout, run.stdout
    assert_matches(run.outputs, reference(model, feeds))


def test_portable_interpreter_under_qemu_matches_onnxruntime(qemu_example, tmp_path):
    model, feeds = _mlp()
    path = make_container(model, tmp_path / "mlp.mlpack", ["aarch64"])
    run = run_example(qemu_example, path, feeds, tmp_path, "-d", "portable")
    assert run.chosen["device"] == "portable", run.stdout
    assert_matches(run.outputs, reference(model, feeds))
