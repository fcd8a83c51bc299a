"""How many cores one target's LLVM may take now: the machine's when it compiles alone, a share
of them when a build's compile workers run side by side.

A target's library is cut into parts that LLVM compiles in parallel processes
(codegen/targets/cpu/module.py, objects.py). While every core runs a target of its own, parts
only add processes; once a build's last targets are all that is left, the cores the finished
ones held are idle, and the targets still to start their LLVM take them. The packager's
compile workers share one counter of the build's compiles not yet finished
(packager/compiling.py sets it in each worker, ``set_unfinished``); a process without one
(a compile in the build's own process, a test) has the machine to itself.
"""

from __future__ import annotations

import os

_unfinished = None   # a multiprocessing Value: the build's compiles not yet finished


def set_unfinished(counter) -> None:
    """Take this process's share of the cores from ``counter`` (None: all of them)."""
    global _unfinished
    _unfinished = counter


def machine() -> int:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def share() -> int:
    """The cores this compile may use now: the machine's, divided among the compiles not yet
    finished (this one included), at least one."""
    cores = machine()
    if _unfinished is None:
        return cores
    return max(1, cores // max(1, _unfinished.value))
