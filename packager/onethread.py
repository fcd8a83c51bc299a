"""The build's own arithmetic on one thread while its workers hold the cores.

A cold build computes its test vectors (ONNX Runtime's outputs, the float64 reference) while
one compile worker per core runs LLVM (packager/compiling.py), and runs the portable
interpreter's vectors while qemu validates the other architectures' artifacts. NumPy's BLAS
and ONNX Runtime would each start a thread per core, whose waits spin: measured on a 2-core
host, Whisper-tiny's float64 reference took 11.9 s of CPU with two BLAS threads against 6.8 s
with one, at the same wall time alone, and every spinning second was taken from a worker.
So those steps run with one thread while the workers or qemu are at work (``one_thread``,
``while_busy``: the float64 reference decides case by case, as a small model's workers are
done long before it is; ONNX Runtime's session is given ``THREADS``). threadpoolctl finds the
BLAS NumPy loaded (OpenBLAS, MKL, Accelerate) and sets its limit for the block, restoring it
after.
"""

from __future__ import annotations

import contextlib
from typing import Callable

THREADS = 1   # ONNX Runtime's intra-op threads for the build's baseline outputs


@contextlib.contextmanager
def one_thread():
    """NumPy's BLAS limited to one thread for the block (where threadpoolctl finds one)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield


def while_busy(busy: Callable[[], bool]):
    """``one_thread()`` if ``busy()`` says the cores are taken now, else no limit."""
    return one_thread() if busy() else contextlib.nullcontext()
