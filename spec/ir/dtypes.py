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
# Narrow types (storage and quantization formats): computed on by converting, never natively.
_NARROW_FLOATS = {
    "f8e4m3fn": "float8_e4m3fn", "f8e4m3fnuz": "float8_e4m3fnuz", "f8e5m2": "float8_e5m2",
    "f8e5m2fnuz": "float8_e5m2fnuz", "f8e8m0": "float8_e8m0fnu", "f4e2m1": "float4_e2m1fn",
}
_NARROW_INTS = {"i4": "int4", "u4": "uint4", "i2": "int2", "u2": "uint2"}
if _mld is not None:
    _NUMPY["bf16"] = _mld.bfloat16
    for _name, _attr in {**_NARROW_FLOATS, **_NARROW_INTS}.items():
        if hasattr(_mld, _attr):
            _NUMPY[_name] = getattr(_mld, _attr)

DTYPES: tuple[str, ...] = tuple(_NUMPY)
FLOATS = frozenset({"f16", "bf16", "f32", "f64"} | (set(_NARROW_FLOATS) & set(_NUMPY)))
SIGNED = frozenset({"i8", "i16", "i32", "i64", "i4", "i2"} & set(_NUMPY))
UNSIGNED = frozenset({"u8", "u16", "u32", "u64", "u4", "u2"} & set(_NUMPY))
INTS = SIGNED | UNSIGNED
# The dtype of index arithmetic: loop variables, symbols and sizes.
INDEX = "i64"


# both directions as dicts: a run looks its inputs' dtypes up (the first match per NumPy
# dtype, as a scan of _NUMPY would find it)
_TO_NUMPY = {name: np.dtype(t) for name, t in _NUMPY.items()}
_FROM_NUMPY: dict[np.dtype, str] = {}
for _name, _dt in _TO_NUMPY.items():
    _FROM_NUMPY.setdefault(_dt, _name)


def to_numpy(dtype: str) -> np.dtype:
    """The NumPy dtype for an IR dtype name."""
    return _TO_NUMPY[dtype]


def from_numpy(dt) -> str:
    """The IR dtype name for a NumPy dtype (raises KeyError for one the IR has no name for)."""
    dt = np.dtype(dt)
    try:
        return _FROM_NUMPY[dt]
    except KeyError:
        raise KeyError(str(dt)) from None


def is_float(dtype: str) -> bool:
    return dtype in FLOATS


def is_int(dtype: str) -> bool:
    return dtype in INTS


_BITS = {"i4": 4, "u4": 4, "i2": 2, "u2": 2, "f4e2m1": 4}


def bits(dtype: str) -> int:
    return 8 if dtype == "bool" else _BITS.get(dtype, to_numpy(dtype).itemsize * 8)


def finite_range(dtype: str) -> tuple[float, float]:
    """The smallest and largest finite values of a numeric dtype (saturating casts clamp to it)."""
    np_dtype = to_numpy(dtype)
    info = (_mld.iinfo(np_dtype) if is_int(dtype) else _mld.finfo(np_dtype)) if _mld else \
        (np.iinfo(np_dtype) if is_int(dtype) else np.finfo(np_dtype))
    return float(info.min), float(info.max)


def lowest(dtype: str):
    """The identity of ``max``: -inf for floats, the smallest value for integers."""
    if dtype == "bool":
        return False
    if is_float(dtype):
        return -np.inf
    return int(finite_range(dtype)[0])


def highest(dtype: str):
    """The identity of ``min``: +inf for floats, the largest value for integers."""
    if dtype == "bool":
        return True
    if is_float(dtype):
        return np.inf
    return int(finite_range(dtype)[1])


def promote(a: str, b: str) -> str:
    """The dtype binary arithmetic on ``a`` and ``b`` computes in (ONNX requires a == b; index math mixes)."""
    if a == b:
        return a
    return from_numpy(np.promote_types(to_numpy(a), to_numpy(b)))
