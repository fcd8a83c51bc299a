"""The errors a build raises of its own (every one an ``mlpack.Error``, one paragraph, no
traceback), here so that the build's modules share them without importing each other."""

from __future__ import annotations

from mlpack.spec.errors import Error


class BuildError(Error):
    """The build cannot go on: an unknown or unimplemented target, a model it cannot package."""


class DeadOnArrivalError(BuildError):
    """An artifact fails its own test vectors on the build host; no container is written."""

    index: int | None = None   # the failing artifact's index in the build's pairs
    missed: bool = False       # it ran and missed its tolerance (not: it could not run)
