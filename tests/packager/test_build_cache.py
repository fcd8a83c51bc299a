"""The kernel cache (packager/cache.py): a rebuild reuses the model's compiled graph, each
target's compiled code, the model's weights archive, its test vectors and the outputs of each
artifact's vectors (native, portable and emulated runs), the container's bytes are the same either way, and a damaged entry
is compiled again, never trusted. The cheapest native target (x86_64-v2, which every x86-64 host
runs) and the portable one keep it fast; no test depends on the host's vector unit."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import warnings

import pytest

from mlpack.packager import build as build_mod
from mlpack.packager import cache as cache_mod
from mlpack.packager.build import build

pytest.importorskip("onnxruntime")
MLP = os.path.join(os.path.dirname(os.path.dirname(__file__)), "models", "mlp.onnx")
TARGETS = ["x86_64-v2"]


def _build(out, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build(MLP, out, targets=TARGETS, **kw)


def _sha(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@pytest.fixture
def compiles(monkeypatch):
    """The (target, precision) pairs the build compiles, in order (not those it reuses)."""
    seen, real = [], build_mod._compile_one

    def counting(graph, target, precision="fp32", *args, **kw):
        seen.append((target, precision))
        return real(graph, target, precision, *args, **kw)

    monkeypatch.setattr(build_mod, "_compile_one", counting)
    return seen


def test_warm_rebuild_same_bytes_no_compile(tmp_path, compiles):
    cold = _build(tmp_path / "cold.mlpack", cache=tmp_path / "k")
    assert sorted(compiles) == [("portable", "fp32"), ("x86_64-v2", "fp32")]
    assert cold.cache["hits"] == 0 and cold.cache["misses"] == 2
    compiles.clear()
    warm = _build(tmp_path / "warm.mlpack", cache=tmp_path / "k")
    assert compiles == []   # the compiler is not called for a cached unit
    assert warm.cache == {**cold.cache, "hits": 2, "misses": 0}
    none = _build(tmp_path / "none.mlpack", cache=False)
    assert _sha(tmp_path / "cold.mlpack") == _sha(tmp_path / "warm.mlpack") \
        == _sha(tmp_path / "none.mlpack")
    assert none.cache == {}


def test_warm_rebuild_runs_no_reference_and_no_artifact(tmp_path, monkeypatch):
    """A rebuild of the same model reads back its test vectors (ONNX Runtime's outputs and the
    float64 reference's) and the outputs of each artifact's vectors, and judges those again:
    neither reference nor any artifact runs; damaged, both are computed again."""
    from mlpack.packager import customops, reference
    from mlpack.runtime.model import Model

    cold = _build(tmp_path / "cold.mlpack", cache=tmp_path / "k")
    assert all(a.validated for a in cold.artifacts)

    def never(*args, **kw):
        raise AssertionError("ran again")
    with monkeypatch.context() as m:
        for owner, name in ((customops, "baseline_outputs"), (reference, "float64_outputs"),
                            (Model, "vector_outputs")):
            m.setattr(owner, name, never)
        warm = _build(tmp_path / "warm.mlpack", cache=tmp_path / "k")
    assert all(a.validated for a in warm.artifacts)
    assert [a.max_error for a in warm.artifacts] == [a.max_error for a in cold.artifacts]
    assert _sha(tmp_path / "cold.mlpack") == _sha(tmp_path / "warm.mlpack")
    for kind in ("vectors", "runs"):   # damaged: dropped, computed again, the same bytes
        for path in (tmp_path / "k" / kind).iterdir():
            path.write_bytes(path.read_bytes()[:-1] + b"x")
    again = _build(tmp_path / "again.mlpack", cache=tmp_path / "k")
    assert again.cache["dropped"] == 3   # the vectors and the two artifacts' outputs
    assert _sha(tmp_path / "cold.mlpack") == _sha(tmp_path / "again.mlpack")


def test_warm_rebuild_reuses_the_compiled_graph(tmp_path, monkeypatch):
    """A rebuild of an unchanged model takes its compiled graph from the cache (graphs/): the
    ONNX import and the graph passes do not run, and the container's bytes are the same. A
    changed weight, another memory budget or a damaged entry compiles the model again."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    imports, real = [], build_mod._compile
    monkeypatch.setattr(build_mod, "_compile", lambda proto: imports.append(1) or real(proto))
    folder = tmp_path / "k"
    _build(tmp_path / "cold.mlpack", cache=folder)
    assert len(imports) == 1 and len(list((folder / "graphs").iterdir())) == 1
    _build(tmp_path / "warm.mlpack", cache=folder)
    assert len(imports) == 1
    assert _sha(tmp_path / "cold.mlpack") == _sha(tmp_path / "warm.mlpack")
    _build(tmp_path / "budget.mlpack", cache=folder, memory_budget="1MB")
    assert len(imports) == 2
    model = onnx.load(MLP)   # one weight changed: another graph, another container
    w = model.graph.initializer[0]
    w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w) + np.float32(1), w.name))
    changed = tmp_path / "changed.onnx"
    onnx.save(model, str(changed))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        build(str(changed), tmp_path / "changed.mlpack", targets=TARGETS, cache=folder)
    assert len(imports) == 3
    assert _sha(tmp_path / "changed.mlpack") != _sha(tmp_path / "cold.mlpack")
    for path in (folder / "graphs").iterdir():   # damaged: dropped, compiled again
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x40
        path.write_bytes(bytes(data))
    again = _build(tmp_path / "again.mlpack", cache=folder)
    assert len(imports) == 4 and again.cache["dropped"] == 1
    assert _sha(tmp_path / "again.mlpack") == _sha(tmp_path / "cold.mlpack")


def test_rebuild_checks_its_archive_beside_the_file_hash(tmp_path, monkeypatch):
    """A build of a model file leaves a hint of the weights archive it used (hints/); a
    rebuild of the unchanged file checks that archive in a thread while it hashes the file,
    and hashes the archive once. A changed file starts no check; a wrong or damaged hint
    costs nothing but the check: the same container either way."""
    import json
    import shutil

    from mlpack.packager import weights

    model = tmp_path / "mlp.onnx"
    shutil.copyfile(MLP, model)
    folder = tmp_path / "k"

    def rebuild(name):
        weights._CHECKED.clear()   # (as a new process finds it)
        weights._AHEAD.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            build(str(model), tmp_path / name, targets=TARGETS, cache=folder)
        return tmp_path / name

    cold = rebuild("cold.mlpack")
    (hint,) = (folder / "hints").iterdir()
    doc = json.loads(hint.read_text())
    archive = folder / "blobs" / doc["digest"].split(":", 1)[1]
    assert archive.stat().st_size == doc["size"]

    started, hashed = [], []
    real_ahead, real_sha = weights.check_ahead, hashlib.sha256
    monkeypatch.setattr(weights, "check_ahead", lambda *a: started.append(a) or real_ahead(*a))
    monkeypatch.setattr(weights, "hashlib", type("counting", (), {
        "sha256": staticmethod(lambda *a: hashed.append(1) or real_sha(*a))}))
    warm = rebuild("warm.mlpack")
    assert started == [(folder / "blobs", doc["digest"], doc["size"])]
    assert len(hashed) == 1   # the thread's check; the graph's lookup waited for it
    assert _sha(warm) == _sha(cold)

    started.clear()
    os.utime(model, ns=(1, 1))   # changed as far as its stamp tells: no check ahead
    assert _sha(rebuild("touched.mlpack")) == _sha(cold) and started == []
    for bad in ({**doc, "digest": "sha256:" + "0" * 64},          # a wrong archive
                {**doc, "digest": "sha256:../../" + doc["digest"]},  # not a blob's name
                {**doc, "digest": "nocolon"},
                None):                                                # a damaged hint
        if bad is None:
            hint.write_bytes(b"{not json")
        else:
            bad["file"] = cache_mod.KernelCache._stamp(model)
            hint.write_text(json.dumps(bad))
        assert _sha(rebuild("hinted.mlpack")) == _sha(cold)
        assert json.loads(hint.read_text())["digest"] == doc["digest"]   # written right again


@pytest.mark.parametrize("damage", ["blob", "entry", "truncate"])
def test_corrupt_entry_is_compiled_again(tmp_path, compiles, damage):
    folder = tmp_path / "k"
    _build(tmp_path / "a.mlpack", cache=folder)
    if damage == "blob":   # every blob: the ELF and the weights archive among them
        victims = sorted((folder / "blobs").iterdir())
    else:
        victims = sorted((folder / "entries").iterdir())
    for path in victims:
        data = bytearray(path.read_bytes())
        if damage == "truncate":
            data = data[:len(data) // 2]
        else:
            data[len(data) // 2] ^= 0x40
        path.write_bytes(bytes(data))
    compiles.clear()
    report = _build(tmp_path / "b.mlpack", cache=folder)
    assert sorted(compiles) == [("portable", "fp32"), ("x86_64-v2", "fp32")]
    # two entries dropped, and with the blobs damaged the model's weights archive too
    assert report.cache["dropped"] == (3 if damage == "blob" else 2)
    assert report.cache["hits"] == 0
    assert _sha(tmp_path / "a.mlpack") == _sha(tmp_path / "b.mlpack")
    compiles.clear()   # and the entries written anew are whole again
    assert _build(tmp_path / "c.mlpack", cache=folder).cache["hits"] == 2 and compiles == []


def test_env_var_names_the_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("MLPACK_CACHE_DIR", str(tmp_path / "env"))
    assert cache_mod.default_folder() == tmp_path / "env"
    report = _build(tmp_path / "a.mlpack")
    assert report.cache["folder"] == str(tmp_path / "env")
    assert len(list((tmp_path / "env" / "entries").iterdir())) == 2
    monkeypatch.delenv("MLPACK_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_mod.default_folder() == tmp_path / "xdg" / "mlpack" / "kernels"


def test_cli_no_cache(tmp_path, monkeypatch):
    folder = tmp_path / "k"
    env = dict(os.environ, MLPACK_CACHE_DIR=str(folder))
    cmd = [sys.executable, "-m", "mlpack.packager.cli", "build", MLP, "-o",
           str(tmp_path / "a.mlpack"), "-t", "x86_64-v2"]
    proc = subprocess.run(cmd + ["--no-cache"], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert not folder.exists()
    assert proc.stderr == ""   # not a terminal: no progress lines
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert proc.returncode == 0 and "kernel cache" not in proc.stdout
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert "2 of 2 artifacts' code from the kernel cache" in proc.stdout, proc.stdout


def test_concurrent_builds_share_one_folder(tmp_path):
    """Two builds at once into one cache folder: both write whole entries (temporary file and
    rename), both containers are the same, and a third build reuses everything."""
    env = dict(os.environ, MLPACK_CACHE_DIR=str(tmp_path / "k"))
    script = ("import sys, warnings; warnings.simplefilter('ignore'); "
              "from mlpack.packager.build import build; "
              f"build({MLP!r}, sys.argv[1], targets={TARGETS!r})")
    procs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path / f"{i}.mlpack")],
                              env=env, stderr=subprocess.PIPE) for i in range(2)]
    for p in procs:
        assert p.wait() == 0, p.stderr.read().decode()
    assert _sha(tmp_path / "0.mlpack") == _sha(tmp_path / "1.mlpack")
    assert not [p for p in (tmp_path / "k").rglob("*.tmp")]   # no half-written file is left
    report = _build(tmp_path / "2.mlpack", cache=tmp_path / "k")
    assert report.cache["hits"] == 2 and report.cache["dropped"] == 0


def test_key_covers_what_makes_the_bytes(monkeypatch):
    base = cache_mod.key("g", "x86_64-v2", "fp32")
    assert len({base, cache_mod.key("h", "x86_64-v2", "fp32"),
                cache_mod.key("g", "x86_64-v3", "fp32"), cache_mod.key("g", "x86_64-v2", "int8"),
                cache_mod.key("g", "x86_64-v2", "fp32", frozenset({"winograd"})),
                cache_mod.key("g", "x86_64-v2", "fp32", calibration={"x": (0.0, 1.0)})}) == 6
    monkeypatch.setenv("MLPACK_DISABLE_PASSES", "winograd")
    assert cache_mod.key("g", "x86_64-v2", "fp32") != base
    monkeypatch.setattr(cache_mod, "_SOURCES", "an edited compiler")
    monkeypatch.delenv("MLPACK_DISABLE_PASSES")
    assert cache_mod.key("g", "x86_64-v2", "fp32") != base


def test_model_key_covers_the_whole_model(monkeypatch):
    import onnx

    model = onnx.load(MLP)
    base = cache_mod.model_key(model, None)
    assert cache_mod.model_key(onnx.load(MLP), None) == base
    assert cache_mod.model_key(model, 1 << 20) != base
    monkeypatch.setenv("MLPACK_DISABLE_PASSES", "cse")
    assert cache_mod.model_key(model, None) != base
    monkeypatch.delenv("MLPACK_DISABLE_PASSES")
    raw = bytearray(model.graph.initializer[0].raw_data)
    raw[0] ^= 1
    model.graph.initializer[0].raw_data = bytes(raw)
    assert cache_mod.model_key(model, None) != base


def test_emulated_outputs_round_trip(tmp_path):
    import numpy as np

    store = cache_mod.KernelCache(tmp_path)
    got = [{"y": np.arange(6, dtype=np.float32).reshape(2, 3)}, {"y": np.ones(3, np.float32)}]
    store.put_outputs("k1", got)
    back = store.get_outputs("k1")
    assert [list(c) for c in back] == [["y"], ["y"]]
    assert np.array_equal(back[0]["y"], got[0]["y"]) and back[1]["y"].shape == (3,)
    assert store.get_run("k1")[1] is None
    store.put_outputs("k3", got, (0.25, 0.05, 0.125))   # a native run's: all, then per case
    assert store.get_run("k3")[1] == (0.25, 0.05, 0.125)
    store.put_outputs("k2", "its vectors ran over 10 s under qemu-riscv64")
    assert store.get_outputs("k2") == "its vectors ran over 10 s under qemu-riscv64"
    path = tmp_path / "runs" / "k1"
    path.write_bytes(path.read_bytes()[:-1] + b"!")
    assert store.get_outputs("k1") is None and not path.exists()
    assert store.get_outputs("absent") is None


def test_progress_quiet_when_not_a_terminal(monkeypatch):
    from mlpack.packager import cli

    monkeypatch.setattr(sys, "stderr", io.StringIO())   # not a TTY
    assert cli._progress(False) is None and cli._progress(True) is None


def test_live_line_says_what_compiles(tmp_path):
    """A progress callable with ``status`` (the terminal's) is told what is compiling and how
    far, and the live line is cleared at the end; the lines themselves are unchanged."""
    from mlpack.packager.progress import Terminal

    stream = io.StringIO()
    terminal = Terminal(stream)
    statuses = []
    terminal.status = lambda text, real=terminal.status: (statuses.append(text), real(text))
    _build(tmp_path / "a.mlpack", cache=False, progress=terminal)
    assert any(s.startswith("  compiling: ") for s in statuses), statuses
    assert statuses[-1] == ""
    assert "lower x86_64-v2 fp32..." in stream.getvalue()
