"""``mlpack.load``: open a container, select an artifact, check inputs, run, validate.

    m = mlpack.load("model.mlpack")          # checks, selects, loads verified copies
    y = m(x=x)["y"]                          # or m.run({"x": x})
    [y] = m.run(None, {"x": x})              # ONNX Runtime's shape: a list, in output order
    m.validate().ok                          # the bundled test vectors, on this artifact

``get_inputs()``/``get_outputs()`` and ``run(output_names, feeds)`` have ONNX Runtime's
``InferenceSession`` shape, so code written for ORT runs unchanged. Every record a user may
print has a one-line repr.

Selection is the C engine's (engine.py): the container is opened by the Python reader (exact
format errors), then by libmlpack, whose verdicts become ``Model.verdicts``. A native artifact runs
in the engine (``threads``: its thread pool; None: ``MLPACK_NUM_THREADS``, else every core); the
portable one runs on the NumPy interpreter. Without libmlpack (or with an explicit ``host``, which
the engine cannot take) Python's select.py chooses among what Python runs: the portable artifact.

Loading reads each blob the chosen executor needs (code, weights) into memory once and hashes
that copy as it reads it: what runs is what was verified, whatever happens to the file meanwhile
(the engine reads the same open file, never the path again). With a trust policy
(``trusted_keys``, MLPACK_TRUSTED_KEYS) the container's signature is checked before anything is
loaded; without one, native code from an unsigned file loads with ``UnsignedContainerWarning``.
Falling back to the portable interpreter is loud: ``PortableFallbackWarning`` says why
nothing faster fit (also when the container has no native artifact at all: the reason is then
"this container has no native artifact"); Python's warning filter shows a message once per place,
so a loop of loads warns once. ``strict=True`` raises ``PortableFallbackError`` instead. Asking
for ``device="portable"`` is not a fallback and does not warn.

Inputs are checked against the signature before anything runs (``check_feeds``): a missing or
unknown input, a wrong dtype (never cast silently), a wrong rank, a wrong size for a fixed dim,
or a symbolic dim bound to two sizes is an ``InputError`` naming the input and the dim. Input dims
are counts or symbols (the format allows expressions of symbols in output dims only), so the
inputs bind every symbol an output's size can be computed from.

The test-vector layer is a tensor archive with tensors ``case{i}/input/{name}`` and
``case{i}/output/{name}`` and metadata ``{"cases": N}``.
"""

from __future__ import annotations

import statistics
import threading
import time
import warnings
from dataclasses import dataclass

import numpy as np

from mlpack.spec import accuracy, media, signing
from mlpack.spec import sizes
from mlpack.spec.container import Artifact, open_container
from mlpack.spec.errors import (Error, FormatError, InputError, PortableFallbackError,
                                PortableFallbackWarning, UnsignedContainerWarning)
from mlpack.spec.ir import dtypes
from mlpack.spec.tensorfile import read_header, read_tensors

from mlpack.runtime.host import Host, detect_host
from mlpack.runtime import engine, registry
from mlpack.runtime.portable import PortableExecutor
from mlpack.runtime.device import is_device_array
from mlpack.runtime.select import Verdict, check_policy, describe, select_artifact

# the code this Python runtime executes itself; native code runs in the C engine (engine.py)
EXECUTORS = {media.PROGRAM_PORTABLE: PortableExecutor}


# ---------------------------------------------------------------- public records

# IR dtype -> the ONNX element type name ONNX Runtime prints inside "tensor(...)"
_ORT_TYPES = {
    "f32": "float", "f64": "double", "f16": "float16", "bf16": "bfloat16", "bool": "bool",
    "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64", "i4": "int4", "i2": "int2",
    "u8": "uint8", "u16": "uint16", "u32": "uint32", "u64": "uint64", "u4": "uint4", "u2": "uint2",
    "f8e4m3fn": "float8e4m3fn", "f8e4m3fnuz": "float8e4m3fnuz", "f8e5m2": "float8e5m2",
    "f8e5m2fnuz": "float8e5m2fnuz", "f8e8m0": "float8e8m0", "f4e2m1": "float4e2m1",
}


def _few(items, n: int = 4) -> str:
    """``items`` joined by commas, the first ``n`` of them: a repr stays one short line."""
    items = [str(i) for i in items]
    more = f", ... (+{len(items) - n} more)" if len(items) > n else ""
    return ", ".join(items[:n]) + more


@dataclass(frozen=True)
class TensorInfo:
    """One input or output of the signature, in ONNX axis order."""

    name: str
    dtype: str  # the IR's name: f32, i64, ...
    dims: tuple[str, ...]  # dim names
    # a count, a symbol name such as "batch", or (outputs) a size expression such as
    # "2 * $batch" (spec/sizes.py), told apart from a name by its "$"
    shape: tuple[int | str, ...]

    @property
    def type(self) -> str:
        """ONNX Runtime's name for the type: ``tensor(float)``, ``tensor(int64)``, ..."""
        return f"tensor({_ORT_TYPES.get(self.dtype, self.dtype)})"

    def __str__(self) -> str:
        dims = [f"{d}={s}" if isinstance(s, int) or "$" in s else d if s == d else f"{d}=${s}"
                for d, s in zip(self.dims, self.shape)]
        return f"{self.name}: {self.dtype}[{', '.join(dims)}]"

    def __repr__(self) -> str:
        return f"<TensorInfo {self}>"


@dataclass(frozen=True)
class ArtifactInfo:
    """The chosen artifact, for display: where it runs and why it was chosen."""

    index: int
    device: str
    precision: str
    platform: str | None  # "linux/amd64/v3"; None for portable
    target: str
    reason: str

    def __repr__(self) -> str:
        where = f"{self.device} {self.precision}" + (f" {self.platform}" if self.platform else "")
        return f"<ArtifactInfo {self.index}: {where}, target {self.target}: {self.reason}>"


@dataclass(frozen=True)
class OutputCheck:
    """One output over every test case: its errors against the float64 reference, the
    baseline's (ONNX Runtime's, or the fp32 interpreter's for custom ops), the bound they set and the verdict (``spec/accuracy.py``).

    A container written before the float64 reference (format 1.x with no ``reference64``
    vectors) is judged as it was written, by its config's rtol/atol against the recorded
    outputs: then ``rtol``/``atol`` are set and the baseline and bounds are None."""

    name: str
    max_error: float          # max |y - ref| / max |ref|
    rel_l2: float             # ||y - ref|| / ||ref||
    max_abs_error: float      # max |y - ref|
    ok: bool
    allowed_max_error: float | None = None
    allowed_rel_l2: float | None = None
    baseline_max_error: float | None = None
    baseline_rel_l2: float | None = None
    top1: float | None = None  # share of rows whose argmax agrees (class-score outputs)
    note: str = ""
    rtol: float | None = None
    atol: float | None = None
    baseline: str = "ONNX Runtime"   # what the baseline is (accuracy.baseline_word)

    @property
    def max_rel_error(self) -> float:  # the name the format's 1.0 configs used
        return self.max_error

    def __repr__(self) -> str:
        if self.note or not self.ok:
            return f"<OutputCheck {'ok' if self.ok else 'FAILED'}: {self.detail()}>"
        return (f"<OutputCheck ok: output {self.name!r}: max error {self.max_error:.3g}, "
                f"rel L2 {self.rel_l2:.3g}>")

    def detail(self) -> str:
        """Why it failed, in one clause."""
        if self.note:
            return f"output {self.name!r}: {self.note}"
        if self.allowed_max_error is None:
            return (f"output {self.name!r}: max abs error {self.max_abs_error:.3g} (allowed "
                    f"atol {self.atol:g}, rtol {self.rtol:g})")
        return accuracy.bound_text(self.name, self.max_error, self.allowed_max_error,
                                   self.rel_l2, self.allowed_rel_l2, self.baseline_max_error,
                                   self.baseline_rel_l2, self.baseline)


@dataclass(frozen=True)
class ValidationResult:
    """The bundled test vectors run on one artifact."""

    artifact: ArtifactInfo
    cases: int
    outputs: tuple[OutputCheck, ...]
    # the qemu-user program that ran the artifact of another architecture ("qemu-aarch64",
    # packager/emulate.py); "" when this host ran it
    emulator: str = ""
    # median seconds of a run, when the build timed the artifact too (Model.time)
    seconds: float | None = None

    @property
    def ok(self) -> bool:
        return self.cases > 0 and all(o.ok for o in self.outputs)

    def __repr__(self) -> str:
        failed = [o for o in self.outputs if not o.ok]   # the first one, and how many more
        why = f": {failed[0].detail()}" if failed else "" if self.cases else ": no test vectors"
        why += f" (+{len(failed) - 1} more)" if len(failed) > 1 else ""
        where = f" under {self.emulator}" if self.emulator else ""
        return (f"<ValidationResult {'ok' if self.ok else 'FAILED'}: {self.cases} case(s), "
                f"{len(self.outputs)} output(s), artifact {self.artifact.index} "
                f"({self.artifact.device} {self.artifact.precision}){where}{why}>")


def _tensor_infos(sigs: list[dict]) -> list[TensorInfo]:
    def size(s):  # "$batch" -> "batch"; an expression stays as written
        return s[1:] if isinstance(s, str) and isinstance(sizes.parse_size(s), str) else s
    return [TensorInfo(s["name"], s["dtype"], tuple(d["name"] for d in s["dims"]),
                       tuple(size(d["size"]) for d in s["dims"])) for s in sigs]


def _platform_text(art: Artifact) -> str | None:
    p = art.platform
    if not p:
        return None
    return "/".join(x for x in (p.get("os"), p.get("architecture"), p.get("variant")) if x)


def _artifact_info(art: Artifact, reason: str) -> ArtifactInfo:
    return ArtifactInfo(art.index, art.device, art.precision, _platform_text(art),
                        art.config["artifact"]["target"], reason)


# ---------------------------------------------------------------- input checks


def _numpy_dtype(info: TensorInfo, path: str) -> np.dtype:
    try:
        return dtypes.to_numpy(info.dtype)
    except KeyError:
        raise FormatError(f"{path}: input {info.name!r} has dtype {info.dtype!r}, unknown to this "
                          "runtime") from None


def _check_one(info: TensorInfo, a: np.ndarray, want: np.dtype, bound: dict) -> None:
    if a.dtype != want:
        raise InputError(f"input {info.name!r} is {a.dtype}, the model takes {info.dtype} "
                         f"({want}); convert it (mlpack never casts silently)")
    if a.ndim != len(info.dims):
        raise InputError(f"input {info.name!r} has rank {a.ndim} (shape {tuple(a.shape)}), the "
                         f"model takes rank {len(info.dims)}: {info}")
    for axis, (dim, size, n) in enumerate(zip(info.dims, info.shape, a.shape)):
        if isinstance(size, int):
            if n != size:
                raise InputError(f"input {info.name!r} dim {dim!r} (axis {axis}) is {n}, the "
                                 f"model takes {size}")
        elif size in bound and bound[size][0] != n:
            first, who = bound[size]
            raise InputError(f"input {info.name!r} dim {size!r} (axis {axis}) is {n}, but input "
                             f"{who!r} bound {size}={first}")
        else:
            bound.setdefault(size, (n, info.name))


_MAX_SIGNATURES = 64   # feed signatures a model remembers as checked (then it checks the rest)
_UNLOADED = object()   # a model's executor after ``unload``: loaded again by its next run


def _signature(feeds) -> tuple | None:
    """(name, dtype, shape) of each feed when ``feeds`` is a dict of plain arrays, else None."""
    if not isinstance(feeds, dict):
        return None
    sig = []
    for name, a in feeds.items():
        if type(a) is not np.ndarray:
            return None
        sig.append((name, a.dtype, a.shape))
    return tuple(sig)


def check_feeds(inputs: list[TensorInfo], feeds, path: str = "") -> dict[str, np.ndarray]:
    """``feeds`` checked against the signature (see the module docstring); arrays by name."""
    if not isinstance(feeds, dict):
        raise InputError(f"inputs must be a dict of name -> array, got {type(feeds).__name__}")
    names = [i.name for i in inputs]
    extra = [k for k in feeds if k not in names]
    if extra:
        raise InputError(f"unknown input {extra[0]!r}; the model's inputs are {', '.join(names)}")
    out, bound = {}, {}
    for info in inputs:
        if info.name not in feeds:
            raise InputError(f"missing input {info.name!r} ({info})")
        a = feeds[info.name]
        a = a if isinstance(a, np.ndarray) else np.asarray(a)
        _check_one(info, a, _numpy_dtype(info, path), bound)
        out[info.name] = a
    return out


# ---------------------------------------------------------------- the model


class Verdicts(list):
    """``Model.verdicts``: a list of ``Verdict``, printed one artifact per line."""

    def __repr__(self) -> str:
        return "[" + ",\n ".join(map(repr, self)) + "]"


def _fallback_reason(verdicts: list[Verdict]) -> str:
    native = [v for v in verdicts if v.artifact.device != "portable"]
    if not native:
        return "this container has no native artifact"
    return "no native artifact fits: " + "; ".join(
        f"{describe(v.artifact)}: {v.reason.removeprefix('passed over: ')}" for v in native)


class Model:
    """A loaded model: the chosen artifact ready to run. Use ``load`` to make one.

    ``run`` (and calling the model) may be used from any number of threads at once, with the
    results serial runs give: a native artifact's runs overlap in the engine (each its own state;
    one run at a time spreads over the model's thread pool, the others run on their calling
    threads), the portable interpreter keeps all of a run's state in that run. ``close`` once no
    run is inside."""

    def __init__(self, path, *, device=None, precision=None, accuracy_budget=None, strict=False,
                 threads=None, host: Host | None = None, trusted_keys=None):
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                    or threads < 1):
            raise Error(f"threads must be a positive integer, got {threads!r}")
        self.threads = threads  # None: the engine's default (MLPACK_NUM_THREADS, else every core)
        check_policy(device, precision, accuracy_budget)  # before the engine: same messages
        # oci://REGISTRY/REPO:TAG: this host's artifact (and the signatures) pulled into the cache
        path = registry.local_file(path, device=device, precision=precision,
                                   accuracy_budget=accuracy_budget, host=host,
                                   trusted_keys=trusted_keys)
        # the Python reader first: it names the exact FormatError of a broken file. Its JSON
        # documents are verified; every blob an executor loads is hashed from that executor's
        # own copy (here, and in the engine, which reads this same open file, never the path)
        self._container = open_container(path, verify=False)
        self.path = self._container.path
        self.host = host or detect_host()
        self._executor = None
        self._loading = threading.Lock()    # (``unload``: the next run loads it again)
        self._checked: set[tuple] = set()   # feed signatures check_feeds has passed
        try:
            self._trust = signing.policy_spec(trusted_keys)
            # the key that signed it, checked before anything is loaded; None without a policy
            self.signer = self._check_trust()
            policy = {"device": device, "precision": precision, "accuracy_budget": accuracy_budget}
            if host is None and engine.available():
                art, why = self._select_in_engine(policy)
            else:
                art, why = self._select_in_python(policy, explicit_host=host is not None)
            if art.device == "portable" and device != "portable":
                self._fall_back(strict, why)
            self._art = art
            self.artifact = _artifact_info(art, next(v.reason for v in self.verdicts if v.chosen))
            self.inputs = _tensor_infos(art.config["model"]["inputs"])
            self.outputs = _tensor_infos(art.config["model"]["outputs"])
            if self._executor is None:
                self._executor = self._executor_for(art)
        except BaseException:
            self.close()
            raise

    def _check_trust(self) -> str | None:
        """With a trust policy, the trusted key that signed the container (SignatureError when
        none did); without one, None, and loading native code from an unsigned file warns."""
        if not self._trust:
            return None
        return signing.check(self._container, signing.load_trusted_keys(self._trust))

    def _warn_unsigned(self, art: Artifact) -> None:
        if self.signer is None and not self._container.signatures and art.device != "portable":
            warnings.warn(UnsignedContainerWarning(
                f"{self.path} is unsigned: loading its native code ({describe(art)}) without "
                "knowing who made it; set a trust policy (trusted_keys=, MLPACK_TRUSTED_KEYS) "
                "to require a signature (mlpack sign)"), stacklevel=4)

    def _select_in_engine(self, policy) -> tuple[Artifact, str | None]:
        """The engine selects (and, for a native artifact, stays open to run it)."""
        handle, load_error = engine.open_engine(self._container, threads=self.threads,
                                                trusted_keys=self._trust, **policy)
        self.engine = engine.describe_engine()
        self.verdicts = Verdicts(engine.verdicts(handle, self._container, load_error))
        art = next(v.artifact for v in self.verdicts if v.chosen)
        if art.device == "portable":
            handle.close()  # the NumPy interpreter runs portable programs faster than the engine's
        else:
            self._warn_unsigned(art)
            self._executor = engine.NativeExecutor(handle)
        why = f"the engine could not load the native artifact it chose: {load_error}" if load_error \
            else None
        return art, why

    def _select_in_python(self, policy, explicit_host: bool) -> tuple[Artifact, str | None]:
        """No engine (or an explicit ``host``, which the engine cannot take): Python selects among
        the artifacts Python runs, the portable ones."""
        self.engine = "python" if explicit_host else engine.describe_engine()
        art, verdicts = select_artifact(self._container, self.host, code_types=set(EXECUTORS),
                                        **policy)
        self.verdicts = Verdicts(verdicts)
        native = any(v.artifact.device != "portable" for v in self.verdicts)
        why = None
        if not explicit_host and native:
            reason = engine.unavailable_reason() or \
                "libmlpack is not built (pip install -e . or make -C runtime/c)"
            why = f"{reason}, so native artifacts cannot run"
        return art, why

    def _fall_back(self, strict: bool, why: str | None) -> None:
        why = why or _fallback_reason(self.verdicts)
        msg = f"{self.path}: running the portable interpreter (slow): {why}"
        if strict:
            raise PortableFallbackError(msg + " (strict=True forbids falling back)")
        warnings.warn(PortableFallbackWarning(msg), stacklevel=4)

    def _executor_for(self, art: Artifact):
        """An executor for ``art``: the NumPy interpreter for portable code, else the engine."""
        code = next((layer for layer in art.layers if layer.media_type in EXECUTORS), None)
        if code is not None:
            return EXECUTORS[code.media_type](self._container, art)
        if not engine.available():
            raise Error(f"{self.path}: artifact {art.index} is native code and libmlpack is not "
                        "built (pip install -e . or make -C runtime/c)")
        return engine.NativeExecutor(engine.open_artifact(self._container, art, self.threads,
                                                          self._trust))

    # ---- running

    def run(self, output_names, input_feed=None) -> dict[str, np.ndarray] | list[np.ndarray]:
        """Run the model; outputs in ONNX axis order.

        ``run(feeds)``: every output, by name (a dict in signature order).
        ``run(output_names, feeds)``: as ONNX Runtime's ``InferenceSession.run``, a list of the
        outputs named (None: all of them), in that order."""
        if input_feed is None:  # run(feeds)
            return self._run(output_names)
        if output_names is None:
            return list(self._run(input_feed).values())
        if isinstance(output_names, str) or not all(isinstance(n, str) for n in output_names):
            raise InputError(f"output_names must be a list of output names or None, got "
                             f"{output_names!r}")
        known = [o.name for o in self.outputs]
        for name in output_names:
            if name not in known:
                raise InputError(f"unknown output {name!r}; the model's outputs are "
                                 f"{', '.join(known)}")
        got = self._run(input_feed)
        return [got[name] for name in output_names]

    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._executor is None:
            raise Error(f"{self.path}: the model is closed")
        if self._executor is _UNLOADED:
            with self._loading:   # (runs from many threads load it once)
                if self._executor is _UNLOADED:
                    self._executor = self._executor_for(self._art)
        if isinstance(feeds, dict) and any(map(is_device_array, feeds.values())):
            return self._run_device(feeds)
        # a signature (names, dtypes, shapes) that passed once passes again: the checks look
        # at nothing else, and they are a fifth of a small model's Python side
        key = _signature(feeds)
        if key is not None and key in self._checked:
            checked = feeds
        else:
            checked = check_feeds(self.inputs, feeds, self.path)
            if key is not None and len(self._checked) < _MAX_SIGNATURES:
                self._checked.add(key)
        got = self._executor.run(checked)
        return {o.name: got[o.name] for o in self.outputs}

    def __call__(self, **arrays) -> dict[str, np.ndarray]:
        return self._run(arrays)

    def _run_device(self, feeds: dict) -> dict:
        """GPU tensors in, ``DeviceArray`` out (runtime/device.py), for a model on a cuda
        artifact; the engine checks names, dtypes and shapes as for host arrays."""
        host = [name for name, x in feeds.items() if not is_device_array(x)]
        if host:
            raise InputError(f"input {host[0]!r} is in host memory while other inputs are on the "
                             "GPU; give every input on the GPU, or every input as a host array")
        engine_model = getattr(self._executor, "engine", None)
        if self._art.device != "cuda" or engine_model is None:
            raise InputError(f"{self.path}: GPU tensors need a model running on CUDA, and this one "
                             f"runs {describe(self._art)}; load it with device='cuda' on a host "
                             "with a GPU")
        got = engine_model.run_device(feeds)
        return {o.name: got[o.name] for o in self.outputs}

    def get_inputs(self) -> list[TensorInfo]:
        """The inputs, as ONNX Runtime's ``get_inputs``: each has ``.name``, ``.shape`` (counts,
        or symbol names such as ``'batch'``) and ``.type`` (``'tensor(float)'``)."""
        return list(self.inputs)

    def get_outputs(self) -> list[TensorInfo]:
        """The outputs, as ONNX Runtime's ``get_outputs`` (see ``get_inputs``)."""
        return list(self.outputs)

    # ---- test vectors and validation

    def test_vectors(self) -> list[tuple[dict, dict]]:
        """The bundled (inputs, expected outputs) cases of the chosen artifact; [] if none."""
        return [(ins, outs) for ins, outs, _ in vector_cases(self._container, self._art)]

    def validate(self, artifact=None) -> ValidationResult:
        """Run the bundled test vectors on ``artifact`` (an index or an Artifact;
        None: the chosen one) and
        compare each output with the tolerances recorded in that artifact's config."""
        return self._on(artifact, self._validate)

    def time(self, artifact=None, runs: int = 5) -> float | None:
        """The median seconds of ``runs`` runs of the first bundled test case on ``artifact``
        (as ``validate`` names it), at this model's thread count; None without test vectors."""
        return self._on(artifact, lambda art, executor: self._time(art, executor, runs))

    def _on(self, artifact, use):
        """``use(artifact, its executor)`` for ``artifact`` (None: the chosen one)."""
        if self._executor is None:
            raise Error(f"{self.path}: the model is closed")
        if isinstance(artifact, Artifact):
            artifact = artifact.index
        if artifact is None:
            artifact = self._art.index
        if artifact == self._art.index and self._executor is not _UNLOADED:
            return use(self._art, self._executor)
        art = self._runnable(artifact)
        executor = self._executor_for(art)
        try:
            return use(art, executor)
        finally:
            executor.close()

    def vector_outputs(self, artifact=None, seconds: list | None = None) -> list[dict]:
        """The outputs of ``artifact`` (as ``validate`` names it) on each bundled test case,
        unjudged: what ``validate`` judges (``judge_vectors``). ``seconds``, a list, gets each
        case's run time appended (a build predicts its emulated runs from them)."""
        return self._on(artifact, lambda art, executor: self._outputs(art, executor, seconds))

    def _outputs(self, art: Artifact, executor, seconds: list | None = None) -> list[dict]:
        out = []
        for feeds, _, _ in vector_cases(self._container, art):
            feeds = check_feeds(self.inputs, feeds, self.path)
            t0 = time.perf_counter()
            out.append(executor.run(feeds))
            if seconds is not None:
                seconds.append(time.perf_counter() - t0)
        return out

    def _validate(self, art: Artifact, executor) -> ValidationResult:
        cases = vector_cases(self._container, art)
        got = self._outputs(art, executor)
        reason = next(v.reason for v in self.verdicts if v.artifact is art)
        return judge_vectors(art, cases, got, reason)

    def _time(self, art: Artifact, executor, runs: int) -> float | None:
        cases = vector_cases(self._container, art)
        if not cases:
            return None
        feeds = check_feeds(self.inputs, cases[0][0], self.path)
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            executor.run(feeds)
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    def blind_spots(self) -> list[str]:
        """Outputs the bundled test vectors cannot judge (``spec.accuracy.blind_spots``)."""
        return accuracy.blind_spots([ref or want for _, want, ref in
                                     vector_cases(self._container, self._art)])

    def _runnable(self, index) -> Artifact:
        verdict = next((v for v in self.verdicts if v.artifact.index == index), None)
        if verdict is None:
            raise Error(f"{self.path}: there is no artifact {index!r} "
                        f"(it has {len(self.verdicts)})")
        if not verdict.runnable:
            raise Error(f"{self.path}: artifact {index} cannot run here: {verdict.reason}")
        return verdict.artifact

    # ---- lifetime

    def unload(self) -> None:
        """Free what the chosen artifact holds while it is loaded (its packed weights, its
        threads, its GPU memory); the model stays open and its next run loads it again. (A
        build validates a container's artifacts one by one: the chosen one held beside each of
        the others doubled a 500 MB model's footprint.) As ``close``: once no run is inside."""
        if self._executor is not None and self._executor is not _UNLOADED:
            self._executor.close()
            self._executor = _UNLOADED

    def close(self) -> None:
        if getattr(self, "_executor", None) not in (None, _UNLOADED):
            self._executor.close()
        self._executor = None
        self._container.close()

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<mlpack.Model {self.path!r} on {describe(self._art)}: "
                f"{_few(self.inputs)} -> {_few(self.outputs)}>")


def judge_vectors(art: Artifact, cases: list, got: list[dict], reason: str,
                  emulator: str = "") -> ValidationResult:
    """``got``, the outputs of ``art`` on each of ``cases`` (``vector_cases``), judged as
    ``Model.validate`` judges them: against the float64 reference by the precision's tolerance
    (spec/accuracy.py), or a 1.0 container's own rtol/atol. ``reason`` is this host's verdict on
    the artifact; ``emulator`` names the qemu-user program that ran it, if one did
    (packager/emulate.py: the same judgement for artifacts of another architecture)."""
    acc = art.config.get("accuracy") or {}
    names = [o["name"] for o in art.config["model"]["outputs"]]
    wants = [want for _, want, _ in cases]
    if cases and all(ref for _, _, ref in cases):
        checks = _judged(names, got, wants, [ref for _, _, ref in cases],
                         accuracy.tolerance_for(art.precision, acc.get("tolerance")),
                         accuracy.baseline_word(acc.get("baseline")))
    else:  # written before the float64 reference: its own rtol/atol against its outputs
        checks = _legacy_checks(names, got, wants, float(acc.get("rtol", 1e-5)),
                                float(acc.get("atol", 1e-6)))
    return ValidationResult(_artifact_info(art, reason), len(cases), checks, emulator)


def _judged(names, got: list, baseline: list, refs: list, tol,
            word: str) -> tuple[OutputCheck, ...]:
    """Each output over the cases, against the float64 reference (spec/accuracy.py);
    ``word`` names the baseline in messages."""
    out = []
    for name in names:
        mine, base = accuracy.Errors(), accuracy.Errors()
        for g, b, r in zip(got, baseline, refs):
            if name in r:
                mine = mine.worst(accuracy.measure(g[name], r[name], b.get(name)))
                if name in b:
                    base = base.worst(accuracy.measure(b[name], r[name]))
        v = accuracy.judge(name, mine, base, tol)
        out.append(OutputCheck(name, mine.max_error, mine.rel_l2, mine.max_abs_error, v.ok,
                               v.allowed_max_error, v.allowed_rel_l2, base.max_error,
                               base.rel_l2, mine.top1, mine.problem(), baseline=word))
    return tuple(out)


def _legacy_checks(names, got: list, want: list, rtol: float, atol: float) -> tuple:
    out = []
    for name in names:
        w = [0.0, 0.0, True, ""]
        for g, e in zip(got, want):
            if name in e:
                _accumulate(w, g[name], e[name], rtol, atol)
        out.append(OutputCheck(name, w[1], w[1], w[0], w[2], note=w[3], rtol=rtol, atol=atol))
    return tuple(out)


def _accumulate(w: list, got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> None:
    """Fold one case's rtol/atol comparison into ``w`` = [max abs, max rel, ok, note]."""
    if got.shape != want.shape:
        w[2], w[3] = False, f"shape {got.shape} != expected {want.shape}"
        return
    if not _is_float(want.dtype):
        same = np.array_equal(got, want)
        w[0] = max(w[0], 0.0 if same else float("inf"))
        w[2] = w[2] and same
        return
    g, e = got.astype(np.float64), want.astype(np.float64)
    with np.errstate(invalid="ignore"):  # inf - inf is nan: allclose below judges those
        diff = np.abs(g - e)
    keep = ~np.isnan(diff)
    if keep.any():
        # relative to the expected magnitude, floored at atol: near-zero outputs are judged by atol
        rel = diff[keep] / np.maximum(np.abs(e[keep]), max(atol, np.finfo(np.float64).tiny))
        w[0], w[1] = max(w[0], float(diff[keep].max())), max(w[1], float(rel.max()))
    w[2] = w[2] and bool(np.allclose(g, e, rtol=rtol, atol=atol, equal_nan=True))


def _is_float(dt: np.dtype) -> bool:
    try:
        return dtypes.is_float(dtypes.from_numpy(dt))
    except KeyError:
        return False


def vector_cases(container, art: Artifact) -> list[tuple[dict, dict, dict]]:
    """The artifact's test cases as (inputs, baseline outputs, float64 reference outputs), the
    archive read once; [] without a vector layer, and {} references in a 1.0 container."""
    layer = art.layer(media.TESTVECTORS)
    if layer is None:
        return []
    blob = container.blob(layer.digest)
    meta = read_header(blob).get("metadata") or {}
    tensors = read_tensors(blob)
    n = meta.get("cases")
    if not isinstance(n, int):  # no count recorded: as many as the names say
        n = len({k.split("/", 1)[0] for k in tensors if k.startswith("case")})
    return [tuple(_case_part(tensors, f"case{i}/{part}/")
                  for part in ("input", "output", "reference64")) for i in range(n)]


def _case_part(tensors: dict, prefix: str) -> dict:
    return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}


def load(path, *, device=None, precision=None, accuracy_budget=None, strict=False, threads=None,
         host: Host | None = None, trusted_keys=None) -> Model:
    """Open ``path``, select the artifact this host runs best, and make it ready to run.
    ``path`` may be ``oci://REGISTRY/REPO:TAG``: the artifact this host runs under the policy
    below, and the signatures, are pulled into the registry cache first (runtime/registry/).

    ``device`` (cpu, cuda, portable) and ``precision`` (fp32, fp16, bf16, int8) restrict the
    choice; ``accuracy_budget`` picks the fastest artifact whose recorded max_error is within
    it; ``strict`` forbids the portable fallback; ``host`` overrides detection (for "what would
    that machine pick"). ``trusted_keys`` is the trust policy: Ed25519 public keys (a PEM file,
    a folder of .pub/.pem files, a ':'-separated string or a list of them; None:
    MLPACK_TRUSTED_KEYS, "" for none): the container must be signed by one of them (mlpack sign),
    checked here and again by the engine before any code is loaded, else SignatureError.
    Without a policy, native code from an unsigned container loads with an
    UnsignedContainerWarning. Raises a FormatError subclass for a broken container and
    NoRunnableArtifactError when nothing fits.
    """
    return Model(path, device=device, precision=precision, accuracy_budget=accuracy_budget,
                 strict=strict, threads=threads, host=host, trusted_keys=trusted_keys)


__all__ = ["load", "Model", "TensorInfo", "ArtifactInfo", "ValidationResult", "OutputCheck",
           "check_feeds"]
