"""Every failure on a broken file is one line and exit code 2 in the CLI, and an mlpack error in
``mlpack.load``: never a traceback, an ``internal error`` or a Python built-in exception.

The files: the conformance corpus's broken containers (spec/conformance), and containers broken
past what the container reader checks, each rewritten with every digest recomputed
(container_edits.py) so the fault itself must be found: portable programs nested deeper than the
readers' 512 levels (1,200 levels, past Python's recursion limit; and 600, which Python's json
module alone would accept while the C reader refuses), a program that is no JSON or not a
program, a weights archive whose header nests too deeply, a cpu plan with a binding removed or a
weight bound where a kernel writes (kernel ABI 1.3), a truncated file and a flipped code byte.

For each: ``mlpack validate`` and ``mlpack run`` print exactly one line, ``error: ...``, on
stderr and exit 2; ``mlpack inspect`` does too, or shows the file when what is broken lies
beyond what it reads (a program, a plan); ``mlpack.load`` raises a FormatError, through the C
engine and, for the portable ones, through Python's own reader.
"""

from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest
from container_edits import nested, rewrite
from runtime_helpers import TINY, artifact
from support import cli

import mlpack
from mlpack.runtime import detect_host, engine
from mlpack.spec import container as c
from mlpack.spec import media
from mlpack.spec.errors import Error, FormatError
from mlpack.spec.ir import parse_graph
from mlpack.spec.tensorfile import MAGIC

CORPUS = os.path.join(os.path.dirname(os.path.abspath(c.__file__)), "conformance")
with open(os.path.join(CORPUS, "expected.json")) as _f:
    CONFORMANCE = sorted(n for n, v in json.load(_f).items() if v["verdict"] == "error")
MLP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models", "mlp.onnx")
NATIVE = engine.available() and detect_host().arch == "amd64"


def _deep_program(depth: int):
    """A layer edit nesting the program's first op body ``depth`` Adds deep."""
    def edit(i, media_type, data):
        if media_type != media.PROGRAM_PORTABLE:
            return data
        doc = json.loads(data)
        body = json.dumps(doc["ops"][0]["body"]).encode()
        doc["ops"][0]["body"] = "@BODY@"
        deep = b'["add",' * depth + body + b',["c",0.0,"f32"]]' * depth
        return json.dumps(doc).encode().replace(b'"@BODY@"', deep)
    return edit


def _program(raw: bytes):
    return lambda i, media_type, data: raw if media_type == media.PROGRAM_PORTABLE else data


def _deep_weights_header(i, media_type, data):
    if media_type != media.WEIGHTS:
        return data
    (hlen,) = struct.unpack("<Q", data[len(MAGIC):len(MAGIC) + 8])
    header = data[len(MAGIC) + 8:len(MAGIC) + 8 + hlen]
    header = header[:-1] + b',"x-nested":' + nested(b"0", 1000) + b"}"
    return MAGIC + struct.pack("<Q", len(header)) + header + data[len(MAGIC) + 8 + hlen:]


# portable-only containers of runtime_helpers' tiny model: name -> layer edit
PORTABLE = {
    "program_nested_1200": _deep_program(1200),
    "program_nested_600": _deep_program(600),
    "program_not_json": _program(b'{"program": "mlpack.portable", "ops": [1, 2'),
    "program_not_a_program": _program(b'{"program": "mlpack.portable", "version": [1, 0]}'),
    "weights_header_nested": _deep_weights_header,
}
# the mlp model built for x86-64 v2: name -> plan edit of its cpu artifact (1)
PLANS = {
    "plan_missing_binding": lambda plan: plan["dispatches"][1]["bindings"].pop(),
    "plan_weight_written": lambda plan: plan["dispatches"][0]["bindings"].__setitem__(
        0, next(j for j, b in enumerate(plan["buffers"]) if b["kind"] == "weight")),
}
# what must be refused at load: (stem, file), messages they must contain
MESSAGES = {
    "program_nested_1200": "portable program) is not valid JSON: nested too deeply at byte",
    "program_nested_600": "portable program) is not valid JSON: nested too deeply at byte",
    "plan_missing_binding": "plan dispatch 1 binds 3 buffers, but its kernel 1",
    "plan_weight_written": "plan dispatch 0 binding 0 is buffer",
}


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    """Name -> path of every broken file of this module."""
    out = tmp_path_factory.mktemp("broken")
    files = {name: os.path.join(CORPUS, name) for name in CONFORMANCE}
    good = out / "tiny.mlpack"
    g = parse_graph(TINY)
    c.write_container(good, g.name, [artifact(g, cases=[{"x": np.ones((2, 4), np.float32)}])])
    for name, edit in PORTABLE.items():
        files[name] = out / f"{name}.mlpack"
        rewrite(good, files[name], layer=edit)
    if NATIVE:
        build = pytest.importorskip("mlpack.packager.build").build
        mlp = out / "mlp.mlpack"
        build(MLP, mlp, targets=["x86_64-v2"])
        for name, edit in PLANS.items():
            files[name] = out / f"{name}.mlpack"
            rewrite(mlp, files[name], config=lambda i, doc, edit=edit: edit(doc["plan"]) if i == 1 else None)
        data = mlp.read_bytes()
        files["truncated"] = out / "truncated.mlpack"
        files["truncated"].write_bytes(data[:len(data) // 2 + 100])
        with c.open_container(mlp) as box:
            elf = box.artifacts[1].layer(media.CODE_ELF)
        flipped = bytearray(data)
        flipped[elf.offset + elf.size // 2] ^= 0x01
        files["code_byte_flipped"] = out / "code_byte_flipped.mlpack"
        files["code_byte_flipped"].write_bytes(bytes(flipped))
    return files


NAMES = CONFORMANCE + list(PORTABLE) + list(PLANS) + ["truncated", "code_byte_flipped"]


def _path(broken, name):
    if name not in broken:
        pytest.skip("needs libmlpack on an x86-64 host (a native artifact)")
    return broken[name]


def _one_error_line(result, name):
    assert "Traceback" not in result.output and "internal error" not in result.output, result.output
    assert result.exit_code == 2, f"{name}: exit {result.exit_code}: {result.output}"
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), f"{name}: {result.stderr!r}"
    return lines[0]


@pytest.mark.parametrize("name", NAMES)
def test_validate_is_one_error_line_exit_2(broken, name):
    line = _one_error_line(cli("validate", _path(broken, name)), name)
    if name in MESSAGES:
        assert MESSAGES[name] in line


@pytest.mark.parametrize("name", NAMES)
def test_run_is_one_error_line_exit_2(broken, name, tmp_path):
    _one_error_line(cli("run", _path(broken, name), "--output", tmp_path / "out"), name)


@pytest.mark.parametrize("name", NAMES)
def test_inspect_shows_the_file_or_is_one_error_line(broken, name):
    result = cli("inspect", _path(broken, name), "--host")
    if name in CONFORMANCE or name in ("truncated", "code_byte_flipped"):
        _one_error_line(result, name)   # the container itself is broken
    else:   # inspect reads no program and loads no code: what is broken lies beyond it
        assert result.exit_code == 0 and "Traceback" not in result.output, result.output


@pytest.mark.parametrize("name", NAMES)
def test_load_raises_a_format_error(broken, name):
    path = _path(broken, name)
    with pytest.raises(Error) as info:
        mlpack.load(path).close()
    assert isinstance(info.value, FormatError), repr(info.value)
    if name in MESSAGES:
        assert MESSAGES[name] in str(info.value)


@pytest.mark.parametrize("name", CONFORMANCE + list(PORTABLE))
def test_load_without_the_engine_raises_a_format_error(broken, name, monkeypatch):
    """Python's own reader (no libmlpack): the same files, the same kind of error."""
    monkeypatch.setattr(engine, "available", lambda: False)
    with pytest.raises(FormatError) as info:
        mlpack.load(broken[name], device="portable").close()
    if name.startswith("program_nested"):
        assert "portable program is not valid JSON: nested too deeply at byte" in str(info.value)
        assert os.path.basename(str(broken[name])) in str(info.value)


@pytest.mark.parametrize("name", list(PORTABLE))
def test_validate_without_the_engine_is_one_error_line_exit_2(broken, name, monkeypatch):
    """Where Python decodes the program itself (no libmlpack): a program nested 1,200 levels
    once made validate print ``internal error: RecursionError``."""
    monkeypatch.setattr(engine, "available", lambda: False)
    _one_error_line(cli("validate", broken[name]), name)


def test_an_annotation_nested_too_deeply_is_no_number_in_either_selection(tmp_path, monkeypatch):
    """A max_error annotation nested 3,000 levels deep is no number (as select.c reads it), not a
    RecursionError in Python's selection."""
    from mlpack.spec.errors import NoRunnableArtifactError

    g = parse_graph(TINY)
    art = artifact(g)
    art.annotations[media.ANN_MAX_ERROR] = nested(b"", 3000).decode()
    path = tmp_path / "annotation.mlpack"
    c.write_container(path, g.name, [art])
    for available in (engine.available(), False):
        monkeypatch.setattr(engine, "available", lambda available=available: available)
        with pytest.raises(NoRunnableArtifactError, match="records no measured error"):
            mlpack.load(path, accuracy_budget=0.1)


def test_the_nesting_limit_is_the_c_readers(broken):
    """Both readers refuse program_nested_600 at the same byte (Python's json module alone
    would parse it); a program nested just within the limit loads in both and runs."""
    from mlpack.spec import jsondepth
    from mlpack.spec.ir.program import decode_program

    with c.open_container(broken["program_nested_600"]) as box:
        code = box.artifacts[0].layer(media.PROGRAM_PORTABLE)
        raw = bytes(box.blob(code.digest))
    json.loads(raw)   # well-formed
    where = jsondepth.too_deep(raw)
    with pytest.raises(FormatError, match=f"nested too deeply at byte {where}$"):
        decode_program(raw, {})
    if engine.available():
        with pytest.raises(FormatError, match=f"nested too deeply at byte {where}$"):
            mlpack.load(broken["program_nested_600"]).close()


def test_a_program_nested_just_within_the_limit_runs(tmp_path):
    """504 Adds put the innermost value at depth 512: both readers accept it, and Python's
    decoder, verifier and interpreter, which recurse per level, run it."""
    g = parse_graph(TINY)
    good = tmp_path / "tiny.mlpack"
    c.write_container(good, g.name, [artifact(g)])
    deep = tmp_path / "deep.mlpack"
    rewrite(good, deep, layer=_deep_program(504))
    x = np.ones((2, 4), np.float32)
    with mlpack.load(deep) as m:
        np.testing.assert_allclose(m(x=x)["y"], x + np.arange(4, dtype=np.float32))
    over = tmp_path / "over.mlpack"
    rewrite(good, over, layer=_deep_program(505))
    with pytest.raises(FormatError, match="nested too deeply"):
        mlpack.load(over)

