"""The error hierarchy every part of mlpack raises for a user-facing failure.

It lives in ``mlpack.spec`` because the runtime may import nothing else; the compiler's own
errors (``mlpack.codegen.errors``) derive from these. Each message names what is at fault:
the file, node, op, field or dimension.
"""


class Error(Exception):
    """Base of every user-facing mlpack failure; the CLI prints it as one paragraph, exit code 2."""

    exit_code = 2


class InputError(Error):
    """Inputs handed to ``run`` do not match the model's signature (name, dtype, dim)."""


class FormatError(Error):
    """A container or file is malformed, truncated, tampered with or of a newer major version."""
