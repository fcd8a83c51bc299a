"""The narrow dtypes (fp8, fp4, int4, int2) on the cpu target: which buffers hold them packed,
and their bytes on the host.

Kernels convert them in registers and load and store them as codegen/llvm/narrow.py does. The
sub-byte types (4-bit, 2-bit) are packed as ONNX packs them, two (four) elements per byte,
element 0 in the low bits, in buffers the engine owns (the arena and the weights: half the
bytes for int4 weights; ``pack_weights``). Model inputs and outputs (ports) keep one element
per byte, low bits, upper bits zero (``unpack_ports``): that is how NumPy holds ml_dtypes
arrays, so the engine passes them as u8 (``carrier``) and the caller views them
(mlpack.backend). A packed store is a read-modify-write of its byte, so lower.py gives a kernel
writing a packed buffer to one workgroup (``shares_bytes``) and no two threads ever share a
byte.
"""

from __future__ import annotations

import numpy as np

from mlpack.spec.ir import dtypes as dt
from mlpack.codegen.llvm.narrow import handles, sub_byte


def shares_bytes(buf) -> bool:
    """Whether elements of ``buf`` (a kernel.Buffer) share bytes, so that only one thread may
    write it."""
    return sub_byte(buf.dtype) and buf.packed


# ---------------------------------------------------------------- host side


def to_codes(a: np.ndarray, dtype: str) -> np.ndarray:
    """An ml_dtypes array -> its codes as u8 (one per element, upper bits zero)."""
    a = np.ascontiguousarray(a, dtype=dt.to_numpy(dtype))
    return a.view(np.uint8) & np.uint8((1 << dt.bits(dtype)) - 1)


def from_codes(codes: np.ndarray, dtype: str) -> np.ndarray:
    """u8 codes (one per element, as a narrow port holds them) -> the ml_dtypes array."""
    return np.ascontiguousarray(codes, dtype=np.uint8).view(dt.to_numpy(dtype))


def pack(a: np.ndarray, dtype: str) -> np.ndarray:
    """The bytes of a buffer of ``dtype`` holding ``a`` (in its layout): sub-byte types packed
    (element 0 in the low bits, the last byte's unused bits zero), fp8 as its codes."""
    codes = to_codes(a, dtype).reshape(-1)
    if not sub_byte(dtype):
        return codes
    w = dt.bits(dtype)
    per = 8 // w
    codes = np.concatenate([codes, np.zeros(-len(codes) % per, np.uint8)]).reshape(-1, per)
    out = np.zeros(len(codes), np.uint8)
    for lane in range(per):
        out |= codes[:, lane] << np.uint8(lane * w)
    return out


def unpack(data: np.ndarray, dtype: str, shape) -> np.ndarray:
    """The inverse of ``pack``: an ml_dtypes array of ``shape``."""
    n = int(np.prod(shape, dtype=np.int64))
    data = np.asarray(data, np.uint8).reshape(-1)
    if sub_byte(dtype):
        w = dt.bits(dtype)
        per = 8 // w
        lanes = [(data >> np.uint8(lane * w)) & np.uint8((1 << w) - 1) for lane in range(per)]
        data = np.stack(lanes, axis=1).reshape(-1)
    return np.ascontiguousarray(data[:n]).view(dt.to_numpy(dtype)).reshape(shape)


def pack_weights(weights: dict[str, np.ndarray], bufs: dict) -> dict[str, np.ndarray]:
    """The plan's weights with narrow ones as their stored bytes (``pack``): the weights
    archive and the engine know only the wide dtypes, and the kernels read these bytes."""
    out = {}
    for name, w in weights.items():
        buf = bufs.get(name)
        out[name] = pack(w, buf.dtype) if buf is not None and handles(buf.dtype) else w
    return out


def unpack_ports(graph, bufs: dict, owners: list[str]) -> None:
    """Ports hold one element per byte (as NumPy does): mark their buffers unpacked."""
    for name in [p.name for p in graph.inputs] + list(owners):
        buf = bufs.get(name)
        if buf is not None and handles(buf.dtype):
            buf.packed = False


def carrier(dtype: str) -> str:
    """The dtype the engine sees for a port of ``dtype``: u8 for the narrow ones."""
    return "u8" if handles(dtype) else dtype
