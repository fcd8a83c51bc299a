"""The C engine (libmlpack) from Python, through ctypes.

    from mlpack.runtime import native
    with native.open_model("model.mlpack", threads=2) as m:
        y = m.run({"x": x})["y"]          # outputs copied into NumPy arrays
        [a.reason for a in m.artifacts]   # the engine's selection verdicts

The library is found next to this file (``libmlpack.so``, built from runtime/c/src by
runtime/setup.py: the mlpack-runtime wheel, or ``pip install -e ./runtime`` in a checkout) or, in a
checkout, at ``runtime/c/build/libmlpack.so`` (``make -C runtime/c``), the newer of the two when
both exist; ``MLPACK_LIBRARY`` names another. ``include_dir()`` is where ``mlpack.h`` is, for C
programs (``python -m mlpack.runtime --cflags --libs``). Errors become the exceptions of
``mlpack.spec.errors`` with the engine's message: FORMAT and IO -> FormatError, DIGEST ->
DigestError, VERSION -> VersionError, INPUT -> InputError, NO_ARTIFACT -> NoRunnableArtifactError
(PortableFallbackError when ``strict`` refused the portable fallback), INDEX -> IndexRangeError
(an index taken from data out of range: the message names the ONNX node and the index),
anything else -> Error.
A model's ``run`` may be called from many threads at once (results as serial runs give them);
``close`` it once no run is inside.
It imports only ``mlpack.spec``, NumPy and the standard library, like the rest of the runtime.
"""

from __future__ import annotations

import ctypes
import functools
import os
from dataclasses import dataclass

import numpy as np

from mlpack.spec import environment, errors, sizes
from mlpack.spec.ir import dtypes as ir_dtypes

# mlpack_status
OK, ERR_ARGUMENT, ERR_IO, ERR_FORMAT, ERR_DIGEST, ERR_VERSION, ERR_NO_ARTIFACT, ERR_INPUT, \
    ERR_LOAD, ERR_RUNTIME, ERR_NOMEM, ERR_INDEX, ERR_SIGNATURE = range(13)

# mlpack_dtype, in enum order
DTYPES = ("bool", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "f16", "bf16", "f32", "f64")

_HERE = os.path.dirname(os.path.abspath(__file__))


class _Options(ctypes.Structure):
    _fields_ = [("threads", ctypes.c_int), ("device", ctypes.c_char_p), ("precision", ctypes.c_char_p),
                ("accuracy_budget", ctypes.c_double), ("strict", ctypes.c_int), ("verify", ctypes.c_int),
                ("pin_artifact", ctypes.c_int), ("trusted_keys", ctypes.c_char_p),
                ("select_only", ctypes.c_int)]


class _TensorInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int), ("rank", ctypes.c_size_t),
                ("dim_names", ctypes.POINTER(ctypes.c_char_p)), ("dims", ctypes.POINTER(ctypes.c_int64)),
                ("dim_syms", ctypes.POINTER(ctypes.c_char_p))]


class _Tensor(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int), ("rank", ctypes.c_size_t),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("data", ctypes.c_void_p),
                ("nbytes", ctypes.c_size_t)]


class _ArtifactInfo(ctypes.Structure):
    _fields_ = [("index", ctypes.c_size_t), ("device", ctypes.c_char_p), ("precision", ctypes.c_char_p),
                ("architecture", ctypes.c_char_p), ("variant", ctypes.c_char_p), ("runnable", ctypes.c_int),
                ("chosen", ctypes.c_int), ("reason", ctypes.c_char_p)]


# ---------------------------------------------------------------- the library


def library_path() -> str | None:
    """Where libmlpack is: $MLPACK_LIBRARY, the packaged build, or the checkout's make build."""
    env = environment.get("MLPACK_LIBRARY")
    if env:   # (taken as given: a file that does not load is an error naming it, library())
        return env
    found = [p for p in (os.path.join(_HERE, "libmlpack.so"), os.path.join(_HERE, "c", "build", "libmlpack.so"))
             if os.path.exists(p)]
    # in a checkout both may exist: the newer one is the one the developer just built
    return max(found, key=os.path.getmtime) if found else None


def include_dir() -> str:
    """The folder of mlpack.h: the wheel's copy beside the library, or the checkout's."""
    for d in (os.path.join(_HERE, "include"), os.path.join(_HERE, "c", "include")):
        if os.path.exists(os.path.join(d, "mlpack.h")):
            return d
    raise errors.Error("mlpack.h is not here: install mlpack-runtime (pip install ./runtime in a checkout)")


def _declare(lib: ctypes.CDLL) -> None:
    P, E = ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)
    sigs = {
        "mlpack_options_init": (None, [ctypes.POINTER(_Options)]),
        "mlpack_open": (P, [ctypes.c_char_p, ctypes.POINTER(_Options), E]),
        "mlpack_open_fd": (P, [ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(_Options), E]),
        "mlpack_signer": (ctypes.c_char_p, [P]),
        "mlpack_close": (None, [P]),
        "mlpack_input_count": (ctypes.c_size_t, [P]),
        "mlpack_output_count": (ctypes.c_size_t, [P]),
        "mlpack_input_info": (ctypes.c_int, [P, ctypes.c_size_t, ctypes.POINTER(_TensorInfo)]),
        "mlpack_output_info": (ctypes.c_int, [P, ctypes.c_size_t, ctypes.POINTER(_TensorInfo)]),
        "mlpack_artifact_count": (ctypes.c_size_t, [P]),
        "mlpack_artifact_info_get": (ctypes.c_int, [P, ctypes.c_size_t, ctypes.POINTER(_ArtifactInfo)]),
        "mlpack_run": (ctypes.c_int, [P, ctypes.POINTER(_Tensor), ctypes.c_size_t, ctypes.POINTER(_Tensor),
                                      ctypes.c_size_t, E]),
        "mlpack_run_into": (ctypes.c_int, [P, ctypes.POINTER(_Tensor), ctypes.c_size_t,
                                           ctypes.POINTER(_Tensor), ctypes.c_size_t, E]),
        "mlpack_run_device": (ctypes.c_int, [P, ctypes.POINTER(_Tensor), ctypes.c_size_t,
                                             ctypes.POINTER(_Tensor), ctypes.c_size_t, P, E]),
        "mlpack_device_alloc": (ctypes.c_int, [ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p), E]),
        "mlpack_device_free": (None, [P]),
        "mlpack_device_copy": (ctypes.c_int, [P, P, ctypes.c_size_t, ctypes.c_int, E]),
        "mlpack_error_code": (ctypes.c_int, [P]),
        "mlpack_error_message": (ctypes.c_char_p, [P]),
        "mlpack_error_free": (None, [P]),
        "mlpack_version_string": (ctypes.c_char_p, []),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args


@functools.lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    """The loaded libmlpack (once per process). Error if it is not built."""
    path = library_path()
    if path is None:
        raise errors.Error("libmlpack is not built: run `pip install -e .` or `make -C runtime/c`")
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        named = " ($MLPACK_LIBRARY)" if path == environment.get("MLPACK_LIBRARY") else ""
        raise errors.Error(f"cannot load libmlpack from {path}{named}: {e}") from None
    _declare(lib)
    return lib


def available() -> bool:
    return unavailable_reason() is None


def unavailable_reason() -> str | None:
    """Why libmlpack cannot be used in this process (not built, or $MLPACK_LIBRARY naming
    what does not load), or None where it can."""
    try:
        library()
    except errors.Error as e:
        return str(e)
    return None


def version() -> str:
    return library().mlpack_version_string().decode()


def _raise(err: ctypes.c_void_p, status: int | None = None):
    lib = library()
    code = lib.mlpack_error_code(err) if err else status
    message = (lib.mlpack_error_message(err) or b"").decode("utf-8", "replace") if err else ""
    if err:
        lib.mlpack_error_free(err)
    message = message or f"libmlpack failed with status {code}"
    if code == ERR_NO_ARTIFACT and "strict forbids falling back" in message:
        raise errors.PortableFallbackError(message)
    cls = {ERR_IO: errors.FormatError, ERR_FORMAT: errors.FormatError, ERR_DIGEST: errors.DigestError,
           ERR_VERSION: errors.VersionError, ERR_INPUT: errors.InputError,
           ERR_INDEX: errors.IndexRangeError, ERR_SIGNATURE: errors.SignatureError,
           ERR_NO_ARTIFACT: getattr(errors, "NoRunnableArtifactError", errors.Error)}.get(code, errors.Error)
    raise cls(message)


# ---------------------------------------------------------------- records


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    dims: tuple[str, ...]
    shape: tuple[int | str, ...]  # a count, a symbol name, or a size expression ("2 * $batch")


@dataclass(frozen=True)
class ArtifactVerdict:
    index: int
    device: str
    precision: str
    architecture: str
    variant: str
    runnable: bool
    chosen: bool
    reason: str


def _numpy_dtype(name: str) -> np.dtype:
    try:
        return ir_dtypes.to_numpy(name)
    except KeyError:
        raise errors.Error(f"dtype {name!r} has no NumPy equivalent here (bf16 needs ml_dtypes)") from None


def _dtype_code(a: np.ndarray, name: str) -> int:
    try:
        return DTYPES.index(ir_dtypes.from_numpy(a.dtype))
    except (ValueError, KeyError, TypeError, errors.Error):
        raise errors.InputError(f"input {name!r}: dtype {a.dtype} is not one the engine knows") from None


def _output_shapes(inputs, outputs, arrays: dict[str, np.ndarray]) -> list | None:
    """(shape, NumPy dtype) per output if the inputs' shapes fix every output's shape (the
    symbols bound as the engine binds them: by the input axes they size), else None."""
    bound: dict[str, int] = {}
    for info in inputs:
        a = arrays.get(info.name)
        if a is not None and a.ndim == len(info.shape):
            for d, n in zip(info.shape, a.shape):
                if isinstance(d, str):
                    bound.setdefault(d, n)
    out = []
    for info in outputs:
        shape = tuple(_dim_size(d, bound) for d in info.shape)
        if any(n < 0 for n in shape):
            return None   # data-dependent: the engine sizes it while running
        try:
            out.append((shape, _numpy_dtype(info.dtype)))
        except errors.Error:
            return None   # no NumPy dtype for it (bf16 without ml_dtypes): run's message
    return out


def _dim_size(d, bound: dict[str, int]) -> int:
    """An output dim's size with the inputs' symbols bound; -1 where the run decides it (a
    symbol no input binds) or where the engine will refuse it (an expression that overflows)."""
    if isinstance(d, int):
        return d
    if "$" not in d:
        return bound.get(d, -1)
    try:
        return sizes.evaluate(sizes.parse_size(d), bound)
    except (KeyError, ValueError):
        return -1


def _address(a: np.ndarray) -> int:
    """``a``'s data address (C-contiguous): through the buffer protocol where it is writable,
    not empty and of a NumPy dtype, a quarter of what ``a.ctypes.data`` costs (each is per
    tensor per run)."""
    if a.flags.writeable and a.nbytes and a.dtype.isbuiltin == 1:
        return ctypes.addressof(ctypes.c_char.from_buffer(a))
    return a.ctypes.data   # (ml_dtypes' bf16 and fp8 arrays export no buffer)


_MAX_CALLS = 64   # input signatures whose call structures a model keeps


class _Call:
    """What a run with one input signature (names, dtypes, shapes) hands the engine, built
    once and reused: the tensor structs, of which only the data pointers change between
    runs, and the output shapes (None where the engine sizes them while running). This keeps
    a run's Python side to a few microseconds.

    Threads may run at once (ctypes lets go of the GIL in the engine), so a run takes a set of
    structs no other run holds from ``free`` and gives it back after; list.pop and append are
    atomic, and a run that finds ``free`` empty copies the template (``ins``, ``outs``)."""

    def __init__(self, arrays: dict[str, np.ndarray], inputs, outputs):
        self.ins = (_Tensor * max(len(arrays), 1))()
        self.ins_type = type(self.ins)
        self._keep = []   # the names and shapes the structs point to
        for i, (name, a) in enumerate(arrays.items()):
            shape = (ctypes.c_int64 * max(a.ndim, 1))(*a.shape)
            bname = name.encode()
            self._keep += [shape, bname]
            self.ins[i] = _Tensor(bname, _dtype_code(a, name), a.ndim, shape, None, 0)
        self.n_out = len(outputs)
        self.outs = (_Tensor * max(self.n_out, 1))()
        self.outs_type = type(self.outs)
        self.out_names = [o.name for o in outputs]
        self.out_shapes = _output_shapes(inputs, outputs, arrays)
        self.free = [self.structs()]

    def structs(self):
        """A new (inputs, outputs) pair of struct arrays: the template's copies."""
        return self.ins_type.from_buffer_copy(self.ins), self.outs_type()


def _info(ti: _TensorInfo) -> TensorInfo:
    dims = tuple(ti.dim_names[k].decode() for k in range(ti.rank))
    shape = tuple(ti.dim_syms[k].decode() if ti.dim_syms[k] else int(ti.dims[k]) for k in range(ti.rank))
    return TensorInfo(ti.name.decode(), DTYPES[ti.dtype], dims, shape)


# ---------------------------------------------------------------- the model


class NativeModel:
    """A model opened by libmlpack; ``close`` when done (not while a run is inside).

    ``run`` may be called from any number of threads at once and gives what serial runs give
    (the engine keeps each run's state apart; ctypes lets go of the GIL during the C call, so
    runs overlap). Runs share the model's thread pool: one run at a time spreads over it, the
    others run on their own calling threads."""

    def __init__(self, path, *, device=None, precision=None, accuracy_budget=None, strict=False,
                 threads=None, verify=True, artifact=None, fd=None, trusted_keys=None,
                 select_only=False):
        """``fd``: an open file of the container (the engine dup()s it and reads only that file;
        ``path`` then only names it). ``trusted_keys``: the trust policy, as the engine's option
        takes it (a ':'-separated list of PEM files or folders; None: MLPACK_TRUSTED_KEYS).
        ``select_only``: select but load no code (``run`` then fails). ``verify=False`` skips
        hashing the blobs nothing loads; what is loaded is hashed whatever it says."""
        lib = library()
        opts = _Options()
        lib.mlpack_options_init(ctypes.byref(opts))
        if threads is not None:
            if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
                raise errors.Error(f"threads must be a positive integer, got {threads!r}")
            opts.threads = threads
        opts.device = device.encode() if device is not None else None
        opts.precision = precision.encode() if precision is not None else None
        if accuracy_budget is not None:
            if isinstance(accuracy_budget, bool) or not isinstance(accuracy_budget, (int, float)) \
                    or not accuracy_budget >= 0:
                raise errors.Error(f"accuracy budget {accuracy_budget!r} is not a non-negative number")
            opts.accuracy_budget = float(accuracy_budget)
        opts.strict = int(bool(strict))
        opts.verify = int(bool(verify))
        if artifact is not None:  # run exactly this artifact (the engine still checks the host)
            opts.pin_artifact = int(artifact) + 1
        opts.trusted_keys = os.fsencode(trusted_keys) if trusted_keys is not None else None
        opts.select_only = int(bool(select_only))
        self.path = os.fspath(path)
        err = ctypes.c_void_p()
        self._lib = lib
        if fd is not None:
            self._m = lib.mlpack_open_fd(fd, os.fsencode(self.path), ctypes.byref(opts), ctypes.byref(err))
        else:
            self._m = lib.mlpack_open(os.fsencode(self.path), ctypes.byref(opts), ctypes.byref(err))
        if not self._m:
            _raise(err, ERR_FORMAT)
        signer = lib.mlpack_signer(self._m)
        self.signer = signer.decode() if signer else None   # the trusted key that signed it
        self.inputs = self._infos(lib.mlpack_input_count, lib.mlpack_input_info)
        self.outputs = self._infos(lib.mlpack_output_count, lib.mlpack_output_info)
        self.artifacts = [self._verdict(i) for i in range(lib.mlpack_artifact_count(self._m))]
        self._calls: dict[tuple, _Call] = {}

    def _infos(self, count, get) -> list[TensorInfo]:
        out = []
        for i in range(count(self._m)):
            ti = _TensorInfo()
            get(self._m, i, ctypes.byref(ti))
            out.append(_info(ti))
        return out

    def _verdict(self, i: int) -> ArtifactVerdict:
        a = _ArtifactInfo()
        self._lib.mlpack_artifact_info_get(self._m, i, ctypes.byref(a))
        s = lambda b: (b or b"").decode("utf-8", "replace")  # noqa: E731
        return ArtifactVerdict(int(a.index), s(a.device), s(a.precision), s(a.architecture), s(a.variant),
                               bool(a.runnable), bool(a.chosen), s(a.reason))

    @property
    def chosen(self) -> ArtifactVerdict:
        return next(a for a in self.artifacts if a.chosen)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Outputs by name. Where every output's shape follows from the inputs' shapes, the
        engine writes them straight into new arrays (mlpack_run_into); otherwise they are copied
        out of the engine's buffers, which live until this thread's next run. Thread-safe."""
        if self._m is None:
            raise errors.Error(f"{self.path}: model is closed")
        # not np.ascontiguousarray: it turns a 0-d array (a scalar input) into shape (1,)
        arrays = [np.asarray(a, order="C") for a in feeds.values()]
        key = tuple([(name, a.dtype, a.shape) for name, a in zip(feeds, arrays)])
        call = self._calls.get(key)
        if call is None:
            call = _Call(dict(zip(feeds, arrays)), self.inputs, self.outputs)
            if len(self._calls) >= _MAX_CALLS:   # (a model fed ever new shapes)
                self._calls.clear()
            self._calls[key] = call
        try:   # structs no other thread's run holds
            ins, outs = call.free.pop()
        except IndexError:
            ins, outs = call.structs()
        for t, a in zip(ins, arrays):
            t.data, t.nbytes = _address(a), a.nbytes
        err = ctypes.c_void_p()
        if call.out_shapes is not None:
            into = [np.empty(shape, dt) for shape, dt in call.out_shapes]
            for t, out in zip(outs, into):
                t.data, t.nbytes = _address(out), out.nbytes
            st = self._lib.mlpack_run_into(self._m, ins, len(arrays), outs, call.n_out,
                                           ctypes.byref(err))
            call.free.append((ins, outs))
            if st != OK:
                _raise(err, st)
            return dict(zip(call.out_names, into))
        st = self._lib.mlpack_run(self._m, ins, len(arrays), outs, call.n_out, ctypes.byref(err))
        if st != OK:
            _raise(err, st)
        result = {}
        for i in range(call.n_out):
            t = outs[i]
            shape = tuple(int(t.shape[k]) for k in range(t.rank))
            out = np.empty(shape, dtype=_numpy_dtype(DTYPES[t.dtype]))
            if t.nbytes != out.nbytes:
                raise errors.Error(f"output {t.name!r}: engine gave {t.nbytes} bytes for shape {shape}")
            if t.nbytes:
                ctypes.memmove(out.ctypes.data, t.data, t.nbytes)
            result[t.name.decode() if t.name else self.outputs[i].name] = out
        call.free.append((ins, outs))   # (after the copies: outs points into this thread's outputs)
        return result

    def __call__(self, **arrays) -> dict[str, np.ndarray]:
        return self.run(arrays)

    def run_device(self, feeds: dict) -> dict:
        """Outputs by name as ``device.DeviceArray``, from inputs in GPU memory (objects with
        ``__cuda_array_interface__`` or CUDA DLPack producers: device.py), with nothing copied
        between host and GPU (mlpack_run_device). The model must be running a cuda artifact,
        and every output's shape must follow from the inputs' shapes."""
        from mlpack.runtime.device import DeviceArray, device_input

        if self._m is None:
            raise errors.Error(f"{self.path}: model is closed")
        given = {}
        try:
            for name, x in feeds.items():
                given[name] = device_input(name, x)
            key = ("cuda",) + tuple((n, d.dtype, d.shape) for n, d in given.items())
            call = self._calls.get(key)
            if call is None:
                call = _Call(given, self.inputs, self.outputs)
                if len(self._calls) >= _MAX_CALLS:
                    self._calls.clear()
                self._calls[key] = call
            if call.out_shapes is None:
                raise errors.Error(f"{self.path}: an output's shape depends on the data, so it "
                                   "cannot be written into GPU memory sized beforehand; run the "
                                   "model with host arrays")
            try:
                ins, outs = call.free.pop()
            except IndexError:
                ins, outs = call.structs()
            for t, d in zip(ins, given.values()):
                t.data, t.nbytes = d.ptr, d.nbytes
            result = [DeviceArray.empty(self._lib, shape, o.dtype)
                      for (shape, _), o in zip(call.out_shapes, self.outputs)]
            for t, out in zip(outs, result):
                t.data, t.nbytes = out.ptr, out.nbytes
            stream = next((d.stream for d in given.values() if d.stream is not None), None)
            err = ctypes.c_void_p()
            st = self._lib.mlpack_run_device(self._m, ins, len(given), outs, call.n_out, stream,
                                             ctypes.byref(err))
            call.free.append((ins, outs))
            if st != OK:
                _raise(err, st)
            return dict(zip(call.out_names, result))
        finally:
            for d in given.values():
                d.release()

    def close(self) -> None:
        if self._m is not None:
            self._lib.mlpack_close(self._m)
            self._m = None

    def __del__(self):
        if getattr(self, "_m", None) is not None:
            self.close()

    def __enter__(self) -> NativeModel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_model(path, **kw) -> NativeModel:
    """Open a container with the C engine (keyword options as ``NativeModel``)."""
    return NativeModel(path, **kw)


__all__ = ["NativeModel", "TensorInfo", "ArtifactVerdict", "open_model", "library", "library_path",
           "include_dir", "available", "version", "DTYPES"]
