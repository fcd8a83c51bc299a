"""packager/heap.py: the C heap's free pages handed back between a build's big steps."""

from __future__ import annotations

import pytest

from mlpack.packager import heap


def _anon_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon:"))


def test_release_hands_back_what_a_fragmented_heap_keeps():
    if heap._trim() is None:
        pytest.skip("no glibc malloc_trim on this system")
    # 160 MB in 64 KB blocks (below glibc's mmap threshold: on the heap), every tenth kept:
    # the heap cannot shrink past the kept ones, so glibc keeps the free pages between them
    blocks = [bytearray(b"x" * (64 << 10)) for _ in range(2560)]
    kept = blocks[::10]
    full = _anon_kib()
    del blocks
    freed = _anon_kib()
    if full - freed > 40 << 10:
        pytest.skip("this C library returned the free blocks itself")
    heap.release()
    released = _anon_kib()
    assert freed - released > 100 << 10   # most of the 144 MB freed between the kept blocks
    assert len(kept) == 256
    heap.release(collect=True)   # (a cycle collection first: nothing more to assert)
