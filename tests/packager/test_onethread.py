"""The build's own arithmetic runs on one thread beside its workers (packager/onethread.py)."""

from __future__ import annotations

import contextlib
import os

import onnxruntime as ort
import pytest
import support
from threadpoolctl import threadpool_info

from mlpack.packager import build as build_mod
from mlpack.packager import compiling, onethread, reference, validation

MLP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models", "mlp.onnx")


def _blas_threads() -> set[int]:
    return {lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"}


def test_one_thread_limits_numpys_blas_and_restores_it():
    before = _blas_threads()
    assert before   # (NumPy's wheels carry a BLAS: the limit has something to act on)
    with onethread.one_thread():
        assert _blas_threads() == {1}
    assert _blas_threads() == before


def _recording(monkeypatch) -> dict:
    """What each step's threads were: the float64 reference's BLAS per case, ONNX Runtime's
    session option, each artifact's run's BLAS."""
    seen = {}
    real_f64, real_outputs = reference.float64_outputs, validation._outputs_of

    def f64(graph, cases, each=None):
        @contextlib.contextmanager
        def recorded():
            with each():
                seen.setdefault("reference", []).append(_blas_threads())
                yield
        return real_f64(graph, cases, recorded)

    def outputs_of(model, i, pairs, *args):
        seen[pairs[i][0]] = _blas_threads()
        return real_outputs(model, i, pairs, *args)

    class Session(ort.InferenceSession):
        def __init__(self, model, opts=None, **kwargs):
            seen["onnxruntime"] = opts.intra_op_num_threads
            super().__init__(model, opts, **kwargs)

    monkeypatch.setattr(reference, "float64_outputs", f64)
    monkeypatch.setattr(validation, "_outputs_of", outputs_of)
    monkeypatch.setattr(ort, "InferenceSession", Session)
    return seen


@pytest.mark.parametrize("busy", [True, False])
def test_the_references_use_one_thread_while_the_workers_run(tmp_path, monkeypatch, busy):
    """The float64 reference (case by case) and ONNX Runtime's outputs on one thread while
    compile workers hold the cores, on their defaults once the workers are done."""
    seen = _recording(monkeypatch)
    monkeypatch.setattr(compiling.Started, "busy", lambda self: busy)
    build_mod.build(MLP, os.fspath(tmp_path / "mlp.mlpack"), targets=["portable"], cache=False)
    default = _blas_threads()
    assert seen["reference"] == [{1} if busy else default] * 2   # (two cases)
    assert seen["onnxruntime"] == (onethread.THREADS if busy else 0) and onethread.THREADS == 1


@pytest.mark.parametrize("beside", ["nothing", "aarch64"])
def test_the_portable_run_uses_one_thread_beside_qemu(tmp_path, monkeypatch, beside,
                                                      patient_emulation):
    """The portable interpreter's run on one thread while an emulated run holds a core, and on
    NumPy's default otherwise."""
    if beside != "nothing" and not support.emulated(beside):
        pytest.skip(f"{beside}'s artifacts are not emulated on this host")
    seen = _recording(monkeypatch)
    targets = ["portable"] + ([beside] if beside != "nothing" else [])
    result = build_mod.build(MLP, os.fspath(tmp_path / "mlp.mlpack"), targets=targets,
                             cache=False)
    assert seen["portable"] == ({1} if beside != "nothing" else _blas_threads())
    assert all(a.validated for a in result.artifacts)   # (the aarch64 one ran under qemu)


def test_the_workers_are_busy_until_their_last_target_is_compiled():
    from concurrent.futures import Future

    started = compiling.Started.__new__(compiling.Started)
    started.workers = None
    assert not started.busy()   # (everything compiles here, or came from the cache)

    class Workers:
        futures = {("x86_64-v2", "fp32"): Future(), ("aarch64", "fp32"): Future()}

    started.workers = Workers
    first, second = Workers.futures.values()
    first.set_result(None)
    assert started.busy()
    second.set_result(None)
    assert not started.busy()
