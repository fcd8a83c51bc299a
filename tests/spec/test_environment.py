"""The registry of environment variables (spec/environment.py) is complete and current: every
MLPACK_* variable the source reads (Python and the C engine) is in it, everything in it is read
somewhere, the pass names it lists are the passes that exist, and the help and the docs list
them all."""

from __future__ import annotations

import pathlib
import re

import pytest

from mlpack.spec import environment

ROOT = pathlib.Path(__file__).resolve().parents[2]
FOLDERS = ("spec", "codegen", "packager", "runtime", "mlpack", "benchmarks", "tests")
READ = re.compile(r"""(?:environ\.get|environ\[|getenv|environment\.get|setenv)\(?\s*["'](MLPACK_\w+)["']""")


def _sources():
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*"):
            parts = path.relative_to(ROOT).parts
            if path.suffix in (".py", ".c", ".h") and "build" not in parts and path.name != "test_environment.py":
                yield path


def _reads() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in _sources():
        text = path.read_text(errors="replace")
        for name in READ.findall(text):
            found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
        # a name held in a constant first (mlpack/backend.py's ENV_MODE)
        for name in re.findall(r"""^\w+ = ["'](MLPACK_[A-Z_]+)["']""", text, re.M):
            found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_variable_read_is_registered_and_every_registered_one_is_read():
    reads = _reads()
    missing = {n: sorted(where) for n, where in reads.items() if n not in environment.VARIABLES}
    assert not missing, f"read but not in spec/environment.py: {missing}"
    unread = set(environment.VARIABLES) - set(reads)
    assert not unread, f"in spec/environment.py but read nowhere: {sorted(unread)}"


def test_get_refuses_an_unregistered_name(monkeypatch):
    monkeypatch.setenv("MLPACK_DEBUG", "2")
    assert environment.get("MLPACK_DEBUG") == "2"
    with pytest.raises(KeyError, match="MLPACK_WINOGRAD is not in spec/environment.py"):
        environment.get("MLPACK_WINOGRAD")


def test_the_pass_names_listed_are_the_passes():
    from mlpack.codegen.passes.pipeline import PASSES
    from mlpack.codegen.targets.cpu.compile import _Rewritten, target_passes

    names = {n for n, _ in PASSES} | {n for n, _ in target_passes(_Rewritten())}
    listed = environment.VARIABLES["MLPACK_DISABLE_PASSES"].meaning
    assert set(re.findall(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)*\b", listed)) >= names
    for name in names:
        assert re.search(rf"\b{name}\b", listed), name


def test_help_and_docs_list_every_variable():
    from support import cli

    text = cli("--help").output
    docs = (ROOT / "docs" / "errors-and-debugging.md").read_text()
    for v in environment.VARIABLES.values():
        assert f"`{v.name}`" in docs, v.name
        if v.reader in ("compiler", "runtime", "engine"):
            assert f"{v.name}: " in text, v.name
