"""A build's progress on a terminal: a line per step, and one live line while targets compile.

    compiling: 2/6 done, 14s; x86_64-v4 fp32 lowering 37/92 kernels, aarch64 fp32 LLVM 92 kernels

``Terminal`` is the ``progress`` callable ``mlpack build`` passes on a TTY (none when stderr is
not one, as in CI, or with ``--quiet``): called with a line it prints it; its ``status`` rewrites
the live line. ``tracking`` runs while ``packager/build.py`` compiles: it sets the compiler's
sink (codegen/progress.py) in this process and, through ``pool_options``, in each compile worker,
whose reports come back through a queue; a thread redraws the live line from them. A progress
callable without ``status`` (a caller's own function) gets the step lines only.
"""

from __future__ import annotations

import queue as queues
import shutil
import sys
import threading
import time
from contextlib import contextmanager

from mlpack.codegen import progress as compiler_progress

_REDRAW = 0.2   # seconds between redraws of the live line
_active: "_Tracker | None" = None


class Terminal:
    """Progress lines on ``stream`` (stderr), with one live status line kept below them."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.live = ""
        self.lock = threading.Lock()

    def __call__(self, line: str) -> None:
        with self.lock:
            self._clear()
            self.stream.write(f"  {line}\n")
            self._draw()

    def status(self, text: str) -> None:
        """Show ``text`` as the live line ("" removes it)."""
        width = shutil.get_terminal_size((100, 20)).columns - 1
        with self.lock:
            self._clear()
            self.live = text if len(text) <= width else text[:width - 3] + "..."
            self._draw()

    def _clear(self) -> None:
        if self.live:
            self.stream.write("\r\x1b[K")

    def _draw(self) -> None:
        if self.live:
            self.stream.write(self.live)
        self.stream.flush()


def _describe(state: dict) -> str:
    """What one target x precision is doing, in a few words."""
    stage, done, total = state
    if stage == "lowering":
        return f"lowering {done}/{total} kernels"
    if stage == "optimizing":
        return f"LLVM {total} kernels"
    return stage


class _Tracker:
    """The state of a compile: per (target, precision), its stage; redrawn by a thread."""

    def __init__(self, status, pairs):
        self.status, self.pairs = status, list(pairs)
        self.states: dict[tuple, tuple] = {}
        self.finished: set[tuple] = set()
        self.queue = None   # made when a worker pool asks for it (pool_options)
        self.t0 = time.perf_counter()
        self.stop = threading.Event()

    def sink(self, what: tuple, stage: str, done: int, total: int) -> None:
        if stage == "done":
            self.finished.add(what)
            self.states.pop(what, None)
        else:
            self.states[what] = (stage, done, total)

    def line(self) -> str:
        busy = ", ".join(f"{t} {p} {_describe(s)}" for (t, p), s in list(self.states.items()))
        return (f"  compiling: {len(self.finished)}/{len(self.pairs)} done, "
                f"{time.perf_counter() - self.t0:.0f}s" + (f"; {busy}" if busy else ""))

    def run(self) -> None:
        while not self.stop.is_set():
            q = self.queue
            try:
                if q is None:
                    self.stop.wait(_REDRAW)
                else:
                    deadline = time.perf_counter() + _REDRAW
                    while time.perf_counter() < deadline:
                        self.sink(*q.get(timeout=max(0.01, deadline - time.perf_counter())))
            except (queues.Empty, EOFError, OSError):
                pass
            self.status(self.line())


@contextmanager
def tracking(progress, pairs):
    """While the block compiles ``pairs``, keep ``progress``'s live line (if it has one) saying
    what compiles and how far along it is."""
    global _active
    status = getattr(progress, "status", None)
    if status is None or _active is not None:
        yield
        return
    tracker = _active = _Tracker(status, pairs)
    compiler_progress.set_sink(tracker.sink)
    thread = threading.Thread(target=tracker.run, name="mlpack-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        tracker.stop.set()
        thread.join()
        compiler_progress.set_sink(None)
        _active = None
        status("")


def done(what: tuple) -> None:
    """A target x precision is compiled (called where it was: here or in a worker)."""
    with compiler_progress.reporting(what):
        compiler_progress.report("done")


def pool_options(context) -> dict:
    """The ProcessPoolExecutor options that send its workers' reports to the live line: an
    initializer with a queue of ``context`` (spawn), or nothing when no line is shown."""
    if _active is None:
        return {}
    _active.queue = context.Queue()
    return {"initializer": _worker_init, "initargs": (_active.queue,)}


def _worker_init(q) -> None:
    """In a compile worker: forward the compiler's reports to the build's process."""
    compiler_progress.set_sink(lambda what, stage, done, total: q.put((what, stage, done, total)))
