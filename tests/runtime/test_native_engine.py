"""The C engine (libmlpack) through runtime/native.py, checked against the Python runtime:
the conformance corpus gets the same verdict classes as the Python reader, selection gives the
same verdicts and reasons as runtime/select.py on this host, a run gives the Python runtime's
outputs, and the C test suite (`make -C runtime/c test`) passes."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from runtime_helpers import artifact, every_target, write

from mlpack.runtime import detect_host, load, native
from mlpack.runtime.select import select_artifact
from mlpack.spec import errors
from mlpack.spec.container import open_container

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "spec" / "conformance"
CDIR = ROOT / "runtime" / "c"
EXPECTED = json.loads((CORPUS / "expected.json").read_text())


pytestmark = pytest.mark.usefixtures("native_lib")


def _engine_class(py_exc: Exception) -> type:
    """The exception the engine raises for a Python reader error: it has status classes only."""
    for cls in (errors.DigestError, errors.VersionError):
        if isinstance(py_exc, cls):
            return cls
    return errors.FormatError


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_corpus_verdict_matches_python_reader(name):
    path = CORPUS / name
    try:
        open_container(path).close()
        py_exc = None
    except errors.FormatError as e:
        py_exc = e
    try:
        native.open_model(path, device="portable", threads=1).close()
        c_exc = None
    except errors.Error as e:
        c_exc = e
    if py_exc is None:
        assert c_exc is None, f"{name}: engine refused a file the Python reader opens: {c_exc}"
        return
    assert c_exc is not None, f"{name}: engine opened a file the Python reader refuses ({py_exc})"
    assert type(c_exc) is _engine_class(py_exc), f"{name}: {type(c_exc).__name__}: {c_exc}"
    assert EXPECTED[name]["message_contains"] in str(c_exc)


@pytest.fixture
def full(tmp_path, tiny):
    return write(tmp_path / "full.mlpack", tiny, every_target(tiny))


POLICIES = [dict(device="portable"), dict(device="portable", precision="fp32"),
            dict(device="portable", precision="fp16"), dict(device="portable", accuracy_budget=0.01)]


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_selection_matches_python_select(full, policy):
    host = detect_host()
    if host.cuda_sm is not None:
        pytest.skip("the engine does not probe CUDA yet; the Python runtime does")
    with open_container(full) as box:
        try:
            _, py = select_artifact(box, host, code_types=None, **policy)
        except errors.NoRunnableArtifactError as e:
            with pytest.raises(errors.NoRunnableArtifactError) as c:
                native.open_model(full, threads=1, **policy)
            assert str(c.value) == str(e), "the engines explain the refusal differently"
            return
    with native.open_model(full, threads=1, **policy) as m:
        assert len(m.artifacts) == len(py)
        for c, p in zip(m.artifacts, py):
            assert (c.runnable, c.chosen, c.reason) == (p.runnable, p.chosen, p.reason), c.index


def test_engine_picks_the_artifact_python_picks(full):
    # the native artifacts' code is fake: the engine must fail loading the one Python would pick
    host = detect_host()
    with open_container(full) as box:
        winner, _ = select_artifact(box, host, code_types=None)
    if winner.device == "portable":
        native.open_model(full, threads=1).close()
        return
    with pytest.raises(errors.Error, match=rf"artifact {winner.index}\b"):
        native.open_model(full, threads=1)


def test_without_a_budget_the_engine_takes_native_int8_over_the_portable_fp32(tmp_path, tiny):
    # (the int8 artifact's code is fake: the engine choosing it shows as a failure to load it)
    host = detect_host()
    if host.arch != "amd64" or (host.x86_level or 0) < 2:
        pytest.skip("needs an x86-64-v2 host")
    path = write(tmp_path / "i8.mlpack", tiny, [
        artifact(tiny), artifact(tiny, "cpu", "int8", target="x86_64-v2", err=2e-2,
                                 features=("sse4_2", "popcnt", "ssse3", "cx16", "sahf"))])
    with open_container(path) as box:
        assert select_artifact(box, host, code_types=None)[0].index == 1
    with pytest.raises(errors.Error, match=r"artifact 1\b"):
        native.open_model(path, threads=1)


def test_no_runnable_artifact_names_each_reason(tmp_path, tiny):
    arch = detect_host().arch
    other = ("x86_64-v3", "amd64") if arch == "arm64" else ("aarch64", "arm64")
    path = write(tmp_path / "foreign.mlpack", tiny, [artifact(tiny, "cpu", target=other[0])])
    with pytest.raises(errors.NoRunnableArtifactError) as e:
        native.open_model(path)
    assert "no artifact runs on this host" in str(e.value)
    assert f"passed over: {other[1]}, this host is {arch}" in str(e.value)


def test_strict_refuses_the_portable_fallback(tmp_path, tiny):
    path = write(tmp_path / "p.mlpack", tiny, [artifact(tiny)])
    with pytest.raises(errors.PortableFallbackError, match="no native artifact"):
        native.open_model(path, strict=True)
    native.open_model(path, strict=True, device="portable").close()


def test_run_matches_python_runtime(tmp_path, tiny):
    path = write(tmp_path / "t.mlpack", tiny, [artifact(tiny)])
    x = np.linspace(-4, 4, 12, dtype=np.float32).reshape(3, 4)
    with native.open_model(path, threads=2) as m:
        assert [(t.name, t.dtype, t.shape) for t in m.inputs] == [("x", "f32", ("batch", 4))]
        got = m(x=x)["y"]
        with pytest.raises(errors.InputError, match="x"):
            m.run({"x": x.astype(np.float64)})
        with pytest.raises(errors.InputError):
            m.run({})
    with pytest.warns(errors.PortableFallbackWarning):
        want = load(path)(x=x)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_outputs_are_written_into_new_arrays(tmp_path, tiny, monkeypatch):
    """The inputs' shapes fix the output's (batch), so run asks the engine to write it straight
    into a new array (mlpack_run_into): each run's result is its own, of the run's size, and
    equal to what the engine's own memory gives (mlpack_run, when no shape can be known)."""
    path = write(tmp_path / "t.mlpack", tiny, [artifact(tiny)])
    x3 = np.linspace(-4, 4, 12, dtype=np.float32).reshape(3, 4)
    x5 = np.linspace(-2, 3, 20, dtype=np.float32).reshape(5, 4)
    with native.open_model(path, threads=2) as m:
        planned = native._output_shapes(m.inputs, m.outputs, {"x": x5})
        assert planned == [((5, 4), np.dtype(np.float32))]
        assert native._output_shapes(m.inputs, m.outputs, {"y": x5}) is None   # batch unbound
        first, second = m(x=x3)["y"], m(x=x5)["y"]
        assert first.shape == (3, 4) and second.shape == (5, 4)
        assert first.flags.owndata and second.flags.owndata
        monkeypatch.setattr(native, "_output_shapes", lambda *a: None)   # the copying path
        m._calls.clear()
        np.testing.assert_array_equal(first, m(x=x3)["y"])
        np.testing.assert_array_equal(second, m(x=x5)["y"])


def test_a_signature_call_is_reused_with_each_runs_data(tmp_path, tiny):
    """Runs with one input signature share the structs built for it (only the data pointers
    change): a second run with new data of the same shape computes on the new data, into a
    new array, and a new shape gets structs of its own."""
    path = write(tmp_path / "t.mlpack", tiny, [artifact(tiny)])
    a = np.linspace(-4, 4, 12, dtype=np.float32).reshape(3, 4)
    b = -2 * a
    with native.open_model(path, threads=1) as m:
        ya = m(x=a)["y"]
        yb = m(x=b)["y"]
        assert len(m._calls) == 1
        assert ya is not yb and not np.shares_memory(ya, yb)
        np.testing.assert_array_equal(ya, m(x=a)["y"])   # a's result was not overwritten
        assert not np.array_equal(ya, yb)
        assert m(x=a[:2])["y"].shape == (2, 4) and len(m._calls) == 2
        with pytest.raises(errors.InputError, match="'x'"):
            m.run({"x": a.astype(np.float64)})   # the engine refuses it, each time
        with pytest.raises(errors.InputError, match="'x'"):
            m.run({"x": a.astype(np.float64)})


def _squeeze_excite():
    """conv -> relu -> global pool -> 1x1 down, relu, 1x1 up, sigmoid -> scale -> 1x1, over a
    dynamic batch: arena buffers whose offsets are sums of aligned sizes of $batch."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(5)
    w = lambda name, *shape: helper.make_tensor(  # noqa: E731
        name, TensorProto.FLOAT, shape, (0.3 * rng.standard_normal(shape)).astype(np.float32).ravel())
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("GlobalAveragePool", ["r1"], ["p"]),
             helper.make_node("Conv", ["p", "w2"], ["c2"]), helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Conv", ["r2", "w3"], ["c3"]), helper.make_node("Sigmoid", ["c3"], ["s"]),
             helper.make_node("Mul", ["r1", "s"], ["scaled"]),
             helper.make_node("Conv", ["scaled", "w4"], ["y"])]
    g = helper.make_graph(
        nodes, "se", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 9, 9])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8, 9, 9])],
        [w("w1", 16, 3, 3, 3), w("w2", 4, 16, 1, 1), w("w3", 16, 4, 1, 1), w("w4", 8, 16, 1, 1)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("threads", [1, 2])
def test_runs_at_the_same_and_at_other_batches_each_get_their_sizes(tmp_path, threads):
    """A run at the last run's symbols keeps its workgroup counts and arena bases (native.c);
    a run at another batch evaluates them again: every run, on new data, matches ONNX Runtime,
    whichever batch came before (a run sized for the last batch would read or write past the
    arena of a bigger one, or leave a smaller one's rows undone)."""
    from support import best_host_target, oracle_outputs

    from mlpack.packager.build import build

    model = _squeeze_excite()
    src = tmp_path / "se.onnx"
    src.write_bytes(model.SerializeToString())
    out = tmp_path / "se.mlpack"
    build(str(src), str(out), targets=[best_host_target("x86_64-v2", "x86_64-v3", "x86_64-v4")], cache=False)
    rng = np.random.default_rng(0)
    with native.open_model(out, device="cpu", threads=threads) as m:
        for batch in (2, 2, 5, 5, 2, 1, 1, 7, 2):
            x = rng.standard_normal((batch, 3, 9, 9)).astype(np.float32)
            np.testing.assert_allclose(m(x=x)["y"], oracle_outputs(model, {"x": x})[0],
                                       rtol=1e-4, atol=1e-5)


def test_bad_options_are_errors(full):
    with pytest.raises(errors.Error, match="device 'tpu'"):
        native.open_model(full, device="tpu")
    with pytest.raises(errors.Error):
        native.open_model(full, threads=0)
    with pytest.raises(errors.FormatError, match="cannot open"):
        native.open_model(Path(full).parent / "missing.mlpack")


@pytest.mark.skipif(shutil.which("make") is None or shutil.which("cc") is None, reason="no C toolchain")
def test_c_suite_passes():
    r = subprocess.run(["make", "-C", str(CDIR), "test"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]


def _retar_checksum(block: bytearray) -> None:
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)


def _mutants(seed: int, count: int):
    """Broken variants of the valid corpus files: flipped bytes, truncations, and tar header edits
    with a recomputed checksum (so they get past it): type flags, sizes, names, magic."""
    rng = np.random.default_rng(seed)
    bases = [(CORPUS / n).read_bytes() for n in sorted(EXPECTED) if n.startswith("ok_")]
    for i in range(count):
        data = bytearray(bases[i % len(bases)])
        headers = [p for p in range(0, len(data) - 512, 512) if data[p + 257:p + 262] == b"ustar"]
        kind = i % 4
        if kind == 0:
            for _ in range(int(rng.integers(1, 4))):
                data[int(rng.integers(len(data)))] ^= 1 << int(rng.integers(8))
        elif kind == 1:
            data = data[:int(rng.integers(len(data)))]
        else:
            p = headers[int(rng.integers(len(headers)))]
            block = bytearray(data[p:p + 512])
            field = int(rng.integers(5))
            if field == 0:
                block[156] = rng.choice(list(b"0125x7g\0L"))
            elif field == 1:
                block[124:136] = b"%011o\0" % int(rng.integers(0, 70000))
            elif field == 2:
                block[int(rng.integers(0, 100))] = rng.choice(list(b"./\0a\xff"))
            elif field == 3:
                block[257:265] = b"ustar  \0"
            else:
                block[345:349] = b"./x\0"
            _retar_checksum(block)
            data[p:p + 512] = block
        yield bytes(data)


def test_mutated_corpus_verdicts_match_python_reader(tmp_path):
    mismatches = []
    for i, data in enumerate(_mutants(seed=7, count=600)):
        path = tmp_path / f"m{i}.mlpack"
        path.write_bytes(data)
        try:
            open_container(path).close()
            want = None
        except errors.FormatError as e:
            want = _engine_class(e)
        try:
            native.open_model(path, device="portable", threads=1).close()
            got = None
        except (errors.FormatError, errors.NoRunnableArtifactError) as e:
            got = type(e)
        except errors.Error:
            got = None  # the container opened; its (mutated) program did not load
        if got is not want:
            mismatches.append((i, want, got))
    assert not mismatches, mismatches[:10]


def test_data_address_of_every_dtype_and_flag():
    """The address a run hands the engine, for arrays of NumPy's own dtypes (through the buffer
    protocol), ml_dtypes' (which export no buffer), read-only and empty ones alike."""
    import ml_dtypes
    arrays = [np.arange(6).astype(d).reshape(2, 3) for d in (np.float32, np.int64, np.float16,
                                                            np.uint8, bool)]
    arrays += [np.zeros((2, 3), ml_dtypes.bfloat16), np.zeros(4, ml_dtypes.float8_e4m3fn),
               np.array(1.5, np.float32), np.zeros((0, 4), np.float32)]
    ro = np.ones(3, np.float32)
    ro.flags.writeable = False
    for a in arrays + [ro]:
        assert native._address(a) == a.ctypes.data, a.dtype
