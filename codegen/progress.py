"""How far a target's compile is, for a build's progress display.

The compiler calls ``report`` at each stage of a target's compile (scheduling, lowering kernel
i of n, LLVM's optimizer, linking); the packager sets a sink with ``reporting`` while it shows
progress, in its own process or in each compile worker (packager/progress.py forwards a
worker's reports to the build's process). With no sink, ``report`` costs one test.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable

# (what is compiling, e.g. ("x86_64-v4", "fp32"), stage, done, total) -> None
Sink = Callable[[tuple, str, int, int], None]
_sink: Sink | None = None
_current: tuple = ()


def set_sink(sink: Sink | None) -> None:
    """Send this process's reports to ``sink`` (None: nowhere)."""
    global _sink
    _sink = sink


@contextmanager
def reporting(what: tuple):
    """Reports made inside are about ``what`` (a target and precision)."""
    global _current
    before, _current = _current, what
    try:
        yield
    finally:
        _current = before


def report(stage: str, done: int = 0, total: int = 0) -> None:
    """Tell the sink, if any, that the current compile is at ``stage`` (``done`` of ``total``)."""
    if _sink is not None:
        _sink(_current, stage, done, total)
