"""The tensor archive: named arrays in one blob, each 64-byte aligned, read without copying.

Weights and test vectors are stored this way. Layout (all integers little-endian):

    magic    8 bytes   b"MLPKTNS1"
    hlen     u64       length of the JSON header in bytes
    header   hlen      {"tensors": {name: {"dtype": "f32", "shape": [..], "offset": o, "nbytes": n}},
                        "metadata": {...}}  (offsets are from the start of the blob)
    data               each tensor at its offset, a multiple of 64, in row-major order

Because the container's tar members start on 512-byte boundaries, a tensor is 64-byte aligned
in the file too, so the runtime maps it straight from the container (``read_tensors`` on an
mmap gives arrays that view the file). The dtype names are the IR's (``f32``, ``i64``, ...).
"""

from __future__ import annotations

import io
import json
import struct

import numpy as np

from mlpack.spec import jsondepth
from mlpack.spec.errors import FormatError

MAGIC = b"MLPKTNS1"
ALIGN = 64
_DTYPES = {
    "bool": "?", "i8": "<i1", "i16": "<i2", "i32": "<i4", "i64": "<i8", "u8": "<u1", "u16": "<u2",
    "u32": "<u4", "u64": "<u8", "f16": "<f2", "f32": "<f4", "f64": "<f8",
}


def _numpy_dtype(name: str) -> np.dtype:
    if name in _DTYPES:
        return np.dtype(_DTYPES[name])
    try:  # bf16 and the narrow floats come from ml_dtypes, which the compiler side brings
        import ml_dtypes
        return np.dtype(getattr(ml_dtypes, {"bf16": "bfloat16"}.get(name, name)))
    except (ImportError, AttributeError, TypeError):
        raise FormatError(f"tensor dtype {name!r} is not known to this runtime") from None


def _dtype_name(dt: np.dtype) -> str:
    for name, code in _DTYPES.items():
        if np.dtype(code) == dt.newbyteorder("<") or np.dtype(code) == dt:
            return name
    if dt.name == "bfloat16":
        return "bf16"
    raise FormatError(f"cannot store dtype {dt} in a tensor archive")


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def write_tensors(tensors: dict[str, np.ndarray], metadata: dict | None = None) -> bytes:
    """Pack named arrays into one blob (deterministic: same input, same bytes)."""
    out = io.BytesIO()
    write_tensors_to(out, tensors, metadata)
    return out.getvalue()


def write_tensors_to(f, tensors: dict[str, np.ndarray], metadata: dict | None = None,
                     hasher=None) -> int:
    """``write_tensors``' bytes written to the binary file ``f`` an array at a time, without
    the whole blob in memory (a model's weights); ``hasher`` (a hashlib object) is updated with
    them. Returns the blob's size."""
    entries, offset_rel = {}, 0
    for name in tensors:
        a = np.asarray(tensors[name])
        entries[name] = {"dtype": _dtype_name(a.dtype), "shape": list(a.shape),
                         "offset": offset_rel, "nbytes": int(a.nbytes)}
        offset_rel = _align(offset_rel + a.nbytes)
    # the header's size depends on the absolute offsets it holds: settle it by iterating
    base = 0
    while True:
        header = {"tensors": {n: {**e, "offset": base + e["offset"]} for n, e in entries.items()},
                  "metadata": metadata or {}}
        raw = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
        start = _align(len(MAGIC) + 8 + len(raw))
        if start == base:
            break
        base = start
    size = 0

    def put(chunk) -> None:
        nonlocal size
        f.write(chunk)
        if hasher is not None:
            hasher.update(chunk)
        size += len(chunk) if isinstance(chunk, bytes) else chunk.nbytes

    put(MAGIC + struct.pack("<Q", len(raw)) + raw)
    for name in tensors:
        a = np.ascontiguousarray(np.asarray(tensors[name]))
        put(b"\0" * (header["tensors"][name]["offset"] - size))
        data = a.astype(a.dtype.newbyteorder("<"), copy=False)
        put(memoryview(data.reshape(-1).view(np.uint8)) if data.size else b"")
    return size


def read_header(buf) -> dict:
    """The parsed header of a tensor archive in ``buf`` (bytes, memoryview or mmap)."""
    mv = memoryview(buf)
    if len(mv) < len(MAGIC) + 8 or bytes(mv[:len(MAGIC)]) != MAGIC:
        raise FormatError("not a tensor archive (bad magic)")
    (hlen,) = struct.unpack("<Q", bytes(mv[len(MAGIC):len(MAGIC) + 8]))
    if hlen > len(mv) - len(MAGIC) - 8:
        raise FormatError(f"tensor archive header length {hlen} exceeds the blob ({len(mv)} bytes)")
    raw = bytes(mv[len(MAGIC) + 8:len(MAGIC) + 8 + hlen])
    deep = jsondepth.too_deep(raw)   # json.loads would recurse into a RecursionError
    if deep is not None:
        raise FormatError(f"tensor archive header is not valid JSON: nested too deeply at byte {deep}")
    try:
        header = json.loads(raw)
    except ValueError as e:
        raise FormatError(f"tensor archive header is not valid JSON: {e}") from None
    if not isinstance(header, dict) or not isinstance(header.get("tensors"), dict):
        raise FormatError("tensor archive header has no 'tensors' table")
    return header


def read_tensors(buf) -> dict[str, np.ndarray]:
    """Arrays viewing ``buf`` (no copy); each entry is checked against the blob's bounds."""
    header = read_header(buf)
    mv = memoryview(buf)
    out = {}
    for name, e in header["tensors"].items():
        try:
            dtype = _numpy_dtype(e["dtype"])
            shape = tuple(int(s) for s in e["shape"])
            offset, nbytes = int(e["offset"]), int(e["nbytes"])
        except (KeyError, TypeError, ValueError):
            raise FormatError(f"tensor {name!r}: malformed entry {e!r}") from None
        if any(s < 0 for s in shape) or nbytes != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
            raise FormatError(f"tensor {name!r}: {nbytes} bytes do not hold shape {list(shape)} {e['dtype']}")
        if offset < 0 or offset + nbytes > len(mv):
            raise FormatError(f"tensor {name!r}: bytes {offset}..{offset + nbytes} lie outside the blob")
        out[name] = np.frombuffer(mv, dtype=dtype, count=nbytes // dtype.itemsize if dtype.itemsize else 0,
                                  offset=offset).reshape(shape)
    return out
