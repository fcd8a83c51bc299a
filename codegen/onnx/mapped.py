"""An ONNX file's weights as views of the mapped file, its message parsed without them.

Parsing a model with protobuf copies every weight into the message, and the protobuf runtime
(upb) frees a message's memory only with the whole message; importing it then copies each
weight once more into NumPy. A build held GPT-2's 500 MB of weights three times over before it
compiled anything. ``split_weights`` walks the file's protobuf encoding instead: the message is
parsed from the file's bytes less the ``raw_data`` of the main graph's initializers (each keeps
its name, type and dims), and each of those arrays is a read-only view of the mapped file,
whose pages the page cache holds once, whoever reads them.

Only what the walk can prove is split off: an initializer whose data is ``raw_data`` of a plain
NumPy dtype, exactly as long as its dims say, under a name no other initializer has. Anything
else (external data, typed fields, bfloat16 and the packed 4-bit types, a malformed or
truncated encoding, a big-endian host) stays in the message, or the file is parsed whole, so
every error is still the parser's or the importer's.
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
_MODEL_GRAPH = 7                                                     # ModelProto.graph
_GRAPH_INITIALIZER = 5                                               # GraphProto.initializer
_DIMS, _DATA_TYPE, _NAME, _RAW_DATA, _LOCATION = 1, 2, 8, 9, 14      # TensorProto's fields
_EXTERNAL = 1                                                        # DataLocation.EXTERNAL
# TensorProto.DataType -> the NumPy dtype its raw_data is, little-endian
DTYPES = {1: "<f4", 2: "u1", 3: "i1", 4: "<u2", 5: "<i2", 6: "<i4", 7: "<i8", 9: "?",
          10: "<f2", 11: "<f8", 12: "<u4", 13: "<u8"}


@dataclasses.dataclass
class Split:
    """What ``split_weights`` found: the encoding to parse and where each weight lies."""

    light: bytes
    places: dict[str, tuple[int, str, tuple[int, ...]]]   # name -> (offset, dtype, dims)

    def views(self, data) -> dict[str, np.ndarray]:
        out = {}
        for name, (offset, dtype, dims) in self.places.items():
            count = int(np.prod(dims, dtype=np.int64))
            out[name] = np.frombuffer(data, dtype=dtype, count=count, offset=offset).reshape(dims)
        return out


@dataclasses.dataclass
class MappedModel:
    """A model file as ``import_model`` takes it: ``proto`` without the split-off weights,
    ``weights`` those arrays by initializer name (read-only views of the file), ``path`` the
    file (its folder is where external data would be)."""

    proto: object
    weights: dict[str, np.ndarray]
    path: str
    split: Split | None = None   # where the weights lie in the file (to map it again)


class _Malformed(Exception):
    """The encoding is not what the walk can follow: the file is parsed whole instead."""


def _varint(buf, i: int, end: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if i >= end or shift > 63:
            raise _Malformed
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def _fields(buf, start: int, end: int):
    """(field number, wire type, the field's first byte, its value's first byte, its end) of
    each field of the message encoded in ``buf[start:end]``."""
    i = start
    while i < end:
        key, j = _varint(buf, i, end)
        field, wire = key >> 3, key & 7
        if wire == _VARINT:
            _, k = _varint(buf, j, end)
        elif wire == _I64:
            k = j + 8
        elif wire == _I32:
            k = j + 4
        elif wire == _LEN:
            n, j = _varint(buf, j, end)
            k = j + n
        else:   # groups (deprecated) and reserved wire types
            raise _Malformed
        if field == 0 or k > end:
            raise _Malformed
        yield field, wire, i, j, k
        i = k


def _encode_varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _length_field(field: int, body: bytes) -> bytes:
    return _encode_varint(field << 3 | _LEN) + _encode_varint(len(body)) + body


def _tensor(buf, start: int, end: int):
    """(the tensor's name, and where its data can be split off: (its encoding without its
    raw_data, (offset, dtype, dims)), else None)."""
    name, raw, dtype, dims, external = None, [], None, [], False
    kept = []
    for field, wire, first, value, last in _fields(buf, start, end):
        if field == _RAW_DATA and wire == _LEN:
            raw.append((value, last))
            continue
        kept.append((first, last))
        if field == _NAME and wire == _LEN:
            name = bytes(buf[value:last]).decode("utf-8", errors="strict")
        elif field == _DATA_TYPE and wire == _VARINT:
            dtype = DTYPES.get(_varint(buf, value, last)[0])
        elif field == _DIMS and wire == _VARINT:
            dims.append(_varint(buf, value, last)[0])
        elif field == _DIMS and wire == _LEN:   # packed
            i = value
            while i < last:
                d, i = _varint(buf, i, last)
                dims.append(d)
        elif field == _LOCATION and wire == _VARINT:
            external = _varint(buf, value, last)[0] == _EXTERNAL
    if not name or len(raw) != 1 or dtype is None or external or \
            any(d >= 1 << 62 for d in dims):   # (a negative dim is a 10-byte varint)
        return name, None
    offset, last = raw[0]
    if int(np.prod(dims, dtype=object)) * np.dtype(dtype).itemsize != last - offset:
        return name, None
    body = b"".join(bytes(buf[a:b]) for a, b in kept)
    return name, (body, (offset, dtype, tuple(dims)))


def split_weights(data) -> Split | None:
    """The encoding of the model in ``data`` (a file's bytes, or its mapping) without its main
    graph's raw initializer data, and where that data lies; None where the walk cannot prove the
    split (the file is then parsed whole)."""
    if sys.byteorder != "little":
        return None
    buf = memoryview(data)
    try:
        places: dict[str, tuple] = {}
        names: set[str] = set()
        out = []
        for field, wire, first, value, last in _fields(buf, 0, len(buf)):
            if field != _MODEL_GRAPH or wire != _LEN:
                out.append(bytes(buf[first:last]))
                continue
            graph, run = [], value   # (fields kept as they are, copied in runs)
            for f, w, a, v, b in _fields(buf, value, last):
                if f != _GRAPH_INITIALIZER or w != _LEN:
                    continue
                name, split = _tensor(buf, v, b)
                if name in names:
                    return None   # (a name twice: the importer's checks name it)
                names.add(name)
                if split is not None:
                    graph += [bytes(buf[run:a]), _length_field(_GRAPH_INITIALIZER, split[0])]
                    places[name], run = split[1], b
            graph.append(bytes(buf[run:last]))
            out.append(_length_field(_MODEL_GRAPH, b"".join(graph)))
    except (_Malformed, UnicodeDecodeError):
        return None
    if not places:
        return None
    return Split(b"".join(out), places)
