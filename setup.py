"""Build integration for libmlpack, the C engine (runtime/c): `pip install -e .` (or a wheel build)
compiles runtime/c/src/*.c into mlpack/runtime/_libmlpack*.so, a plain shared library that
runtime/native.py loads with ctypes by path. It has no PyInit and is never imported. Everything
else about the package is in pyproject.toml."""

from glob import glob

from setuptools import Extension, setup

libmlpack = Extension(
    "mlpack.runtime._libmlpack",
    sources=sorted(glob("runtime/c/src/*.c")),
    include_dirs=["runtime/c/include"],
    depends=sorted(glob("runtime/c/src/*.h") + glob("runtime/c/include/*.h")),
    libraries=["dl", "pthread", "m"],
    extra_compile_args=["-std=c11", "-O2", "-fvisibility=hidden"],
)

setup(ext_modules=[libmlpack])
