"""mlpack: one model, one file, every kind of hardware.

The facade. ``mlpack.Error`` and its subclasses are the failures mlpack reports to a user;
``mlpack.import_onnx`` turns an ONNX model into an IR graph, ``mlpack.compile_onnx`` also runs
the pass pipeline, and ``mlpack.run_reference`` evaluates a model on the NumPy reference
interpreter; ``mlpack.load`` opens a container and runs it (mlpack.runtime). The subpackages
live in the top-level folders spec/, codegen/, packager/ and runtime/ (mapped in pyproject.toml).

Only the error base classes are imported eagerly: everything from the compiler loads on first
use (PEP 562), so ``import mlpack`` stays light and a deployment host that has the runtime alone
never imports the compiler.
"""

from __future__ import annotations

import importlib

from .spec.errors import Error, FormatError, InputError

__version__ = "0.1.0"

# name -> (module, attribute), imported on first access
_LAZY = {
    "UnsupportedOpError": ("mlpack.codegen.errors", "UnsupportedOpError"),
    "ModelError": ("mlpack.codegen.errors", "ModelError"),
    "ShapeError": ("mlpack.codegen.errors", "ShapeError"),
    "import_onnx": ("mlpack.codegen.onnx.importer", "import_model"),
    "compile_onnx": ("mlpack.codegen.compile", "compile_onnx"),
    "run_reference": ("mlpack.packager.reference", "run_reference"),
    "load": ("mlpack.runtime.model", "load"),
    "build": ("mlpack.packager.build", "build"),
    "NoRunnableArtifactError": ("mlpack.spec.errors", "NoRunnableArtifactError"),
    "PortableFallbackWarning": ("mlpack.spec.errors", "PortableFallbackWarning"),
    "IndexRangeError": ("mlpack.spec.errors", "IndexRangeError"),
}

__all__ = ["Error", "FormatError", "InputError", "__version__", *_LAZY]


def __getattr__(name: str):
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'mlpack' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
