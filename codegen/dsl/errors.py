"""The DSL's errors: one line each, naming the dim (or the op) at fault.

They derive from ``mlpack.spec.errors.Error``, so the CLI prints them as ``error: ...`` with no
traceback and ``except mlpack.Error`` catches them with every other user-facing failure.
"""

from mlpack.spec.errors import Error


class DslError(Error):
    """An operator written in the DSL cannot be turned into IR (what and where is in the text)."""


class DimError(DslError):
    """Named dims do not match: a tensor lacks a dim, two tensors give one dim two sizes, an
    index leaves its dim's range, a lifted dim collides with an op's own, or a dim has no size."""
