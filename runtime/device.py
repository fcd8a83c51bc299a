"""GPU tensors into and out of a model running on CUDA, without copies: DLPack and the CUDA array
interface, as PyTorch, CuPy and JAX exchange them.

**Inputs**: an object with ``__cuda_array_interface__`` (PyTorch, CuPy, Numba) or a DLPack
producer whose ``__dlpack_device__`` is a CUDA device (PyTorch, CuPy, JAX), C-contiguous, on
GPU 0. The engine reads it in place (``mlpack_run_device``) after waiting for the stream the
producer named. **Outputs**: ``DeviceArray``, GPU memory libmlpack allocated
(``mlpack_device_alloc``, in CUDA's primary context, which PyTorch and CuPy share), which
``torch.from_dlpack(y)`` or ``cupy.from_dlpack(y)`` takes over without a copy, and ``y.numpy()``
copies to the host. A DeviceArray frees its memory when neither it nor a consumer of its DLPack
capsule holds it any more.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

from mlpack.spec import errors
from mlpack.spec.ir import dtypes

KDL_CPU, KDL_CUDA = 1, 2
# DLPack type codes: kDLInt, kDLUInt, kDLFloat, kDLBfloat, kDLBool
_DL_CODES = {"i": 0, "u": 1, "f": 2}
_DL_BF16, _DL_BOOL = 4, 6


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                             ("deleter", _DELETER)]

_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_capsule_pointer = _api["PyCapsule_GetPointer"]   # (its own function object: raw PyObject *)
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]

_NAME, _USED = b"dltensor", b"used_dltensor"
_exported: dict[int, tuple] = {}   # DLManagedTensor address -> what it keeps alive
_exported_lock = threading.Lock()


@_DELETER
def _delete(managed) -> None:
    """The DLPack deleter: the consumer is done with the tensor (or nobody took the capsule)."""
    with _exported_lock:
        _exported.pop(ctypes.addressof(managed.contents), None)


@_CAPSULE_DESTRUCTOR
def _capsule_gone(capsule) -> None:
    """A capsule nobody consumed (still named "dltensor") owns its tensor: delete it."""
    if _api.PyCapsule_IsValid(capsule, _NAME):
        ptr = _capsule_pointer(capsule, _NAME)
        if ptr:
            _delete(ctypes.cast(ptr, ctypes.POINTER(_DLManagedTensor)))


def _itemsize(dtype: str) -> int:
    return np.dtype(dtypes.to_numpy(dtype)).itemsize


def _dl_dtype(dtype: str) -> _DLDataType:
    if dtype == "bf16":
        return _DLDataType(_DL_BF16, 16, 1)
    if dtype == "bool":
        return _DLDataType(_DL_BOOL, 8, 1)
    npd = np.dtype(dtypes.to_numpy(dtype))
    return _DLDataType(_DL_CODES[npd.kind], npd.itemsize * 8, 1)


def _ir_dtype(code: int, bits: int, lanes: int) -> str | None:
    if lanes != 1:
        return None
    if code == _DL_BF16 and bits == 16:
        return "bf16"
    if code == _DL_BOOL and bits == 8:
        return "bool"
    kind = {0: "i", 1: "u", 2: "f"}.get(code)
    return None if kind is None else {"i": f"i{bits}", "u": f"u{bits}", "f": f"f{bits}"}[kind]


class DeviceArray:
    """A tensor in GPU memory that a run of a cuda model wrote (or ``empty`` made): exchange it
    with ``torch.from_dlpack``/``cupy.from_dlpack`` (no copy) or copy it out with ``numpy()``."""

    def __init__(self, lib, ptr: int, shape: tuple[int, ...], dtype: str):
        self._lib = lib
        self.ptr = ptr
        self.shape = tuple(int(n) for n in shape)
        self.dtype = dtype            # the IR's name: "f32", "bf16", ...
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * _itemsize(dtype)

    @classmethod
    def empty(cls, lib, shape, dtype: str) -> DeviceArray:
        out = ctypes.c_void_p()
        err = ctypes.c_void_p()
        n = int(np.prod(shape, dtype=np.int64)) * _itemsize(dtype)
        if lib.mlpack_device_alloc(n, ctypes.byref(out), ctypes.byref(err)) != 0:
            from mlpack.runtime.native import _raise
            _raise(err, 9)
        return cls(lib, out.value, shape, dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __repr__(self) -> str:
        return f"<mlpack.DeviceArray {self.dtype}{list(self.shape)} on cuda:0>"

    def numpy(self) -> np.ndarray:
        """A host copy."""
        out = np.empty(self.shape, dtypes.to_numpy(self.dtype))
        err = ctypes.c_void_p()
        if self.nbytes and self._lib.mlpack_device_copy(out.ctypes.data, self.ptr, self.nbytes, 0,
                                                        ctypes.byref(err)) != 0:
            from mlpack.runtime.native import _raise
            _raise(err, 9)
        return out

    __array__ = lambda self, dtype=None, copy=None: (  # noqa: E731
        self.numpy() if dtype is None else self.numpy().astype(dtype))

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.shape, "typestr": np.dtype(dtypes.to_numpy(self.dtype)).str,
                "data": (self.ptr, False), "version": 3, "strides": None, "stream": None}

    def __dlpack_device__(self) -> tuple[int, int]:
        return (KDL_CUDA, 0)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        """A DLPack capsule of this tensor (legacy, unversioned: what every consumer reads).
        The run that wrote it returned after the GPU finished, so any ``stream`` may read it."""
        if dl_device is not None and tuple(dl_device) != (KDL_CUDA, 0):
            raise BufferError(f"mlpack.DeviceArray is on cuda:0, not {dl_device}")
        if copy:
            raise BufferError("mlpack.DeviceArray exports without copying")
        shape = (ctypes.c_int64 * max(1, self.ndim))(*self.shape)
        managed = _DLManagedTensor()
        managed.dl_tensor = _DLTensor(self.ptr, _DLDevice(KDL_CUDA, 0), self.ndim,
                                      _dl_dtype(self.dtype), shape, None, 0)
        managed.deleter = _delete
        with _exported_lock:   # the struct, its shape and this array live until the deleter
            _exported[ctypes.addressof(managed)] = (managed, shape, self)
        return _api.PyCapsule_New(ctypes.addressof(managed), _NAME,
                                  ctypes.cast(_capsule_gone, ctypes.c_void_p))

    def __del__(self):
        if getattr(self, "ptr", None):
            self._lib.mlpack_device_free(self.ptr)
            self.ptr = None


class DeviceInput:
    """What the engine needs of one GPU input: its address, dtype and shape, the stream its
    producer wrote it on, and what must stay alive while it is read."""

    def __init__(self, ptr: int, shape, dtype: np.dtype, stream: int | None, keep=None,
                 release=None):
        self.ptr, self.shape, self.dtype = ptr, tuple(int(n) for n in shape), dtype
        self.ndim = len(self.shape)
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * dtype.itemsize
        self.stream, self._keep, self._release = stream, keep, release

    def release(self) -> None:
        if self._release is not None:
            self._release()
            self._release = None


def is_device_array(x) -> bool:
    """Whether ``x`` lives in CUDA memory (CUDA array interface, or a DLPack CUDA device)."""
    if isinstance(x, np.ndarray):
        return False
    if hasattr(x, "__cuda_array_interface__"):
        return True
    dev = getattr(x, "__dlpack_device__", None)
    if dev is None:
        return False
    try:
        return dev()[0] == KDL_CUDA
    except Exception:   # (a producer that cannot say is not a GPU tensor we can read)
        return False


def _contiguous(shape, strides, itemsize: int) -> bool:
    if strides is None:
        return True
    expect = itemsize
    for n, s in zip(reversed(shape), reversed(strides)):
        if n != 1 and s != expect:
            return False
        expect *= n
    return True


def device_input(name: str, x) -> DeviceInput:
    """``x`` as a DeviceInput; Error naming the input when it is not a C-contiguous tensor on
    GPU 0."""
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is not None:
        dtype = np.dtype(cai["typestr"])
        if not _contiguous(cai["shape"], cai.get("strides"), dtype.itemsize):
            raise errors.InputError(f"input {name!r} is not C-contiguous on the GPU; make it so "
                                    "(.contiguous() in PyTorch) first")
        stream = cai.get("stream")
        return DeviceInput(int(cai["data"][0] or 0), cai["shape"], dtype,
                           None if stream is None else int(stream), keep=x)
    dev = x.__dlpack_device__()
    if dev != (KDL_CUDA, 0):
        raise errors.InputError(f"input {name!r} is on DLPack device {tuple(dev)}, not cuda:0")
    capsule = x.__dlpack__(stream=1)   # (ready on the legacy default stream, which the run waits for)
    ptr = _api.PyCapsule_GetPointer(capsule, _NAME)
    managed = ctypes.cast(ptr, ctypes.POINTER(_DLManagedTensor)).contents
    t = managed.dl_tensor
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = tuple(t.strides[i] for i in range(t.ndim)) if t.strides else None
    ir = _ir_dtype(t.dtype.code, t.dtype.bits, t.dtype.lanes)
    if ir is None:
        raise errors.InputError(f"input {name!r} has DLPack dtype code {t.dtype.code} bits "
                                f"{t.dtype.bits} lanes {t.dtype.lanes}, which mlpack has no name for")
    dtype = np.dtype(dtypes.to_numpy(ir))
    if strides is not None and not _contiguous(shape, [s * dtype.itemsize for s in strides],
                                               dtype.itemsize):
        raise errors.InputError(f"input {name!r} is not C-contiguous on the GPU")

    def release():   # the consumer's part of the protocol: the capsule is used, then deleted
        _api.PyCapsule_SetName(capsule, _USED)
        if managed.deleter:
            managed.deleter(ctypes.pointer(managed))
    return DeviceInput(int(t.data or 0) + int(t.byte_offset), shape, dtype, 1, keep=(x, capsule),
                       release=release)


__all__ = ["DeviceArray", "DeviceInput", "device_input", "is_device_array"]
