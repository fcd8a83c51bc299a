"""mlpack.spec: the container format and the vocabulary shared by compiler and runtime.

It depends on nothing but the standard library and NumPy, so the runtime can import it alone.
"""

from mlpack.spec.errors import Error, FormatError, InputError

__all__ = ["Error", "FormatError", "InputError"]
