"""spec/jsondepth.py: the Python readers refuse JSON nested past 512 levels where json.c does,
at the byte json.c names, and never let Python's RecursionError out.

Depth counts as json.c counts it: the document's value at 0, an array's items and an object's
values one deeper (keys are no values). The conformance corpus (ok_json_nested_512,
err_json_nested_513, err_index_json_nested) holds both readers to the same verdicts; here, the
boundary cases, strings that hold brackets and quotes, the offsets, and each reader's error.
"""

from __future__ import annotations

import json
import struct

import pytest

from mlpack.spec import jsondepth
from mlpack.spec.container import parse_json
from mlpack.spec.errors import FormatError, ManifestError
from mlpack.spec.ir.program import decode_program
from mlpack.spec.tensorfile import MAGIC, read_header

LIMIT = jsondepth.MAX_DEPTH


def arrays(n: int, inner: str = "") -> bytes:
    return ("[" * n + inner + "]" * n).encode()


STRING = b'"\\"' + b"]" * 2000 + b'", '   # a string of 2,000 ']' after an escaped quote: text
CASES = {
    "empty array at 512": (arrays(LIMIT + 1), None),
    "number at 512": (arrays(LIMIT, "0"), None),
    "number at 513": (arrays(LIMIT + 1, "0"), LIMIT + 1),   # json.c stands just before it
    "array at 513": (arrays(LIMIT + 2), LIMIT + 1),
    "100,000 levels": (arrays(100_000), LIMIT + 1),
    "objects, value at 512": (b'{"a":' * LIMIT + b"0" + b"}" * LIMIT, None),
    "objects, value at 513": (b'{"a":' * (LIMIT + 1) + b"0" + b"}" * (LIMIT + 1), 5 * (LIMIT + 1)),
    # json.c skips the space before an array's first item, not the one after a ','
    "space after [": (b"[ " * (LIMIT + 1) + b"0" + b"]" * (LIMIT + 1), 2 * (LIMIT + 1)),
    "space after ,": (b"[1, " * (LIMIT + 1) + b"0" + b"]" * (LIMIT + 1), 4 * LIMIT + 1),
    "brackets in strings": (b'["' + b"[" * 2000 + b'", "\\"[[", ' + arrays(LIMIT) + b"]", None),
    "escaped quote, at 512": (b"[" + STRING + arrays(LIMIT - 1, "0") + b"]", None),
    "escaped quote, at 513": (b"[" + STRING + arrays(LIMIT + 1) + b"]", 1 + len(STRING) + LIMIT),
}


@pytest.mark.parametrize("doc, where", list(CASES.values()), ids=list(CASES))
def test_depth_and_offset_are_json_c_s(doc, where):
    assert jsondepth.too_deep(doc) == where


def test_a_large_shallow_document_passes_quickly():
    doc = json.dumps([{"body": ["add", ["r", "x", ["a"], [1, 2], 0], [1.0, "f32"]]}] * 50_000).encode()
    assert jsondepth.too_deep(doc) is None
    deep = doc[:-1] + b"," + arrays(LIMIT + 1) + b"]"
    assert jsondepth.too_deep(deep) == len(doc) + LIMIT


def test_each_reader_refuses_with_its_error_naming_the_byte():
    deep = b'{"x":' + arrays(2000) + b"}"
    at = jsondepth.too_deep(deep)
    with pytest.raises(ManifestError, match=f"^f: config is not valid JSON: nested too deeply at byte {at}$"):
        parse_json(deep, "f: config")
    with pytest.raises(FormatError, match=f"^portable program is not valid JSON: nested too deeply at byte {at}$"):
        decode_program(deep, {})
    archive = MAGIC + struct.pack("<Q", len(deep)) + deep
    with pytest.raises(FormatError, match=f"tensor archive header is not valid JSON: nested too deeply at byte {at}"):
        read_header(archive)
