"""examples/c (mlpack_run_example, the C API's terse example) built with the host's cc against
the static libmlpack and run on containers of tests/models/mlp.onnx: its printed choice and
signature, and its written outputs against ONNX Runtime (fp32 rtol 1e-4, atol 1e-5); every
failure exits non-zero with the engine's message.

The helpers here (containers built with native artifacts, running the example, parsing what it
prints) are shared with test_qemu_cpus.py, which runs the same example cross-built for aarch64
and riscv64.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "c"
MODELS = ROOT / "tests" / "models"
RTOL, ATOL = 1e-4, 1e-5

# ---------------------------------------------------------------- containers


def make_container(model: onnx.ModelProto, path: Path, targets) -> Path:
    """``mlpack build`` of ``model`` with the portable artifact plus the cpu ``targets``."""
    from mlpack.packager.build import build

    build(model, path, targets=["portable", *targets])
    return path


def reference(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


# ---------------------------------------------------------------- running the example

DTYPES = {"f32": np.float32, "f64": np.float64, "i64": np.int64, "i32": np.int32, "i8": np.int8,
          "u8": np.uint8, "bool": np.bool_, "f16": np.float16}
OUTPUT_LINE = re.compile(r"^output (\S+): (\w+) \[([0-9, ]*)\] =", re.MULTILINE)
USING_LINE = re.compile(r"^using artifact (\d+) \((\S+) (\S+) (\S+)\): (.*)$", re.MULTILINE)
RAN_LINE = re.compile(r"^ran \d+ times?: ([0-9.]+) ms mean, ([0-9.]+) ms best$", re.MULTILINE)


class Run:
    """What one run of the example printed and wrote."""

    def __init__(self, proc: subprocess.CompletedProcess, prefix: Path):
        self.proc, self.stdout, self.stderr = proc, proc.stdout, proc.stderr
        assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        m = USING_LINE.search(self.stdout)
        assert m, self.stdout
        self.chosen = {"index": int(m[1]), "device": m[2], "precision": m[3], "platform": m[4],
                       "reason": m[5]}
        ran = RAN_LINE.search(self.stdout)
        self.mean_ms, self.best_ms = float(ran[1]), float(ran[2])
        self.outputs = []
        for name, dtype, shape in OUTPUT_LINE.findall(self.stdout):
            dims = tuple(int(d) for d in shape.split(",") if d.strip())
            data = np.fromfile(f"{prefix}{name}.bin", DTYPES[dtype])
            self.outputs.append(data.reshape(dims))


def input_args(feeds: dict, folder: Path) -> list[str]:
    """``NAME=D0,D1:FILE.bin`` for each input, its data written raw (little-endian)."""
    args = []
    for name, arr in feeds.items():
        f = folder / f"in_{name}.bin"
        np.ascontiguousarray(arr).tofile(f)
        args.append(f"{name}={','.join(str(d) for d in arr.shape)}:{f}")
    return args


def run_example(exe: list[str], container: Path, feeds: dict, folder: Path, *options: str,
                timeout: int = 600) -> Run:
    prefix = folder / "out_"
    cmd = [*exe, *options, "-o", str(prefix), str(container), *input_args(feeds, folder)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          check=False)
    return Run(proc, prefix)


def assert_matches(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)


def make_example(*target: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-C", str(EXAMPLE), *target, f"PYTHON={sys.executable}"],
                          capture_output=True, text=True, timeout=600, env=env, check=False)


# ---------------------------------------------------------------- tests (host build)


@pytest.fixture(scope="module")
def example() -> list[str]:
    if not (shutil.which("make") and shutil.which("cc")):
        pytest.skip("make and cc are needed to build examples/c")
    proc = make_example()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [str(EXAMPLE / "build" / "mlpack_run_example")]


@pytest.fixture(scope="module")
def mlp() -> onnx.ModelProto:
    return onnx.load(MODELS / "mlp.onnx")


def _x(batch: int, seed: int = 0) -> dict:
    return {"x": np.random.default_rng(seed).standard_normal((batch, 784)).astype(np.float32)}


def test_mlpack_build_container_runs_like_onnxruntime(example, mlp, tmp_path):
    from mlpack.packager.build import build

    path = tmp_path / "mlp.mlpack"
    build(mlp, path)  # whatever the packager implements; the portable artifact at least
    feeds = _x(3)
    run = run_example(example, path, feeds, tmp_path, "-t", "2")
    assert_matches(run.outputs, reference(mlp, feeds))
    assert "input 0: x f32 [batch=$batch, " in run.stdout
    lines = run.stdout.splitlines()
    assert any(re.fullmatch(r"output 0: y f32 \[\w+=\$batch, \w+=10\]", ln) for ln in lines), run.stdout
    assert any(re.match(r"  artifact 0: portable +fp32 any +(runnable|not runnable) +\S", ln)
               for ln in lines), run.stdout


def test_native_artifact_for_this_host_is_chosen_and_matches(example, mlp, tmp_path):
    from mlpack.runtime import detect_host

    host = detect_host()
    if host.arch != "amd64" or not host.x86_level or host.x86_level < 2:
        pytest.skip("an x86-64 v2+ host is needed for the x86_64 artifacts")
    levels = [f"x86_64-v{lv}" for lv in (2, 3, 4)]
    path = make_container(mlp, tmp_path / "mlp.mlpack", levels)
    feeds = _x(5, seed=1)
    run = run_example(example, path, feeds, tmp_path, "-r", "2")
    assert run.chosen["device"] == "cpu", run.stdout
    assert_matches(run.outputs, reference(mlp, feeds))
    # the same container through the portable interpreter, asked for by device
    portable = run_example(example, path, feeds, tmp_path, "-d", "portable")
    assert portable.chosen["device"] == "portable"
    assert_matches(portable.outputs, reference(mlp, feeds))
    # the highest level this host has: every level's feature list must be one the engine knows
    assert run.chosen["platform"] == f"amd64/v{min(host.x86_level, 4)}", run.stdout


def test_threads_from_environment_and_random_inputs_are_deterministic(example, mlp, tmp_path):
    from mlpack.packager.build import build

    path = tmp_path / "mlp.mlpack"
    build(mlp, path)
    env = {**os.environ, "MLPACK_NUM_THREADS": "2"}
    outs = [subprocess.run([*example, str(path), "x=4,784"], capture_output=True, text=True,
                           env=env, timeout=120, check=False) for _ in range(2)]
    assert all(o.returncode == 0 for o in outs), outs[0].stderr
    assert "random (fixed seed)" in outs[0].stdout
    assert OUTPUT_LINE.search(outs[0].stdout)[3] == "4, 10"
    values = [re.search(r"^output y: .*$", o.stdout, re.MULTILINE)[0] for o in outs]
    assert values[0] == values[1]
    bad = subprocess.run([*example, str(path)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "MLPACK_NUM_THREADS": "lots"}, check=False)
    assert bad.returncode == 1 and "MLPACK_NUM_THREADS" in bad.stderr, bad.stderr


def test_failures_exit_nonzero_with_the_engines_message(example, mlp, tmp_path):
    from mlpack.packager.build import build

    def run(*args):
        return subprocess.run([*example, *map(str, args)], capture_output=True, text=True,
                              timeout=120, check=False)

    missing = run(tmp_path / "nope.mlpack")
    assert missing.returncode == 1 and "mlpack_open failed" in missing.stderr
    assert "nope.mlpack" in missing.stderr
    junk = tmp_path / "junk.mlpack"
    junk.write_bytes(b"not a tar file" * 100)
    assert run(junk).returncode == 1
    path = tmp_path / "mlp.mlpack"
    build(mlp, path)
    wrong_dim = run(path, "x=2,783")  # the engine's input error names the input and the dim
    assert wrong_dim.returncode == 1 and "mlpack_run failed" in wrong_dim.stderr
    assert "'x'" in wrong_dim.stderr or " x" in wrong_dim.stderr, wrong_dim.stderr
    (tmp_path / "short.bin").write_bytes(b"\0" * 12)
    short = run(path, f"x=2,784:{tmp_path / 'short.bin'}")
    assert short.returncode == 2 and "is not 6272 bytes" in short.stderr
    assert run(path, "ghost=1").returncode == 2
    assert run(path, tmp_path / "short.bin").returncode == 2  # symbolic batch: shape needed
    assert run().returncode == 2
