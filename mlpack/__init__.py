"""mlpack: compile one ONNX model into one file that runs on every kind of hardware.

A ``.mlpack`` container holds precompiled code for several targets (x86-64 levels, aarch64,
CUDA) plus a portable fallback and test vectors; ``load`` picks the best artifact this machine
runs, and says why::

    import mlpack
    mlpack.build("model.onnx", "model.mlpack")      # or: mlpack build model.onnx -o model.mlpack
    m = mlpack.load("model.mlpack")                 # m.artifact, m.verdicts: what runs and why
    y = m(x=x)["y"]                                 # or m.run({"x": x}), or m.run(None, {"x": x})
    m.validate().ok                                 # the bundled test vectors, on this artifact

``m.get_inputs()``, ``m.get_outputs()`` and ``m.run(output_names, feeds)`` work as in ONNX
Runtime's ``InferenceSession``. Failures are ``mlpack.Error`` subclasses (``FormatError``,
``InputError``, ...). Also: ``import_onnx``/``compile_onnx`` (the compiler's IR) and
``run_reference`` (the NumPy reference interpreter). ``load`` and the model need only the
mlpack-runtime distribution; ``build`` and the rest are the compiler, ``mlpack``. The README is
the guide; docs/ has the commands, the Python and C APIs and the container format.
"""

# For developers: only the error base classes load eagerly; the rest is imported on first use
# (PEP 562), so ``import mlpack`` stays light and a host with the runtime alone never imports the
# compiler. This file, spec/ and runtime/ are the mlpack-runtime distribution (runtime/setup.py);
# codegen/, packager/ and the rest of this folder are the compiler's, `mlpack` (pyproject.toml).

from mlpack.spec.errors import Error, FormatError, InputError

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
    "SignatureError": ("mlpack.spec.errors", "SignatureError"),
    "RegistryError": ("mlpack.spec.errors", "RegistryError"),
    "UnsignedContainerWarning": ("mlpack.spec.errors", "UnsignedContainerWarning"),
}

__all__ = ["Error", "FormatError", "InputError", "__version__", *_LAZY]


def __getattr__(name: str):
    import importlib  # here, not at the top: a module global would show in dir(mlpack)

    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'mlpack' has no attribute {name!r}") from None
    try:
        value = getattr(importlib.import_module(module), attr)
    except ModuleNotFoundError as e:
        if not (e.name or "").startswith(("mlpack.codegen", "mlpack.packager")):
            raise
        raise ModuleNotFoundError(
            f"mlpack.{name} is part of the compiler, which is not installed here (this host has "
            f"mlpack-runtime, which loads and runs containers): pip install mlpack", name=e.name) from None
    globals()[name] = value
    return value


def __dir__():
    # the public names only: not the subpackages an import binds (spec) or this module's helpers
    return sorted(__all__)
