"""mlpack: one model, one file, every kind of hardware.

The facade: ``mlpack.Error`` and friends, ``mlpack.import_onnx`` and the reference
``mlpack.run_reference``. The subpackages live in the top-level folders spec/, codegen/,
packager/ and runtime/ (mapped in pyproject.toml).
"""

from .spec.errors import Error, FormatError, InputError

__version__ = "0.1.0"

__all__ = ["Error", "FormatError", "InputError", "__version__"]
