"""``mlpack.load`` through the C engine: the engine selects, native artifacts run in it.

On an x86-64 host with libmlpack built, a container with every default cpu target picks the
host's level (v4 with AVX-512, else v3), says why each other artifact was passed over (a level
above the host's by what it needs), matches ONNX Runtime, gives the portable artifact's outputs,
runs any batch size from one artifact and validates every artifact it can run. Without the
library, load falls back to Python's selection and the portable program, loudly.
"""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest
from support import cli

import mlpack
from mlpack.runtime import detect_host, engine
from mlpack.spec.errors import Error, PortableFallbackError, PortableFallbackWarning

ort = pytest.importorskip("onnxruntime")
build = pytest.importorskip("mlpack.packager.build").build

MODELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models")
MLP = os.path.join(MODELS, "mlp.onnx")
BERT = os.path.join(MODELS, "bert_block.onnx")
RTOL, ATOL = 1e-4, 1e-5

# the default build's artifacts are portable, x86-64 v2, v3, v4, aarch64, riscv64: the engine
# chooses the host's level, artifact LEVEL - 1
HOST = detect_host()
LEVEL = min(HOST.x86_level or 0, 4)
CHOSEN = LEVEL - 1
pytestmark = pytest.mark.skipif(not (engine.available() and HOST.arch == "amd64" and LEVEL >= 2),
                                reason="needs libmlpack on an x86-64 host")


def _ort(path, feeds):
    session = ort.InferenceSession(onnx.load(path).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def _close(got, want):
    assert list(got) == list(want)
    for name, w in want.items():
        assert got[name].shape == w.shape and got[name].dtype == w.dtype, name
        np.testing.assert_allclose(got[name], w, rtol=RTOL, atol=ATOL, err_msg=name)


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    out = tmp_path_factory.mktemp("load") / "mlp.mlpack"
    build(MLP, out)
    return out


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    out = tmp_path_factory.mktemp("load") / "bert.mlpack"
    build(BERT, out)
    return out


def _x(batch, seed=0):
    return np.random.default_rng(seed).standard_normal((batch, 784)).astype(np.float32)


# ---------------------------------------------------------------- selection


def test_load_picks_the_hosts_level_and_explains_the_others(mlp):
    with mlpack.load(mlp) as m:
        assert (m.artifact.target, m.artifact.device, m.artifact.index) == (
            f"x86_64-v{LEVEL}", "cpu", CHOSEN)
        assert m.artifact.platform == f"linux/amd64/v{LEVEL}" and m.engine.startswith("libmlpack ")
        assert m.artifact.reason == (f"chosen: x86-64 v{LEVEL} cpu fp32 (artifact {CHOSEN}) is the "
                                     "most specific artifact this host runs")
        reasons = [v.reason for v in m.verdicts]
    assert reasons[0] == "portable: runs anywhere; slower"
    for i in range(1, CHOSEN):
        assert reasons[i] == (f"passed over: x86-64 v{LEVEL} cpu fp32 (artifact {CHOSEN}) "
                              "ranks higher")
    for i in range(CHOSEN + 1, 4):   # the levels above the host's
        assert reasons[i] == f"passed over: needs x86-64 v{i + 1}, this host is x86-64 v{LEVEL}"
    assert reasons[4] == "passed over: arm64, this host is amd64"
    assert reasons[5] == "passed over: riscv64, this host is amd64"
    assert [v.runnable for v in m.verdicts] == [i <= CHOSEN for i in range(4)] + [False, False]


def test_no_fallback_warning_when_native_runs(mlp, recwarn):
    mlpack.load(mlp, strict=True).close()
    assert not [w for w in recwarn if issubclass(w.category, PortableFallbackWarning)]


def test_device_and_precision_policy_go_to_the_engine(mlp):
    with mlpack.load(mlp, device="portable") as m:
        assert m.artifact.device == "portable"
        assert m.artifact.reason == "chosen: the portable artifact was requested"
    with pytest.raises(mlpack.NoRunnableArtifactError, match="precision 'int8' was requested"):
        mlpack.load(mlp, precision="int8")
    with pytest.raises(Error, match="device 'tpu' is not one of"):
        mlpack.load(mlp, device="tpu")


def test_inspect_host_json_lists_the_engine_verdicts(mlp):
    result = cli("inspect", mlp, "--host", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["engine"].startswith("libmlpack ") and f"x86-64 v{LEVEL}" in doc["host"]
    chosen = [v for v in doc["verdicts"] if v["chosen"]]
    assert [v["index"] for v in chosen] == [CHOSEN]
    assert all(v["reason"] for v in doc["verdicts"])
    # the other two x86-64 levels, aarch64, riscv64
    assert sum(v["reason"].startswith("passed over: ") for v in doc["verdicts"]) == 4
    text = cli("inspect", mlp, "--host").stdout
    assert "(selection by libmlpack" in text
    assert f"[{CHOSEN}] chosen: x86-64 v{LEVEL} cpu fp32" in text


# ---------------------------------------------------------------- running


def test_mlp_matches_onnxruntime_and_the_portable_artifact(mlp):
    x = _x(3, seed=7)
    with mlpack.load(mlp) as native, mlpack.load(mlp, device="portable") as portable:
        got = native.run({"x": x})
        _close(got, _ort(MLP, {"x": x}))
        _close(portable(x=x), got)


def test_dynamic_batch_from_one_artifact(mlp):
    with mlpack.load(mlp) as m:
        for batch in (1, 32, 1):
            x = _x(batch, seed=batch)
            y = m(x=x)["y"]
            assert y.shape == (batch, 10)
            _close({"y": y}, _ort(MLP, {"x": x}))


def test_bert_block_matches_onnxruntime_at_two_sequence_lengths(bert):
    with mlpack.load(bert) as m, mlpack.load(bert, device="portable") as p:
        assert m.artifact.target == f"x86_64-v{LEVEL}"
        for batch, seq in ((1, 5), (3, 16)):
            ids = np.random.default_rng(seq).integers(0, 100, (batch, seq)).astype(np.int64)
            got = m.run({"ids": ids})
            _close(got, _ort(BERT, {"ids": ids}))
            _close(p.run({"ids": ids}), got)


def test_two_models_open_at_once_each_run_their_own_kernels(mlp, bert):
    # the kernel libraries are dlopen()ed through /proc/self/fd/N and the dynamic loader matches
    # loaded objects by path: when the first model's memfd number was free again, the second
    # model's memfd got it and dlopen() handed back the first model's library. Free fds below
    # it make that happen: the second container's own fd takes one, its memfd the next.
    x = _x(2)
    ids = np.random.default_rng(1).integers(0, 100, (1, 7)).astype(np.int64)
    low = [os.open(os.devnull, os.O_RDONLY) for _ in range(3)]
    with mlpack.load(mlp) as a:
        for fd in low:
            os.close(fd)
        with mlpack.load(bert) as b:
            _close(b.run({"ids": ids}), _ort(BERT, {"ids": ids}))
            _close(a(x=x), _ort(MLP, {"x": x}))


def test_threads_give_the_same_answer(mlp):
    x = _x(8)
    with mlpack.load(mlp, threads=1) as one, mlpack.load(mlp, threads=2) as two:
        assert one.threads == 1
        np.testing.assert_array_equal(one(x=x)["y"], two(x=x)["y"])
    with pytest.raises(Error, match="threads must be a positive integer"):
        mlpack.load(mlp, threads=0)


def test_the_engine_reads_mlpack_num_threads(mlp, monkeypatch):
    monkeypatch.setenv("MLPACK_NUM_THREADS", "lots")
    with pytest.raises(Error, match="MLPACK_NUM_THREADS='lots' is not a positive integer"):
        mlpack.load(mlp)
    monkeypatch.setenv("MLPACK_NUM_THREADS", "1")
    mlpack.load(mlp, threads=2).close()  # an explicit count wins: the variable is not read
    with mlpack.load(mlp) as m:
        assert m(x=_x(1))["y"].shape == (1, 10)


def test_bad_inputs_are_named_before_the_engine_runs(mlp):
    with mlpack.load(mlp) as m:
        with pytest.raises(mlpack.InputError, match="input 'x' dim 'd1' \\(axis 1\\) is 5"):
            m(x=np.zeros((1, 5), np.float32))
        with pytest.raises(mlpack.InputError, match="float64"):
            m(x=np.zeros((1, 784)))
    with pytest.raises(Error, match="closed"):
        m(x=_x(1))


# ---------------------------------------------------------------- validation


def test_validate_every_artifact_this_host_runs(mlp):
    with mlpack.load(mlp) as m:
        for i in range(CHOSEN + 1):
            result = m.validate(i)
            assert result.ok and result.cases == 2 and result.artifact.index == i, result
        assert m.validate().artifact.target == f"x86_64-v{LEVEL}"
        assert len(m.test_vectors()) == 2
        for i in range(CHOSEN + 1, 4):
            with pytest.raises(Error, match=f"artifact {i} cannot run here: passed over: needs "
                                            f"x86-64 v{i + 1}"):
                m.validate(i)
        with pytest.raises(Error, match="artifact 4 cannot run here: passed over: arm64"):
            m.validate(4)


def test_the_engine_runs_a_pinned_artifact_from_the_file_itself(mlp, tmp_path, monkeypatch):
    """Validating a non-chosen artifact pins it in the engine: no temporary copy is written."""
    from mlpack.runtime import native
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    with native.open_model(mlp, artifact=1) as engine:  # x86_64-v2, not what selection picks
        assert [v.index for v in engine.artifacts if v.chosen] == [1]
        assert "artifact 1 was requested" in engine.artifacts[CHOSEN].reason
    with mlpack.load(mlp) as m:
        assert m.validate(1).ok
    assert os.listdir(tmp_path) == []
    with pytest.raises(Error, match="there is no artifact 9"):
        native.open_model(mlp, artifact=9)


# ---------------------------------------------------------------- without the engine


def test_without_libmlpack_python_selects_and_runs_portable(mlp, monkeypatch):
    x = _x(2)
    with mlpack.load(mlp) as m:
        want = m(x=x)["y"]
    monkeypatch.setattr(engine, "available", lambda: False)
    with pytest.warns(PortableFallbackWarning, match="libmlpack is not built"):
        m = mlpack.load(mlp)
    with m:
        assert m.artifact.device == "portable" and m.engine.startswith("python")
        assert "which this runtime cannot execute yet" in m.verdicts[CHOSEN].reason
        np.testing.assert_allclose(m(x=x)["y"], want, rtol=RTOL, atol=ATOL)
    with pytest.raises(PortableFallbackError, match="libmlpack is not built"):
        mlpack.load(mlp, strict=True)
    result = cli("inspect", mlp, "--host")
    assert result.exit_code == 0 and "python (libmlpack is not built)" in result.stdout


def test_a_library_named_that_does_not_load_is_the_reason_given(mlp, tmp_path, monkeypatch):
    """$MLPACK_LIBRARY naming a file that is not there: the fallback's warning names it and
    the variable, not "not built" (a developer's A/B of two builds ran the interpreter)."""
    from mlpack.runtime import native

    missing = tmp_path / "libmlpack.so"
    monkeypatch.setenv("MLPACK_LIBRARY", str(missing))
    native.library.cache_clear()
    try:
        with pytest.warns(PortableFallbackWarning,
                          match=r"cannot load libmlpack from .*libmlpack\.so \(\$MLPACK_LIBRARY\)"):
            m = mlpack.load(mlp)
        with m:
            assert m.artifact.device == "portable"
    finally:
        monkeypatch.delenv("MLPACK_LIBRARY")
        native.library.cache_clear()
    assert native.available()


def test_native_code_that_cannot_load_falls_back_loudly(tmp_path):
    corpus = os.path.join(os.path.dirname(mlpack.spec.errors.__file__), "conformance")
    with pytest.warns(PortableFallbackWarning, match="could not load the native artifact"):
        m = mlpack.load(os.path.join(corpus, "ok_multi.mlpack"))
    with m:
        assert m.artifact.device == "portable"
        assert "could not load native code" in m.verdicts[1].reason
        with pytest.raises(PortableFallbackError):
            mlpack.load(os.path.join(corpus, "ok_multi.mlpack"), strict=True)


def test_an_unloaded_model_loads_its_artifact_again_when_it_runs(mlp):
    x = _x(4, seed=3)
    with mlpack.load(mlp) as m:
        want = m(x=x)["y"]
        m.unload()
        m.unload()   # (nothing more to free)
        result = m.validate()   # the chosen artifact's vectors, loaded for them alone
        assert result.ok and result.artifact.target == f"x86_64-v{LEVEL}"
        np.testing.assert_array_equal(m(x=x)["y"], want)   # loaded again, resident
        m.unload()
    with pytest.raises(Error, match="closed"):
        m(x=x)
