"""The C engine's execution half (api_run.c, plan.c, loader.c, pool.c, portable.c).

The C suite (`make -C runtime/c test`, whose test_run.c runs hand-written kernel libraries and
portable programs made by runtime/c/tests/make_fixtures.py) must pass, under valgrind too when
it is installed, and the pool's test and test_threads.c under ThreadSanitizer where cc has it;
and through runtime/native.py the C portable interpreter must give the NumPy
interpreter's outputs on the MLP and BERT block of tests/models (compiled from ONNX) and on a procedure with a
data-dependent output size. The Python part skips cleanly where native.py or libmlpack is absent.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from runtime_helpers import artifact, write

from mlpack.spec.ir import parse_graph, run_graph

ROOT = Path(__file__).resolve().parents[2]
CDIR = ROOT / "runtime" / "c"
NEEDS_TOOLS = pytest.mark.skipif(not (shutil.which("make") and shutil.which("cc")), reason="needs make and cc")


def _make(*targets: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-C", str(CDIR), *targets], capture_output=True, text=True, timeout=timeout)


@NEEDS_TOOLS
def test_c_suite_passes():
    r = _make("test")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "test_run:" in r.stdout and "test_run: 0 checks" not in r.stdout
    assert (CDIR / "build" / "fixtures" / "native_mlp.mlpack").exists()


@NEEDS_TOOLS
@pytest.mark.skipif(not shutil.which("valgrind"), reason="needs valgrind")
def test_open_run_close_leaks_nothing_under_valgrind():
    r = _make("valgrind")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]


def _tsan_works() -> bool:
    """Whether cc builds and runs a -fsanitize=thread program here (some kernels' address
    space layouts make TSan refuse to start)."""
    if not (shutil.which("make") and shutil.which("cc")):
        return False
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        src, exe = Path(d) / "t.c", Path(d) / "t"
        src.write_text("int main(void) { return 0; }\n")
        if subprocess.run(["cc", "-fsanitize=thread", str(src), "-o", str(exe)],
                          capture_output=True).returncode != 0:
            return False
        return subprocess.run([str(exe)], capture_output=True).returncode == 0


@pytest.mark.skipif(not _tsan_works(), reason="needs a C compiler with a working ThreadSanitizer")
def test_pool_and_threaded_runs_under_thread_sanitizer():
    """Every workgroup of every job runs once, with no data race (pool.c's job protocol); one
    model run from 8 threads at once (test_threads.c: native plans on a shared pool, portable
    programs, data-dependent output sizes, mlpack_run and mlpack_run_into) gives the serial
    runs' bytes, with no ThreadSanitizer report."""
    r = _make("tsan")
    out = r.stdout + r.stderr
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "ThreadSanitizer" not in out, out[-6000:]
    for test in ("test_pool", "test_threads"):
        assert re.search(rf"^{test}: [1-9][0-9]* checks, 0 failures$", r.stdout, re.M), out[-4000:]


# ---------------------------------------------------------------- through runtime/native.py


def _native():
    if importlib.util.find_spec("mlpack.runtime.native") is None:
        pytest.skip("runtime/native.py is not there yet")
    from mlpack.runtime import native
    if not native.available() and shutil.which("make") and shutil.which("cc"):
        _make()
    if not native.available():
        pytest.skip("libmlpack is not built (pip install -e . or make -C runtime/c)")
    return native


@pytest.mark.parametrize("model", ["mlp", "bert_block"])
def test_onnx_model_portable_program_runs_in_c_like_numpy(tmp_path, model):
    native = _native()
    onnx = pytest.importorskip("onnx")
    from mlpack.codegen.compile import compile_onnx
    g = compile_onnx(onnx.load(str(ROOT / "tests" / "models" / f"{model}.onnx")))
    path = write(tmp_path / f"{model}.mlpack", g, [artifact(g)])
    (port,) = g.inputs
    ty = g.types[port.name]
    rng = np.random.default_rng(0)
    with native.open_model(path, threads=2) as m:
        assert m.chosen.device == "portable"
        for batch in (1, 3):
            shape = [batch if ty.dims[d].op == "sym" else ty.dims[d].arg for d in port.layout]
            if ty.dtype == "i64":  # token ids
                shape = [8 if ty.dims[d].op == "sym" and k else n for k, (d, n) in enumerate(zip(port.layout, shape))]
                x = rng.integers(0, 100, size=shape).astype(np.int64)
            else:
                x = rng.standard_normal(shape).astype(np.float32)
            got, want = m.run({port.name: x}), run_graph(g, {port.name: x})
            assert got.keys() == want.keys()
            for k in want:
                assert got[k].shape == want[k].shape and got[k].dtype == want[k].dtype
                np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5)


NONZERO = """graph "nonzero" {
  in %x: f32{n=$len} (n)
  %idx: i64{k=$nnz} = proc bounds{$nnz=$len} {
    let count: i64 = 0
    for i in $len {
      if ne(%x[n=i], 0.0) {
        %idx[k=count] = i
        let count: i64 = count + 1
      }
    }
    size $nnz = count
  }
  out %idx (k)
}"""


def test_data_dependent_output_size_in_c(tmp_path):
    native = _native()
    g = parse_graph(NONZERO)
    path = write(tmp_path / "nz.mlpack", g, [artifact(g)])
    with native.open_model(path) as m:
        for x in (np.array([0, 1.5, 0, -2, 3, 0], np.float32), np.zeros(3, np.float32)):
            np.testing.assert_array_equal(m.run({"x": x})["idx"], np.flatnonzero(x))


def test_native_plan_fixture_from_python():
    native = _native()
    fixture = CDIR / "build" / "fixtures" / "native_mlp.mlpack"
    if not fixture.exists():
        if not (shutil.which("make") and shutil.which("cc")):
            pytest.skip("no fixtures and no compiler")
        _make("build/fixtures/fixtures.list")
    from mlpack.spec.tensorfile import read_tensors
    vectors = read_tensors((CDIR / "build" / "fixtures" / "native_mlp.vectors").read_bytes())
    with native.open_model(str(fixture), threads=2) as m:
        assert m.chosen.device == "cpu"
        for case in range(2):
            y = m.run({"x": vectors[f"case{case}/input/x"]})["y"]
            np.testing.assert_allclose(y, vectors[f"case{case}/output/y"], rtol=1e-5, atol=1e-6)


def test_input_errors_name_the_input_and_dim(tmp_path):
    native = _native()
    from mlpack.spec import errors
    g = parse_graph("""graph "two" {
  in %ids: i64{batch=$batch, seq=$seq} (batch, seq)
  in %mask: f32{batch=$batch, seq=$seq} (batch, seq)
  %y: f32{batch=$batch, seq=$seq} = cast<f32>(%ids[batch=batch, seq=seq]) * %mask[batch=batch, seq=seq]
  out %y (batch, seq)
}""")
    path = write(tmp_path / "two.mlpack", g, [artifact(g)])
    with native.open_model(path) as m:
        with pytest.raises(errors.InputError, match="input 'mask' dim 'seq' is 9, but input 'ids' bound seq=8"):
            m.run({"ids": np.zeros((2, 8), np.int64), "mask": np.zeros((2, 9), np.float32)})
        y = m.run({"ids": np.ones((2, 8), np.int64), "mask": np.full((2, 8), 0.5, np.float32)})["y"]
        np.testing.assert_array_equal(y, np.full((2, 8), 0.5, np.float32))

