"""One loaded model run from many Python threads at once gives, bit for bit, what serial runs give.

tests/models/mlp.onnx is built for this host's cpu target (plus the portable artifact); then,
through ``mlpack.load``, 8 ``concurrent.futures`` threads run it on inputs of different batch
sizes and values and every output is compared byte for byte with the serial run of the same
input: on the native artifact (the engine; runs share its pool of 2 threads) both ways the
engine hands outputs back (``mlpack_run_into`` into new arrays, and ``mlpack_run`` whose outputs
are copied out), on the portable artifact in the NumPy interpreter, and on the engine's C
interpreter, with a model whose output size depends on the data. The C side of the same check
(runtime/c/tests/test_threads.c, also under ThreadSanitizer: ``make -C runtime/c tsan``) is run by
test_c_execution.py.
"""

from __future__ import annotations

import importlib.util
import platform
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from runtime_helpers import artifact, write

import mlpack
from mlpack.runtime import native
from mlpack.spec.ir import parse_graph

ROOT = Path(__file__).resolve().parents[2]
THREADS = 8
CASES = 24
ROUNDS = 4   # each case this many times, spread over the threads

pytestmark = pytest.mark.usefixtures("native_lib")


def _host_target() -> str | None:
    machine = platform.machine()
    return "aarch64" if machine in ("aarch64", "arm64") else "x86_64-v2" if machine in ("x86_64", "AMD64") \
        else None


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    target = _host_target()
    if target is None:
        pytest.skip(f"no cpu target for a {platform.machine()} host")
    build = pytest.importorskip("mlpack.packager.build").build
    path = tmp_path_factory.mktemp("threads") / "mlp.mlpack"
    build(str(ROOT / "tests" / "models" / "mlp.onnx"), str(path), targets=["portable", target])
    return path


def _cases(seed: int = 0) -> list[dict[str, np.ndarray]]:
    """MLP inputs x: f32[batch, 784], batch 1..6, a third of the values exactly zero."""
    rng = np.random.default_rng(seed)
    out = []
    for c in range(CASES):
        x = rng.standard_normal((1 + c % 6, 784)).astype(np.float32)
        x[rng.random(x.shape) < 0.3] = 0
        out.append({"x": x})
    return out


def _same(got: dict, want: dict) -> bool:
    return list(got) == list(want) and all(
        g.dtype == w.dtype and g.shape == w.shape and g.tobytes() == w.tobytes()
        for g, w in zip(got.values(), want.values()))


def _check_threaded(run, cases) -> None:
    """run(feeds) on THREADS threads, every case ROUNDS times in a scrambled order, each result
    bit-identical to the serial result of its case."""
    serial = [run(feeds) for feeds in cases]
    order = [i for _ in range(ROUNDS) for i in range(len(cases))]
    np.random.default_rng(1).shuffle(order)
    with ThreadPoolExecutor(THREADS) as pool:
        got = list(pool.map(lambda i: (i, run(cases[i])), order))
    bad = [i for i, out in got if not _same(out, serial[i])]
    assert not bad, f"{len(bad)} of {len(got)} threaded runs differ from the serial run (cases {sorted(set(bad))[:8]})"
    assert len(got) == ROUNDS * len(cases)


@pytest.mark.parametrize("copy_out", [False, True], ids=["run_into", "run"])
def test_native_artifact_from_threads(mlp, copy_out, monkeypatch):
    if copy_out:   # no output shapes known up front: the engine's mlpack_run, copied out
        monkeypatch.setattr(native, "_output_shapes", lambda *a: None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # (an unsigned container's warning is not what this tests)
        m = mlpack.load(mlp, threads=2)
    with m:
        assert m.artifact.device == "cpu"
        _check_threaded(m.run, _cases())


def test_portable_artifact_from_threads(mlp):
    """The NumPy interpreter: all of a run's state is the run's."""
    with mlpack.load(mlp, device="portable") as m:
        assert m.artifact.device == "portable"
        _check_threaded(m.run, _cases()[:8])


def _nonzero_graph() -> str:
    """The C tests' NonZero procedure (runtime/c/tests/make_fixtures.py), one graph for both."""
    spec = importlib.util.spec_from_file_location(
        "mlpack_c_fixtures", ROOT / "runtime" / "c" / "tests" / "make_fixtures.py")
    fixtures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fixtures)
    return fixtures.PORTABLE["nonzero"][0]


def test_engine_interpreter_with_data_dependent_output_from_threads(tmp_path):
    """The engine's C interpreter (run copies of its program), with outputs whose size only the
    run knows: mlpack_run allocates them in each calling thread's own context."""
    g = parse_graph(_nonzero_graph())
    path = write(tmp_path / "nonzero.mlpack", g, [artifact(g)])
    rng = np.random.default_rng(2)
    cases = []
    for c in range(CASES):
        x = rng.standard_normal(3 + 5 * c).astype(np.float32)
        x[rng.random(x.shape) < 0.5] = 0
        cases.append({"x": x})
    with native.open_model(path, threads=2) as m:
        assert m.chosen.device == "portable"
        _check_threaded(m.run, cases)
        np.testing.assert_array_equal(m.run(cases[5])["idx"], np.flatnonzero(cases[5]["x"]))


def test_engine_interpreter_on_mlp_from_threads(mlp):
    with native.open_model(mlp, device="portable") as m:
        _check_threaded(m.run, _cases()[:6])
