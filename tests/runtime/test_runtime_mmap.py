"""Loading holds one copy of the weights: the executor's own, hashed as it was read (what runs is
what was verified, even if the file changes while open: spec/SPEC.md section 9), and no second
one (the file's pages are read, never kept mapped besides).

The container is written here; a fresh interpreter loads it and reports its resident set
(/proc/self/statm) before and after ``load``, so nothing this test allocated counts.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from runtime_helpers import artifact, write

from mlpack.spec.ir import Comprehension, Constant, Graph, Port, TensorType
from mlpack.spec.ir import expr as ex

N = 5000  # w is N x N f32: 100 MB

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs Linux /proc")

PROBE = textwrap.dedent("""
    import os, sys, warnings
    import numpy as np
    import mlpack, mlpack.runtime
    def rss():
        return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    warnings.simplefilter("ignore")
    before = rss()
    m = mlpack.load(sys.argv[1])
    after = rss()
    y = m(x=np.ones(%d, np.float32))["y"]
    print(after - before, float(y[0]), float(y[-1]))
""" % N)


def _big_graph() -> Graph:
    g = Graph("big")
    g.add_input("x", TensorType("f32", {"c": N}), ("c",))
    w = np.arange(N * N, dtype=np.float32).reshape(N, N) % 7
    g.add_constant(Constant("w", TensorType("f32", {"r": N, "c": N}), ("r", "c"), w))
    body = ex.read("x", {"c": ex.var("c")}, "f32") + ex.read("w", {"r": 1, "c": ex.var("c")}, "f32")
    g.add_op(Comprehension("y", TensorType("f32", {"c": N}), body, None, {}))
    g.outputs.append(Port("y", ("c",)))
    return g


def test_load_holds_one_verified_copy_of_the_weights(tmp_path):
    g = _big_graph()
    path = write(tmp_path / "big.mlpack", g, [artifact(g)])
    del g
    assert os.path.getsize(path) > N * N * 4
    out = subprocess.run([sys.executable, "-c", PROBE, path], capture_output=True, text=True,
                         check=True).stdout.split()
    grew, first, last = int(out[0]), float(out[1]), float(out[2])
    weights = N * N * 4
    assert weights * 0.9 < grew < weights + (20 << 20), \
        f"load made {grew >> 20} MB resident; the weights are {weights >> 20} MB, held once"
    assert (first, last) == (1 + N % 7, 1 + (2 * N - 1) % 7)  # row 1 of w, plus ones
