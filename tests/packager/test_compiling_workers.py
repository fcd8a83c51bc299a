"""packager/compiling.py's compile workers share a count of the build's compiles not yet
finished (codegen/cores.py): each worker reads its share of the cores from it, and each compile
that ends takes itself off it, so the last targets' LLVM takes the cores the others left."""

from __future__ import annotations

import multiprocessing
import os

from mlpack.codegen import cores
from mlpack.codegen.compile import compile_onnx
from mlpack.packager import compiling

MLP = os.path.join(os.path.dirname(os.path.dirname(__file__)), "models", "mlp.onnx")


def test_a_worker_takes_its_share_and_the_progress_initializer():
    counter = multiprocessing.get_context("spawn").Value("i", 1)
    called = []
    try:
        compiling._worker_init(counter, called.append, ("queue",))
        assert called == ["queue"]
        assert cores.share() == cores.machine()   # the last compile left: every core
        counter.value = 10 * cores.machine()
        assert cores.share() == 1
        compiling._worker_init(counter, None, ())   # no progress display: nothing else
    finally:
        cores.set_unfinished(None)


def test_each_finished_compile_comes_off_the_count(tmp_path):
    graph = compile_onnx(MLP)
    models = compiling.Models(graph, {}, tmp_path / "blobs", scratch=True)
    slow = [("x86_64-v2", "fp32"), ("aarch64", "fp32")]
    workers = compiling._Workers(compiling.compile_one, models, slow)
    assert 0 <= workers.unfinished.value <= 2
    results = workers.results()
    assert set(results) == set(slow)
    assert all(type(code).__name__ == "Code" for code, _ in results.values())
    assert workers.unfinished.value == 0
    models.close()
