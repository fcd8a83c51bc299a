"""Build script of the `mlpack` distribution, the compiler (pyproject.toml has the metadata).

mlpack/__init__.py, mlpack.spec and mlpack.runtime with libmlpack are the `mlpack-runtime`
distribution's (runtime/pyproject.toml), which this one depends on, so a host that only runs
containers installs that alone. The two share the `mlpack` folder: this one ships its
backend.py and conformance.py, never its __init__.py or py.typed, so neither overwrites the
other's files.
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py


class build_compiler_py(build_py):
    def find_package_modules(self, package, package_dir):
        modules = super().find_package_modules(package, package_dir)
        return [m for m in modules if not (package == "mlpack" and m[1] == "__init__")]

    def find_data_files(self, package, src_dir):
        files = super().find_data_files(package, src_dir)
        return [f for f in files if not (package == "mlpack" and os.path.basename(f) == "py.typed")]


setup(cmdclass={"build_py": build_compiler_py})
