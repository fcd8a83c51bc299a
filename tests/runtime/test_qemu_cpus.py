"""Other CPUs for real: libmlpack and examples/c cross-compiled with zig's C compiler
(dynamically linked against glibc, so the kernel library's memfd can be dlopen()ed), run under
qemu-user on containers with a cpu artifact for that CPU beside an x86 one: aarch64 (ARMv8 with
NEON) and riscv64 (RV64GC with the vector extension 1.0, qemu's vlen=128). Under qemu the host
is that CPU, so the engine must choose its artifact, load its ELF and run its plan; the outputs
must match ONNX Runtime computed on this (x86) machine, fp32 rtol 1e-4 atol 1e-5.

Models: the MLP, the BERT block (int64 ids < 100) and a random-weight SqueezeNet. Skips, with
the reason, where qemu (Debian: qemu-user), the CPU's glibc (libc6-arm64-cross,
libc6-riscv64-cross) or the ziglang wheel is missing; .ci/run installs them. Timings under qemu
are printed (-s).
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from test_example_c import (
    EXAMPLE,
    MODELS,
    assert_matches,
    input_args,
    make_container,
    make_example,
    reference,
    run_example,
)

# target -> (qemu, its CPU options, glibc's sysroot and loader, its Debian package, OCI platform)
CPUS = {
    "aarch64": ("qemu-aarch64", [], Path("/usr/aarch64-linux-gnu"), "ld-linux-aarch64.so.1",
                "libc6-arm64-cross", "arm64/v8"),
    "riscv64": ("qemu-riscv64", ["-cpu", "rv64,v=true,vlen=128,vext_spec=v1.0"],
                Path("/usr/riscv64-linux-gnu"), "ld-linux-riscv64-lp64d.so.1", "libc6-riscv64-cross",
                "riscv64"),
}


def _missing(target: str) -> str | None:
    qemu, _, sysroot, loader, package, _ = CPUS[target]
    if not shutil.which(qemu):
        return f"{qemu} is not installed (Debian package qemu-user)"
    if not (sysroot / "lib" / loader).exists():
        return f"no {target} glibc in {sysroot} (Debian package {package})"
    if importlib.util.find_spec("ziglang") is None:
        return "the ziglang wheel (zig's C cross-compiler) is not installed"
    if not shutil.which("make"):
        return "make is not installed"
    return None


@pytest.fixture(scope="module", params=list(CPUS))
def qemu_example(request) -> tuple[str, list[str]]:
    target = request.param
    why = _missing(target)
    if why:
        pytest.skip(why)
    proc = make_example("cross", f"ARCH={target}")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    qemu, options, sysroot = CPUS[target][:3]
    exe = EXAMPLE / "build" / target / "mlpack_run_example"
    return target, [qemu, *options, "-L", str(sysroot), str(exe)]


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
def test_cpu_artifact_chosen_under_qemu_matches_onnxruntime(qemu_example, tmp_path, name, make,
                                                            repeat):
    target, exe = qemu_example
    platform = CPUS[target][5]
    model, feeds = make()
    # an x86 artifact beside this CPU's: the engine must pass it over on this host; -S: no
    # silent (and, for SqueezeNet, minutes-long) fallback to the portable interpreter
    path = make_container(model, tmp_path / f"{name}.mlpack", [target, "x86_64-v2"])
    run = run_example(exe, path, feeds, tmp_path, "-S", "-t", "2", "-r", str(repeat))
    print(f"\n{name} under {exe[0]}: {run.mean_ms:.1f} ms mean, {run.best_ms:.1f} ms best "
          f"({run.chosen['device']} {run.chosen['platform']})")
    assert (run.chosen["device"], run.chosen["platform"]) == ("cpu", platform), run.stdout
    assert "amd64" in run.stdout and f"this host is {platform.split('/')[0]}" in run.stdout, run.stdout
    assert_matches(run.outputs, reference(model, feeds))


def test_portable_interpreter_under_qemu_matches_onnxruntime(qemu_example, tmp_path):
    target, exe = qemu_example
    model, feeds = _mlp()
    path = make_container(model, tmp_path / "mlp.mlpack", [target])
    run = run_example(exe, path, feeds, tmp_path, "-d", "portable")
    assert run.chosen["device"] == "portable", run.stdout
    assert_matches(run.outputs, reference(model, feeds))


def test_a_flipped_weight_bit_is_refused_under_qemu(qemu_example, tmp_path):
    """The engine hashes what it loads on that CPU too (on aarch64 through the ARMv8 SHA-256
    instructions where the CPU has them, as qemu's does; on riscv64 through the plain function):
    the container as made runs, and one weight bit flipped is refused, naming the digest."""
    from mlpack.spec import media
    from mlpack.spec.container import open_container

    target, exe = qemu_example
    model, feeds = _mlp()
    path = make_container(model, tmp_path / "mlp.mlpack", [target])
    with open_container(path) as box:
        weights = box.artifacts[1].layer(media.WEIGHTS)
    data = bytearray(path.read_bytes())
    data[weights.offset + weights.size // 2] ^= 0x01
    flipped = tmp_path / "flipped.mlpack"
    flipped.write_bytes(bytes(data))
    proc = subprocess.run([*exe, "-S", "-o", str(tmp_path / "out_"), str(flipped),
                           *input_args(feeds, tmp_path)], capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode != 0 and "digest" in proc.stdout + proc.stderr, proc.stderr
    run_example(exe, path, feeds, tmp_path, "-S")   # (Run asserts it succeeded)
