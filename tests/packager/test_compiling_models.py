"""packager/compiling.py's Models: once the fp32 weights archive is written, the base graph is
the one whose constants map it (the import's own copy of every weight is then free to go: GPT-2's
cold build held 4.3x its file through validation, now 2.8x), under the same keys."""

from __future__ import annotations

import mmap
import os

import numpy as np
import pytest

from mlpack.codegen.compile import compile_onnx
from mlpack.packager import compiling
from mlpack.packager.cache import KernelCache, graph_key

MLP = os.path.join(os.path.dirname(os.path.dirname(__file__)), "models", "mlp.onnx")


def _backed_by_mmap(a: np.ndarray) -> bool:
    while isinstance(a, np.ndarray) and a.base is not None:
        a = a.base
    return isinstance(a, (mmap.mmap, memoryview)) or type(a).__name__ == "mmap"


def test_rebase_takes_the_graph_that_maps_the_weights(tmp_path):
    graph = compile_onnx(MLP)
    big = max(graph.constants.values(), key=lambda c: np.asarray(c.data).nbytes)
    cache = KernelCache(tmp_path / "k")
    models = compiling.Models(graph, {}, cache.folder / "blobs", cache)
    key = graph_key(models.base, "x86_64-v2", "fp32")
    fp32 = models.graph("fp32")
    del graph
    models.rebase()
    assert models.base is fp32
    assert _backed_by_mmap(np.asarray(models.base.constants[big.name].data))
    assert graph_key(models.base, "x86_64-v2", "fp32") == key   # the same graph, by content
    models.close()


def test_a_script_without_a_main_guard_builds_in_workers(tmp_path):
    """``mlpack.build`` at a script's top level, with no ``if __name__ == "__main__"``: the
    compile workers (spawned) must not run the script again (each run would start workers of
    its own, and die in multiprocessing's "bootstrapping phase" error)."""
    import subprocess
    import sys

    out = tmp_path / "mlp.mlpack"
    script = tmp_path / "unguarded.py"
    script.write_text(
        "from mlpack.packager import compiling\n"
        "from mlpack.packager.build import build\n"
        "compiling.PARALLEL_MIN_OPS = 0   # the MLP's two cpu targets then compile in workers\n"
        "print('script ran', flush=True)\n"
        f"build({MLP!r}, {str(out)!r}, targets=['x86_64-v2', 'aarch64'], cache=False)\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "script ran\n"   # once: not again in either worker
    assert "bootstrapping" not in proc.stderr and "Traceback" not in proc.stderr
    assert out.is_file()


def test_a_cancelled_pools_wakeup_lets_a_closed_pipe_be():
    """At exit, CPython 3.11 writes to each process pool's wake-up pipe, which the pool's
    manager thread may close between the write's check and the write after a cancel (the
    Ctrl-C test saw "Exception ignored ... Bad file descriptor" once in CI): the build's pool
    ignores that."""
    from concurrent.futures.process import _ThreadWakeup

    wakeup = _ThreadWakeup()
    wakeup._writer.close()   # closed under it: its own _closed flag not yet set
    with pytest.raises(OSError):
        wakeup.wakeup()
    compiling._quiet_wakeup(wakeup)
    wakeup.wakeup()   # no error
    wakeup.close()
