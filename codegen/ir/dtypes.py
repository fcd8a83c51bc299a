"""Element types of the IR: short names, their NumPy types and their classes.

The IR names dtypes with short strings (``f32``, ``i64``, ``bool``) so that the text form stays
terse; this module is the one place that maps them to NumPy and answers questions about them.
"""

from __future__ import annotations

import numpy as np

try:  # ml_dtypes ships with onnx; it gives NumPy a bfloat16 and the fp8 types.
    import ml_dtypes as _mld
except ImportError:  # pragma: no cover - onnx always brings it
    _mld = None

_NUMPY: dict[str, object] = {
    "bool": np.bool_,
    "i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64,
    "u8": np.uint8, "u16": np.uint16, "u32": np.uint32, "u64": np.uint64,
    "f16": np.float16, "f32": np.float32, "f64": np.float64,
}
if _mld is not None:
    _NUMPY["bf16"] = _mld.bfloat16

DTYPES: tuple[str, ...] = tuple(_NUMPY)
FLOATS = frozenset({"f16", "bf16", "f32", "f64"})
SIGNED = frozenset({"i8", "i16", "i32", "i64"})
UNSIGNED = frozenset({"u8", "u16", "u32", "u64"})
INTS = SIGNED | UNSIGNED
# The dtype of index arithmetic: loop variables, symbols and sizes.
INDEX = "i64"


def to_numpy(dtype: str) -> np.dtype:
    """The NumPy dtype for an IR dtype name."""
    return np.dtype(_NUMPY[dtype])


def from_numpy(dt) -> str:
    """The IR dtype name for a NumPy dtype (raises KeyError for one the IR has no name for)."""
    dt = np.dtype(dt)
    for name, np_type in _NUMPY.items():
        if np.dtype(np_type) == dt:
            return name
    raise KeyError(str(dt))


def is_float(dtype: str) -> bool:
    return dtype in FLOATS


def is_int(dtype: str) -> bool:
    return dtype in INTS


def bits(dtype: str) -> int:
    return 8 if dtype == "bool" else to_numpy(dtype).itemsize * 8


def lowest(dtype: str):
    """The identity of ``max``: -inf for floats, the smallest value for integers."""
    if dtype == "bool":
        return False
    if is_float(dtype):
        return -np.inf
    return np.iinfo(to_numpy(dtype)).min


def highest(dtype: str):
    """The identity of ``min``: +inf for floats, the largest value for integers."""
    if dtype == "bool":
        return True
    if is_float(dtype):
        return np.inf
    return np.iinfo(to_numpy(dtype)).max


def promote(a: str, b: str) -> str:
    """The dtype binary arithmetic on ``a`` and ``b`` computes in (ONNX requires a == b; index math mixes)."""
    if a == b:
        return a
    return from_numpy(np.promote_types(to_numpy(a), to_numpy(b)))
