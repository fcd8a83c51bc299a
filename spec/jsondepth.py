"""How deeply a JSON document nests, checked before Python's json module parses it.

The C engine's parser (runtime/c/src/json.c) refuses a value nested more than 512 levels deep
with ``<what> is not valid JSON: nested too deeply at byte N``. Python's json module recurses
without a limit of its own and fails near 1,000 levels with RecursionError, which is no
FormatError and which a reader must never let out. Every Python reader of the format's JSON (the
container's documents, spec/container.py; the portable program, spec/ir/program.py; a tensor
archive's header, spec/tensorfile.py) asks ``too_deep`` first, so both runtimes refuse the same
documents with the same words. The limit also bounds the recursion of what walks the parsed
document afterwards (the program decoder, the verifier, the interpreter).

Depth is counted as json.c counts it: the document's value is at depth 0, the items of an array
or the values of an object at depth d are at d + 1 (an object's keys are no values), and a value
at a depth over MAX_DEPTH is refused. ``N`` is where json.c stands when it refuses: just after
the ',' or ':' before the value, or after '[' and the whitespace that follows it.
"""

from __future__ import annotations

import re

MAX_DEPTH = 512

# a whole string, escapes included (unrolled: no backtracking per character)
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_SPACE = b" \t\r\n"
_SCALAR_END = re.compile(rb"[\s,:\[\]{}\"]")


def too_deep(data: bytes) -> int | None:
    """The byte offset json.c reports for the first value of ``data`` nested deeper than
    MAX_DEPTH levels, or None when none is. ``data`` need not be valid JSON: what is not is left
    to the parser (a string that never ends stops the scan)."""
    data = bytes(data)
    if data.count(b"[") + data.count(b"{") <= MAX_DEPTH:
        return None  # fewer brackets than the limit: no value can be that deep
    if _deepest(data) <= MAX_DEPTH:
        return None  # values inside at most MAX_DEPTH open containers are at depth <= MAX_DEPTH
    return _scan(data)


def _deepest(data: bytes) -> int:
    """The most containers open at once, brackets inside strings not counted; in NumPy, since a
    program may be megabytes (a few percent of what json.loads takes)."""
    import numpy as np

    if b"\\" in data:   # an escaped quote ends no string: let the regex find the strings
        data = _STRING.sub(b'""', data)
    text = np.frombuffer(data, np.uint8)
    steps = np.zeros(256, np.int8)
    steps[[ord("["), ord("{")]], steps[[ord("]"), ord("}")]] = 1, -1
    steps = steps[text]
    # 1 from a string's opening quote up to its closing one: brackets there are text
    inside = np.bitwise_xor.accumulate((text == ord('"')).view(np.int8))
    steps[inside.view(bool)] = 0
    return int(np.cumsum(steps[steps != 0], dtype=np.int64).max(initial=0))


def _scan(data: bytes) -> int | None:
    """json.c's walk, keeping only the depth: where the first value too deep begins."""
    stack: list[int] = []    # the open containers' brackets
    at, i, n = 0, 0, len(data)   # at: where json.c would stand for the next value
    key = False              # the next string is an object's key, not a value
    while i < n:
        c = data[i]
        if c in _SPACE:
            i += 1
            continue
        if c in b"]}":
            if stack:
                stack.pop()
            i += 1
            key = False
            continue
        if c in b",:":
            i += 1
            at = i
            key = c == ord(",") and bool(stack) and stack[-1] == ord("{")
            continue
        if not key and len(stack) > MAX_DEPTH:
            return at
        if c in b"[{":
            stack.append(c)
            i += 1
            at = i
            while c == ord("[") and at < n and data[at] in _SPACE:
                at += 1   # json.c skips the space before an array's first item, not others
            key = c == ord("{")
        elif c == ord('"'):
            m = _STRING.match(data, i)
            if m is None:
                return None  # a string that never ends: the parser reports it
            i = m.end()
            key = False
        else:   # a number, true, false, null (or garbage, which the parser reports)
            m = _SCALAR_END.search(data, i + 1)
            i = m.start() if m else n
    return None
