"""runtime/native.py's ctypes bindings restate runtime/c/include/mlpack.h: they must not drift.

mlpack.h is the single source. A small regex parser reads its structs, enums and prototypes, and
this checks, with nothing compiled or loaded:

- each ctypes Structure (_Options, _TensorInfo, _Tensor, _ArtifactInfo) field by field against
  its struct: the same names, in the same order, of the ctypes type of each C type (a field
  added, dropped, moved or retyped on one side changes the layout under the other);
- the status codes and DTYPES against the mlpack_status and mlpack_dtype enums;
- every function native.py declares (restype, argtypes) against its prototype.

The last test shows the struct check catching a drift.
"""

from __future__ import annotations

import ctypes
import re
import types
from pathlib import Path

import pytest

from mlpack.runtime import native

HEADER = Path(__file__).resolve().parents[2] / "runtime" / "c" / "include" / "mlpack.h"

STRUCTS = {"mlpack_options": native._Options, "mlpack_tensor_info": native._TensorInfo,
           "mlpack_tensor": native._Tensor, "mlpack_artifact_info": native._ArtifactInfo}

# C scalar types and their ctypes (what mlpack.h uses, and a few it might)
_SCALARS = {"int": ctypes.c_int, "unsigned": ctypes.c_uint, "double": ctypes.c_double, "float": ctypes.c_float,
            "size_t": ctypes.c_size_t, "int32_t": ctypes.c_int32, "uint32_t": ctypes.c_uint32,
            "int64_t": ctypes.c_int64, "uint64_t": ctypes.c_uint64, "char": ctypes.c_char}

_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_PREPROCESSOR = re.compile(r"^[ \t]*#[^\n]*", re.M)
_TYPEDEF = re.compile(r"typedef\s+(struct|enum)\s+(\w+)\s*\{(.*?)\}\s*(\w+)\s*;", re.S)
_DECL = re.compile(r"^((?:const\s+)?\w+)((?:[\s*]|const)*?)(\w+)$")
_PROTO = re.compile(r"^(.+?)\b(mlpack_\w+)\s*\(([^()]*)\)$", re.S)


class Header:
    """What mlpack.h declares: structs (name -> [(field, C type)]), enums (name -> {enumerator:
    value}), opaque struct typedefs and prototypes (name -> (return C type, [param C types])). A C
    type is (base, pointer depth), const dropped: ``const char *const *`` is ("char", 2)."""

    def __init__(self, text: str):
        code = _PREPROCESSOR.sub("", _COMMENT.sub(" ", text))
        code = re.sub(r'extern "C" \{|^\s*\}\s*$', "", code, flags=re.M)   # C++'s wrapper
        self.structs: dict[str, list[tuple[str, tuple[str, int]]]] = {}
        self.enums: dict[str, dict[str, int]] = {}
        for kind, tag, body, name in _TYPEDEF.findall(code):
            if kind == "struct":
                self.structs[name] = [_declaration(d) for d in body.split(";") if d.strip()]
            else:
                self.enums[name] = _enumerators(body)
        rest = _TYPEDEF.sub("", code)
        self.opaque = set(re.findall(r"typedef\s+struct\s+\w+\s+(\w+)\s*;", rest))
        self.functions: dict[str, tuple[tuple[str, int], list[tuple[str, int]]]] = {}
        for statement in rest.split(";"):
            m = _PROTO.match(" ".join(statement.split()))
            if m and not m.group(1).startswith("typedef"):
                params = [] if m.group(3).strip() in ("", "void") else \
                    [_declaration(p)[1] for p in m.group(3).split(",")]
                self.functions[m.group(2)] = (_c_type(m.group(1)), params)

    def ctype(self, c_type: tuple[str, int], bound: dict[str, type]):
        """The ctypes type native.py should use for a C type; ``bound``: struct name -> Structure."""
        base, depth = c_type
        if depth == 0:
            if base == "void":
                return None
            if base in self.enums:
                return ctypes.c_int   # C enums are int-sized here; ctypes has no enum type
            if base in bound:
                return bound[base]
            if base in _SCALARS:
                return _SCALARS[base]
            raise ValueError(f"no ctypes type known for C type {base!r}")
        if depth == 1 and base == "char":
            return ctypes.c_char_p
        if depth == 1 and (base == "void" or base in self.opaque):
            return ctypes.c_void_p   # native.py passes opaque handles (model, error) as void *
        return ctypes.POINTER(self.ctype((base, depth - 1), bound))


def _c_type(text: str) -> tuple[str, int]:
    words = [w for w in re.findall(r"\w+", text) if w != "const"]
    if len(words) != 1:
        raise ValueError(f"cannot read the C type {text.strip()!r}")
    return words[0], text.count("*")


def _declaration(text: str) -> tuple[str, tuple[str, int]]:
    """'const char *const *dim_names' -> ('dim_names', ('char', 2))."""
    text = " ".join(text.split())
    m = _DECL.match(text)
    if not m or "[" in text or "(" in text or "," in text:
        raise ValueError(f"cannot read the declaration {text!r} (extend this parser)")
    return m.group(3), _c_type(m.group(1) + m.group(2))


def _enumerators(body: str) -> dict[str, int]:
    out, value = {}, -1
    for item in body.split(","):
        item = item.strip()
        if not item:
            continue
        name, _, given = (s.strip() for s in item.partition("="))
        value = int(given, 0) if given else value + 1
        out[name] = value
    return out


def struct_mismatches(header: Header, c_name: str, cls: type) -> list[str]:
    """How a ctypes Structure differs from mlpack.h's struct c_name; empty when it matches."""
    if c_name not in header.structs:
        return [f"mlpack.h has no struct {c_name}"]
    want = [(name, header.ctype(t, {})) for name, t in header.structs[c_name]]
    have = list(cls._fields_)
    problems = [f"{cls.__name__} field {i}: {h[0]} {getattr(h[1], '__name__', h[1])}, mlpack.h's "
                f"{c_name} has {w[0]} {getattr(w[1], '__name__', w[1])}"
                for i, (h, w) in enumerate(zip(have, want)) if h[0] != w[0] or h[1] is not w[1]]
    if len(have) != len(want):
        problems.append(f"{cls.__name__} has {len(have)} fields, mlpack.h's {c_name} has {len(want)}")
    return problems


@pytest.fixture(scope="module")
def header() -> Header:
    return Header(HEADER.read_text())


def test_the_header_parses(header):
    assert set(STRUCTS) <= set(header.structs)
    assert {"mlpack_status", "mlpack_dtype"} <= set(header.enums)
    assert {"mlpack_model", "mlpack_error"} <= header.opaque
    assert "mlpack_open" in header.functions and "mlpack_run_into" in header.functions


@pytest.mark.parametrize("c_name", sorted(STRUCTS))
def test_struct(header, c_name):
    assert struct_mismatches(header, c_name, STRUCTS[c_name]) == []


def test_status_codes(header):
    codes = {name[len("MLPACK_"):]: v for name, v in header.enums["mlpack_status"].items()}
    assert {name: getattr(native, name, None) for name in codes} == codes


def test_dtypes(header):
    enum = header.enums["mlpack_dtype"]
    names = [n[len("MLPACK_"):].lower() for n in sorted(enum, key=enum.get) if n != "MLPACK_DTYPE_COUNT"]
    assert list(native.DTYPES) == names
    assert enum["MLPACK_DTYPE_COUNT"] == len(native.DTYPES)


def test_function_declarations(header):
    seen: dict[str, types.SimpleNamespace] = {}

    class Library:   # records what _declare sets on each function
        def __getattr__(self, name):
            return seen.setdefault(name, types.SimpleNamespace())

    native._declare(Library())
    assert seen, "native._declare declared nothing"
    for name, fn in seen.items():
        assert name in header.functions, f"native.py declares {name}, which mlpack.h does not"
        ret, params = header.functions[name]
        assert fn.restype is header.ctype(ret, STRUCTS), f"{name}: restype"
        assert list(fn.argtypes) == [header.ctype(p, STRUCTS) for p in params], f"{name}: argtypes"


def test_the_struct_check_catches_a_drift(header):
    text = HEADER.read_text()

    def drifted(old: str, new: str) -> Header:
        assert old in text
        return Header(text.replace(old, new))

    retyped = drifted("  int strict;", "  size_t strict;")
    assert any("strict" in p for p in struct_mismatches(retyped, "mlpack_options", native._Options))
    moved = drifted("  size_t rank;\n  const int64_t *shape;", "  const int64_t *shape;\n  size_t rank;")
    assert len(struct_mismatches(moved, "mlpack_tensor", native._Tensor)) == 2
    added = drifted("  const char *reason;", "  const char *reason;\n  int flags;")
    assert struct_mismatches(added, "mlpack_artifact_info", native._ArtifactInfo) == \
        ["_ArtifactInfo has 8 fields, mlpack.h's mlpack_artifact_info has 9"]
    pointer = drifted("  const int64_t *dims;", "  const int32_t *dims;")
    assert any("dims" in p for p in struct_mismatches(pointer, "mlpack_tensor_info", native._TensorInfo))
