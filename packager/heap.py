"""The C heap's free memory handed back to the system between a build's big steps.

A build holds a model's weights several times over, one copy after another: the parsed
message, the imported graph, the reference's graph, ONNX Runtime's session, each artifact's
packed panels. glibc's allocator keeps what is freed for reuse (below its mmap threshold, which
rises to 32 MB as big blocks come and go), so each step's copy stayed resident under the next
one's: GPT-2's build (a 500 MB file) held 1 GB of freed heap from its import to its end.
``release`` asks glibc to return free pages (``malloc_trim``); on another C library it does
nothing.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import sys


@functools.cache
def _trim():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None).malloc_trim   # glibc's; musl has none
    except (OSError, AttributeError):
        return None


def release(collect: bool = False) -> None:
    """Return the heap's free pages to the system, where the C library can (a few ms).
    ``collect``: first free what only reference cycles hold (a parsed ONNX message, an IR
    graph: 0.05-0.2 s for a big model's objects)."""
    if collect:
        gc.collect()
    trim = _trim()
    if trim is not None:
        trim(0)
