"""Build script of mlpack-runtime (pyproject.toml beside it has the metadata).

The distribution is the Python runtime (mlpack/__init__.py, spec/, this folder) and libmlpack,
compiled from c/src by zig's C compiler (the ziglang wheel, a build requirement) for
``{arch}-linux-gnu.2.17`` (zig_target.py): the library needs nothing newer than glibc 2.17, so the wheel is tagged
manylinux2014, and Python loads it through ctypes (no CPython ABI), so it is ``py3-none``: one
wheel per CPU for every Python >= 3.11. MLPACK_WHEEL_ARCH (x86_64, aarch64) cross-builds for
another CPU; by default the wheel is for this host's.

In a checkout the Python sources sit beside this folder (../mlpack, ../spec); an sdist carries
copies of them in _src/, which is where a build from the sdist finds them.
"""

import os
import pathlib
import platform
import runpy
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from setuptools import Extension, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = pathlib.Path(__file__).resolve().parent
# zig_target.py is one of this package's modules; a build cannot import the package it builds
zig_target = runpy.run_path(str(HERE / "zig_target.py"))["zig_target"]
ARCHES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}


def _arch() -> str:
    name = os.environ.get("MLPACK_WHEEL_ARCH") or platform.machine()
    try:
        return ARCHES[name.lower()]
    except KeyError:
        sys.exit(f"mlpack-runtime: no wheel for CPU {name!r} (MLPACK_WHEEL_ARCH: x86_64 or aarch64)")


# where each package's sources are: the checkout's folders, or an sdist's copies of them
_SHARED = {"mlpack": "mlpack", "mlpack.spec": "spec", "mlpack.spec.ir": "spec/ir"}
_IN_SDIST = (HERE / "_src").is_dir()
PACKAGE_DIR = {pkg: (f"_src/{d}" if _IN_SDIST else f"../{d}") for pkg, d in _SHARED.items()}
PACKAGE_DIR["mlpack.runtime"] = "."
PACKAGE_DIR["mlpack.runtime.registry"] = "registry"   # OCI registries: push, pull, oci://


class build_runtime_py(build_py):
    """Only the runtime's modules: of mlpack/ the package's __init__ (backend.py and conformance.py
    are the compiler's), of this folder not setup.py; and the C headers (mlpack.h, the API;
    mlpack_abi.h, the kernel ABI) in include/ beside the library."""

    def find_package_modules(self, package, package_dir):
        modules = super().find_package_modules(package, package_dir)
        keep = {"mlpack": {"__init__"}}.get(package)
        return [m for m in modules if (m[1] in keep if keep else m[1] != "setup")]

    def run(self):
        super().run()
        shutil.copytree(HERE / "c" / "include", pathlib.Path(self.build_lib, "mlpack", "runtime", "include"),
                        dirs_exist_ok=True)


class build_libmlpack(build_ext):
    """libmlpack.so with zig cc: every c/src/*.c to an object (in parallel), then one link."""

    def get_ext_filename(self, fullname):
        # not the CPython extension name (_libmlpack.cpython-311-...): ctypes loads a plain library
        return os.path.join(*fullname.split(".")[:-1], "libmlpack.so")

    def build_extension(self, ext):
        out = pathlib.Path(self.get_ext_fullpath(ext.name))
        arch = _arch()
        zig = [sys.executable, "-m", "ziglang", "cc", "-target", zig_target(arch)]
        objdir = pathlib.Path(self.build_temp, f"libmlpack-{arch}")
        objdir.mkdir(parents=True, exist_ok=True)
        flags = ["-std=c11", "-O2", "-fPIC", "-fvisibility=hidden", *(f"-I{d}" for d in ext.include_dirs)]

        def compile_one(source):
            obj = objdir / (pathlib.Path(source).stem + ".o")
            subprocess.run([*zig, *flags, "-c", source, "-o", str(obj)], check=True)
            return str(obj)

        with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
            objects = list(pool.map(compile_one, ext.sources))
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([*zig, "-shared", "-s", "-Wl,-soname,libmlpack.so", "-o", str(out), *objects,
                        *(f"-l{lib}" for lib in ext.libraries)], check=True)


class bdist_runtime_wheel(bdist_wheel):
    """py3-none-manylinux2014_{arch}: any Python 3, this CPU, glibc >= 2.17."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        arch = _arch()
        return "py3", "none", f"manylinux_2_17_{arch}.manylinux2014_{arch}"


class sdist_runtime(sdist):
    """The sdist carries the shared sources (../mlpack/__init__.py, ../spec) in _src/."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, [f for f in files if not f.startswith("..")])
        if _IN_SDIST:
            return
        for pkg, d in _SHARED.items():
            src, dst = HERE.parent / d, pathlib.Path(base_dir, "_src", d)
            dst.mkdir(parents=True, exist_ok=True)
            for f in src.iterdir():
                if f.is_file() and (f.suffix == ".py" or f.name in ("py.typed", "SPEC.md")):
                    if pkg != "mlpack" or f.name in ("__init__.py", "py.typed"):
                        shutil.copy(f, dst / f.name)
        shutil.copytree(HERE.parent / "spec" / "schemas", pathlib.Path(base_dir, "_src", "spec", "schemas"),
                        dirs_exist_ok=True)


libmlpack = Extension(
    "mlpack.runtime.libmlpack",
    sources=sorted(str(p.relative_to(HERE)) for p in (HERE / "c" / "src").glob("*.c")),
    include_dirs=["c/include", "c/src"],
    libraries=["dl", "pthread", "m"],
)

setup(
    packages=list(PACKAGE_DIR),
    package_dir=PACKAGE_DIR,
    # the engine's C sources too (300 KB): the compiler builds them for other CPUs to validate
    # their artifacts under qemu (packager/emulate.py), from an installed runtime as from a checkout
    package_data={"mlpack": ["py.typed"], "mlpack.spec": ["SPEC.md", "schemas/*.json"],
                  "mlpack.runtime": ["c/src/*.c", "c/src/*.h", "c/include/*.h", "c/tools/*.c",
                                     "c/vendor/monocypher/*"]},
    ext_modules=[libmlpack],
    cmdclass={"build_py": build_runtime_py, "build_ext": build_libmlpack,
              "bdist_wheel": bdist_runtime_wheel, "sdist": sdist_runtime},
)
