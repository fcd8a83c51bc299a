"""The mlpack-runtime distribution (runtime/setup.py) as a deployment host gets it: the wheel is
built from this checkout with pip, installed alone into a fresh venv that has NumPy and nothing
else, and runs a container built here, from Python and from examples/c/main.c compiled against
the wheel's header and library, with outputs checked against ONNX Runtime (fp32 rtol 1e-4, atol
1e-5). The aarch64 wheel is cross-built and, where qemu-aarch64 is installed, runs the C example.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest

from mlpack.runtime.zig_target import zig_target
from test_example_c import EXAMPLE, MODELS, assert_matches, reference, run_example

ROOT = Path(__file__).resolve().parents[2]
SYSROOT = Path("/usr/aarch64-linux-gnu")
MAX_INSTALLED_BYTES = 15 * 2**20  # the bar: the runtime alone takes under 15 MB
NEWEST_GLIBC = (2, 17)


def _build_wheel(out: Path, arch: str) -> Path:
    setuptools_major = int(importlib.metadata.version("setuptools").split(".")[0])
    # without isolation where this environment has what runtime/pyproject.toml's build needs
    isolation = [] if setuptools_major < 77 else ["--no-build-isolation"]
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-q", "-w", str(out),
                           str(ROOT / "runtime")], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "MLPACK_WHEEL_ARCH": arch})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    [wheel] = out.glob(f"mlpack_runtime-*{arch}*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("wheels")
    return {arch: _build_wheel(out, arch) for arch in ("x86_64", "aarch64")}


def _glibc_versions(so: bytes) -> set[tuple[int, ...]]:
    """The GLIBC_x.y symbol versions a library asks for (they are strings of its .dynstr)."""
    return {tuple(int(p) for p in v.split(b".")) for v in re.findall(rb"GLIBC_(\d+(?:\.\d+)+)", so)}


@pytest.mark.parametrize("arch, machine", [("x86_64", 62), ("aarch64", 183)])
def test_wheel_is_the_runtime_alone_for_old_glibc(wheels, arch, machine):
    wheel = wheels[arch]
    assert wheel.name == f"mlpack_runtime-0.1.0-py3-none-manylinux_2_17_{arch}.manylinux2014_{arch}.whl"
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        installed = sum(i.file_size for i in z.infolist())
        so = z.read("mlpack/runtime/libmlpack.so")
        meta = z.read("mlpack_runtime-0.1.0.dist-info/METADATA").decode()
    assert installed < MAX_INSTALLED_BYTES, installed
    assert "mlpack/__init__.py" in names and "mlpack/runtime/include/mlpack.h" in names
    assert not [n for n in names if n.startswith(("mlpack/codegen", "mlpack/packager", "mlpack/backend",
                                                   "mlpack/spec/conformance"))]
    assert re.findall(r"^Requires-Dist: (.*)$", meta, re.M) == ["numpy>=1.26", "cryptography>=42",
                                                             "requests>=2.31"]
    assert "mlpack/runtime/registry/puller.py" in names   # load("oci://...") needs the client
    assert so[:4] == b"\x7fELF" and int.from_bytes(so[18:20], "little") == machine
    assert max(_glibc_versions(so)) <= NEWEST_GLIBC, sorted(_glibc_versions(so))


# ---------------------------------------------------------------- a host with the runtime alone


@pytest.fixture(scope="module")
def runtime_venv(wheels, tmp_path_factory) -> Path:
    """A venv with the x86_64 wheel and NumPy only (NumPy from this environment, through a .pth
    naming a folder that holds nothing else): no onnx, llvmlite, zig or mlpack compiler in it."""
    if os.uname().machine != "x86_64":
        pytest.skip("the venv runs the x86_64 wheel")
    base = tmp_path_factory.mktemp("host")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    numpy_only = base / "numpy-only"
    numpy_only.mkdir()
    numpy_dir = Path(np.__file__).parent
    for entry in numpy_dir.parent.iterdir():  # numpy and the libraries its wheel vendors
        if entry.name == "numpy" or entry.name.startswith("numpy.libs"):
            (numpy_only / entry.name).symlink_to(entry)
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "numpy-only.pth").write_text(str(numpy_only) + "\n")
    proc = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                           str(wheels["x86_64"])], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return python


@pytest.fixture(scope="module")
def mlp_container(tmp_path_factory) -> tuple[onnx.ModelProto, Path]:
    from mlpack.packager.build import build

    model = onnx.load(MODELS / "mlp.onnx")
    path = tmp_path_factory.mktemp("built") / "mlp.mlpack"
    build(model, path)  # the default targets: portable and every cpu level
    return model, path


HOST_SCRIPT = """
import json, sys
import numpy as np
import mlpack
m = mlpack.load(sys.argv[1])
x = np.load(sys.argv[2])
[y] = m.run(None, {"x": x})
np.save(sys.argv[3], y)
try:
    mlpack.build
    compiler = "present"
except ModuleNotFoundError as e:
    compiler = str(e)
heavy = sorted(n for n in sys.modules if n.split(".")[0] in ("onnx", "onnxruntime", "llvmlite", "ziglang")
               or n.startswith(("mlpack.codegen", "mlpack.packager")))
print(json.dumps({"engine": m.engine, "artifact": m.artifact.device, "valid": m.validate().ok,
                  "inputs": [(i.name, list(i.shape), i.type) for i in m.get_inputs()],
                  "compiler": compiler, "heavy": heavy}))
"""


def test_runtime_alone_loads_and_runs_a_container_built_elsewhere(runtime_venv, mlp_container, tmp_path):
    model, path = mlp_container
    x = np.random.default_rng(0).standard_normal((3, 784)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    proc = subprocess.run([str(runtime_venv), "-c", HOST_SCRIPT, str(path), str(tmp_path / "x.npy"),
                           str(tmp_path / "y.npy")], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["engine"].startswith("libmlpack ") and got["artifact"] == "cpu" and got["valid"], got
    assert got["inputs"] == [["x", ["batch", 784], "tensor(float)"]], got
    assert "part of the compiler" in got["compiler"] and "pip install mlpack" in got["compiler"], got
    assert got["heavy"] == [], got
    assert_matches([np.load(tmp_path / "y.npy")], reference(model, {"x": x}))
    no_onnx = subprocess.run([str(runtime_venv), "-c", "import onnx"], capture_output=True, cwd=tmp_path)
    assert no_onnx.returncode != 0


def _c_flags(python: Path, cwd: Path) -> list[str]:
    proc = subprocess.run([str(python), "-m", "mlpack.runtime", "--cflags", "--libs"], capture_output=True,
                          text=True, timeout=60, cwd=cwd)  # not the checkout, whose mlpack/ would shadow
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_c_example_builds_against_the_installed_runtime(runtime_venv, mlp_container, tmp_path):
    if not shutil.which("cc"):
        pytest.skip("no C compiler (cc) on this host")
    model, path = mlp_container
    exe = tmp_path / "mlpack_run_example"
    flags = _c_flags(runtime_venv, tmp_path)
    assert any(f.startswith("-I") and "site-packages" in f for f in flags), flags
    proc = subprocess.run(["cc", "-O2", str(EXAMPLE / "main.c"), "-o", str(exe), *flags], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    feeds = {"x": np.random.default_rng(1).standard_normal((2, 784)).astype(np.float32)}
    run = run_example([str(exe)], path, feeds, tmp_path, "-S")
    assert run.chosen["device"] == "cpu", run.stdout
    assert_matches(run.outputs, reference(model, feeds))


def test_aarch64_wheel_runs_the_c_example_under_qemu(wheels, mlp_container, tmp_path):
    if not (shutil.which("qemu-aarch64") and (SYSROOT / "lib" / "ld-linux-aarch64.so.1").exists()):
        pytest.skip("qemu-aarch64 and the aarch64 glibc (Debian: qemu-user, libc6-arm64-cross) are needed")
    model, path = mlp_container
    unpacked = tmp_path / "wheel"
    with zipfile.ZipFile(wheels["aarch64"]) as z:
        z.extractall(unpacked)
    lib = unpacked / "mlpack" / "runtime"
    exe = tmp_path / "mlpack_run_example"
    proc = subprocess.run([sys.executable, "-m", "ziglang", "cc", "-target", zig_target("aarch64"), "-O2",
                           str(EXAMPLE / "main.c"), "-o", str(exe), f"-I{lib / 'include'}", f"-L{lib}",
                           "-lmlpack"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    feeds = {"x": np.random.default_rng(2).standard_normal((2, 784)).astype(np.float32)}
    run = run_example(["qemu-aarch64", "-L", str(SYSROOT), "-E", f"LD_LIBRARY_PATH={lib}", str(exe)], path,
                      feeds, tmp_path, "-S")
    assert run.chosen["device"] == "cpu" and run.chosen["platform"] == "arm64/v8", run.stdout
    assert_matches(run.outputs, reference(model, feeds))
