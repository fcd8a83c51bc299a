"""The README's code runs as written, and the transcripts in README.md and docs/ are what the
commands print, so none can drift.

README.md's blocks run in order in one fresh folder (with the checkout's examples/ in it), as a
reader would paste them: ``bash``/``sh`` blocks with bash -euo pipefail, ``python`` blocks with
this Python, ``console`` blocks command by command (``$ `` lines), their output compared with
the lines that follow. Two kinds of line are checked instead of run: ``pip`` commands, which
must be ones this file lists with where they are exercised (.ci/run, tests/runtime/test_wheel.py),
and the test command, which must be .ci/run's. docs/*.md's ``console`` blocks run the same way,
one fresh folder per page.

A transcript is compared with numbers left out (timings, sizes and errors vary with the CPU) and
runs of spaces as one; ``...`` inside a line matches any text, and a line of ``...`` alone any
number of lines, as doctest's ELLIPSIS does.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^```(\w*)\n(.*?)^```[ \t]*$", re.M | re.S)

# pip commands the README gives, and where each is exercised instead of here (a test that pip
# installs into the environment running it would change what the other tests run against)
PIP_COMMANDS = {
    "pip install -e ./runtime -e '.[test]'": ".ci/run",
    "pip wheel --no-deps ./runtime -w dist": "tests/runtime/test_wheel.py",
    "MLPACK_WHEEL_ARCH=aarch64 pip wheel --no-deps ./runtime -w dist": "tests/runtime/test_wheel.py",
    "pip wheel --no-deps . -w dist": "tests/runtime/test_wheel.py",
}


def blocks(path: Path) -> list[tuple[str, str, int]]:
    """(language, code, line) of each fenced block."""
    text = path.read_text()
    return [(m[1], m[2], text.count("\n", 0, m.start()) + 1) for m in FENCE.finditer(text)]


def _ci_test_command() -> str:
    lines = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    return [ln for ln in lines if ln.startswith("python -m pytest")][-1]


def _shell_line(line: str, where: str) -> str:
    """The part of one shell line that runs here (pip and the test command are checked)."""
    parts = [p.strip() for p in re.split(r"\s+&&\s+", line.split(" #")[0].strip())]
    kept = []
    for part in parts:
        if re.match(r"^(\w+=\S+\s+)*pip\s", part):
            assert part in PIP_COMMANDS, f"{where}: `{part}` is run nowhere; add it to PIP_COMMANDS with where"
            assert (ROOT / PIP_COMMANDS[part]).exists()
            if PIP_COMMANDS[part] == ".ci/run":
                ci = (ROOT / ".ci" / "run").read_text()
                wanted = [w for w in shlex.split(part)[2:] if w != "-e"]
                assert all(w.split("[")[0] in ci for w in wanted), f"{where}: .ci/run does not install {part}"
            continue
        if part.startswith("python -m pytest"):
            assert part == _ci_test_command(), f"{where}: the test command is not .ci/run's"
            continue
        kept.append(part)
    return " && ".join(kept)


def _env() -> dict:
    # `python` and `mlpack` are this environment's, as after the README's install
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def _run_shell(script: str, cwd: Path, where: str) -> str:
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{where} failed (exit {proc.returncode}):\n{script}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout + proc.stderr


NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def _normal(line: str) -> str:
    return re.sub(r"\s+", " ", NUMBER.sub("N", line)).strip()


def _matches(expected: list[str], actual: list[str]) -> bool:
    pattern = ""
    for line in expected:
        if line.strip() == "...":
            pattern += r"(?:[^\n]*\n)*?"
        else:
            pattern += ".*".join(re.escape(p) for p in _normal(line).split("...")) + r"\n"
    text = "".join(_normal(a) + "\n" for a in actual if a.strip())
    return re.fullmatch(pattern, text) is not None


def _check_transcript(code: str, cwd: Path, where: str) -> None:
    steps: list[tuple[str, list[str]]] = []
    for line in code.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            assert steps, f"{where}: a transcript starts with a `$ ` command"
            steps[-1][1].append(line)
    for command, expected in steps:
        out = _run_shell(command, cwd, f"{where}: $ {command}")
        actual = out.splitlines()
        assert _matches([e for e in expected if e.strip()], actual), (
            f"{where}: `$ {command}` printed\n{out}\nwhich is not\n" + "\n".join(expected))


def _workdir(tmp_path: Path) -> Path:
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    return tmp_path


def test_readme_blocks_run_as_written(tmp_path):
    work = _workdir(tmp_path)
    ran = 0
    for lang, code, line in blocks(ROOT / "README.md"):
        where = f"README.md line {line}"
        if lang in ("bash", "sh"):
            script = "\n".join(_shell_line(ln, where) for ln in code.splitlines())
            _run_shell(script, work, where)
        elif lang == "python":
            proc = subprocess.run([sys.executable, "-c", code], cwd=work, env=_env(), capture_output=True,
                                  text=True, timeout=900)
            assert proc.returncode == 0, f"{where} failed:\n{proc.stdout}\n{proc.stderr}"
        elif lang == "console":
            _check_transcript(code, work, where)
        else:
            assert lang == "", f"{where}: a ```{lang} block: say bash, sh, python or console, so it runs"
            continue
        ran += 1
    assert ran >= 5


DOC_PAGES = sorted(p for p in (ROOT / "docs").glob("*.md")
                   if any(lang == "console" for lang, _, _ in blocks(p)))


@pytest.mark.parametrize("page", DOC_PAGES, ids=lambda p: p.name)
def test_docs_transcripts_are_what_the_commands_print(page, tmp_path):
    work = _workdir(tmp_path)
    for lang, code, line in blocks(page):
        if lang == "console":
            _check_transcript(code, work, f"docs/{page.name} line {line}")


@pytest.mark.parametrize("expected, actual, ok", [
    (["wrote a (1.0 KiB) in 2.4s"], ["wrote a (63.0 KiB) in 0.3s"], True),
    (["  [1] passed over: ..."], ["  [1] passed over: needs avx512f"], True),
    (["a", "...", "z"], ["a", "b", "c", "z"], True),
    (["a", "z"], ["a", "b", "z"], False),
    (["ok"], ["skipped"], False),
])
def test_transcript_matching(expected, actual, ok):
    assert _matches(expected, actual) is ok
