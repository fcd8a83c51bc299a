"""Progress lines for large blobs: ``pulling sha256:0123abcd... 12.0 MiB of 48.0 MiB (25%)``.

A transfer of at least ``LARGE`` bytes says so when it starts, at every quarter and when it ends;
smaller ones say nothing (a container's documents and small layers would drown the lines that
matter). ``report`` is any function taking a line (the CLI prints to stderr; ``load`` passes
none, so it stays silent).
"""

from __future__ import annotations

from typing import Callable

LARGE = 4 << 20   # bytes: blobs from this size on get progress lines
STEPS = 4         # lines between start and end


def size_text(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


class Meter:
    """Counts one blob's bytes as they move and reports them to ``report``."""

    def __init__(self, report: Callable[[str], None] | None, verb: str, digest: str, size: int):
        self.report = report if report is not None and size >= LARGE else None
        self.verb, self.digest, self.size = verb, digest, size
        self.done, self._next = 0, 1
        self._say(0)

    def _say(self, n: int) -> None:
        if self.report:
            pct = 100 * n // self.size if self.size else 100
            self.report(f"{self.verb} {self.digest[:19]}... {size_text(n)} of "
                        f"{size_text(self.size)} ({pct}%)")

    def add(self, n: int) -> None:
        self.done += n
        passed = False
        while self.report and self._next < STEPS and self.done * STEPS >= self._next * self.size:
            self._next += 1   # one line for every quarter passed at once (a whole PUT)
            passed = True
        if passed and self.done < self.size:   # the end is finish()'s line
            self._say(self.done)

    def restart(self) -> None:
        """The transfer starts over (a retry)."""
        self.done, self._next = 0, 1

    def finish(self) -> None:
        self._say(self.size)


__all__ = ["Meter", "size_text", "LARGE"]
