"""The C engine's media types and annotation keys are spec/media.py's, spelled once.

spec/media.py is the single source of the container's vocabulary; libmlpack keeps the strings it
matches on in one header, runtime/c/src/media.h. This checks that every ``MP_<NAME>`` string there
is ``<NAME>`` of spec/media.py, that ``MP_CODE_MEDIA_TYPES`` is ``CODE_MEDIA_TYPES`` (in order: the
engine must know every code format the spec names, to pass over the ones it cannot run with a
reason as runtime/select.py does), that ``MP_DEVICES`` and ``MP_PRECISIONS`` are its word
lists, and that no other engine source spells a media type or an annotation key as a string of
its own. The last test shows each check catching a drift.
"""

from __future__ import annotations

import re
from pathlib import Path

from mlpack.spec import media

CDIR = Path(__file__).resolve().parents[2] / "runtime" / "c"
HEADER = CDIR / "src" / "media.h"

_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_DEFINE = re.compile(r"^#define[ \t]+MP_(\w+)[ \t]+(.+?)[ \t]*$", re.M)
_STRING = re.compile(r'^"([^"\\]*)"$')
# a string that only the container's vocabulary has: a media type or an annotation key
# the word lists of the selection options, as comma-separated strings
WORD_LISTS = ("DEVICES", "PRECISIONS")
_VOCABULARY = re.compile(r'"((?:application/vnd\.|org\.mlpack\.|org\.opencontainers\.)[^"]*)"')


def _code(text: str) -> str:
    return _COMMENT.sub(" ", text)


def header_defines(text: str) -> dict[str, str]:
    """NAME (without MP_) -> the macro's text, for every #define of a header's text."""
    return dict(_DEFINE.findall(_code(text)))


def header_mismatches(text: str) -> list[str]:
    """How media.h's text disagrees with spec/media.py; empty when it agrees."""
    defines = header_defines(text)
    problems = []
    strings = {}
    for name, value in defines.items():
        m = _STRING.match(value)
        if m:
            strings[name] = m.group(1)
    for name, value in strings.items():
        if not hasattr(media, name):
            problems.append(f"MP_{name}: spec/media.py has no {name}")
        elif getattr(media, name) != value:
            problems.append(f"MP_{name} is {value!r}, spec/media.py's {name} is {getattr(media, name)!r}")
    listed = defines.get("CODE_MEDIA_TYPES")
    if listed is None:
        problems.append("media.h defines no MP_CODE_MEDIA_TYPES")
    else:
        names = [n.strip() for n in listed.split(",")]
        unknown = [n for n in names if not n.startswith("MP_") or n[3:] not in strings]
        if unknown:
            problems.append(f"MP_CODE_MEDIA_TYPES names {unknown}, which are not strings of media.h")
        else:
            codes = tuple(strings[n[3:]] for n in names)
            if codes != media.CODE_MEDIA_TYPES:
                problems.append(f"MP_CODE_MEDIA_TYPES is {codes}, spec/media.py's CODE_MEDIA_TYPES is "
                                f"{media.CODE_MEDIA_TYPES}")
    for name in WORD_LISTS:
        words = tuple(re.findall(r'"([^"]*)"', defines.get(name, "")))
        if words != getattr(media, name):
            problems.append(f"MP_{name} is {words}, spec/media.py's {name} is {getattr(media, name)}")
    return problems


def other_copies(sources: dict[str, str]) -> list[str]:
    """Media types and annotation keys spelled outside media.h: 'file: string' for each."""
    return [f"{name}: {s}" for name, text in sources.items() if name != "media.h"
            for s in _VOCABULARY.findall(_code(text))]


def _engine_sources() -> dict[str, str]:
    files = sorted([*(CDIR / "src").glob("*.[ch]"), *(CDIR / "include").glob("*.h")])
    return {p.name: p.read_text() for p in files}


def test_media_h_agrees_with_spec():
    text = HEADER.read_text()
    strings = [n for n, v in header_defines(text).items() if _STRING.match(v)]
    # what the engine reads today: a parser that found nothing would agree with anything
    assert {"OCI_INDEX", "CONFIG", "PROGRAM_PORTABLE", "CODE_ELF", "WEIGHTS", "ANN_DEVICE"} <= set(strings)
    assert header_mismatches(text) == []


def test_no_other_engine_source_spells_the_vocabulary():
    sources = _engine_sources()
    assert "select.c" in sources and "container.c" in sources
    assert other_copies(sources) == []


def test_the_checks_catch_a_drift():
    text = HEADER.read_text()
    elf = f'"{media.CODE_ELF}"'
    assert elf in text
    drifted = text.replace(elf, '"application/vnd.mlpack.code.elf.v2"')
    assert any(p.startswith("MP_CODE_ELF is") for p in header_mismatches(drifted))
    assert any(p.startswith("MP_CODE_MEDIA_TYPES is") for p in header_mismatches(drifted))
    dropped = text.replace(", MP_CODE_CUBIN", "")
    assert any(p.startswith("MP_CODE_MEDIA_TYPES is") for p in header_mismatches(dropped))
    invented = text + '\n#define MP_CODE_SPIRV "application/vnd.mlpack.code.spirv.v1"\n'
    assert "MP_CODE_SPIRV: spec/media.py has no CODE_SPIRV" in header_mismatches(invented)
    fewer = text.replace(', "int8"', "")
    assert any(p.startswith("MP_PRECISIONS is") for p in header_mismatches(fewer))
    copied = {"media.h": text, "select.c": f'#define ELF {elf}\n/* {elf} in a comment is fine */\n'}
    assert other_copies(copied) == [f"select.c: {media.CODE_ELF}"]
