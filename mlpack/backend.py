"""``mlpack.backend``: an ``onnx.backend.base.Backend``, so ONNX's backend test suite runs on mlpack.

Like ``onnxruntime.backend``: ``prepare(model)`` compiles and returns a rep whose ``run(inputs)``
gives the outputs. Every result is computed through mlpack's IR, in one of two modes:

* ``mode="interp"`` (the default): the compiled graph runs on the NumPy reference interpreter;
* ``mode="native"``: the graph is compiled by the cpu target for this host (x86_64-v4/v3/v2 by
  its x86-64 level, aarch64 on arm64) into a container holding that native artifact alone, and
  runs in the C engine (libmlpack). A model the cpu target cannot lower raises
  ``UnsupportedTargetError``: native mode never falls back to the interpreter, so what passes
  in it passed natively.

``MLPACK_BACKEND=native|interp`` picks the mode when ``prepare`` is not given one. When a model
needs an input's *value* at compile time (a Reshape whose target shape is a graph input),
compilation waits for ``run`` and specializes on the values of the integer (and scalar) inputs
it is given, cached per value, in either mode. Otherwise ``prepare`` compiles once and every
``run`` reuses the compiled graph (and, natively, the engine's loaded model).
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.backend.base import Backend, BackendRep

from mlpack.codegen.compile import compile_onnx
from mlpack.codegen.errors import UnsupportedTargetError
from mlpack.spec import environment
from mlpack.spec.errors import Error
from mlpack.spec.ir.interp import run_graph
from mlpack.codegen.onnx.builder import NeedsValue
from mlpack.codegen.onnx.importer import load_model

MODES = ("interp", "native")
ENV_MODE = "MLPACK_BACKEND"


def backend_mode(mode: str | None = None) -> str:
    """``mode``, else $MLPACK_BACKEND, else "interp"; an unknown name is an Error."""
    mode = (mode or environment.get(ENV_MODE) or "interp").strip().lower()
    if mode not in MODES:
        raise Error(f"unknown mlpack backend mode {mode!r} (from mode= or ${ENV_MODE}); "
                    f"modes are: {', '.join(MODES)}")
    return mode


def host_target() -> str:
    """The target native mode compiles for: MLPACK_NATIVE_TARGET (cuda-emulated, cuda-sm90:
    the node suite through the cuda lowering), else the cpu target this host runs best:
    x86_64-v4/v3/v2 by its x86-64 level, or aarch64."""
    from mlpack.runtime.host import detect_host

    named = environment.get("MLPACK_NATIVE_TARGET")
    if named:
        return named

    host = detect_host()
    if host.arch == "amd64" and (host.x86_level or 0) >= 2:
        return f"x86_64-v{min(host.x86_level, 4)}"
    if host.arch == "arm64":
        return "aarch64"
    raise UnsupportedTargetError(f"native mode: no cpu target runs on this host ({host.describe()})")


# ---------------------------------------------------------------- executors: one compiled graph


class _Interpreted:
    """A compiled graph on the NumPy reference interpreter."""

    def __init__(self, graph):
        self.graph = graph
        self.inputs = {p.name for p in graph.inputs}

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return run_graph(self.graph, feeds)


class _Native:
    """A compiled graph lowered by the cpu target and loaded once into the C engine."""

    def __init__(self, graph, name: str, threads: int | None = None):
        from mlpack.codegen.targets import registry
        from mlpack.codegen.targets.cpu import narrowconv
        from mlpack.packager.build import artifact_spec, model_signature
        from mlpack.runtime import native
        from mlpack.spec.container import write_container
        from mlpack.spec.tensorfile import write_tensors

        self.inputs = {p.name for p in graph.inputs}  # specialized inputs are no longer ports
        self.target = host_target()
        target = registry.get(self.target)
        try:
            code = target.compile(graph, "fp32")
        except UnsupportedTargetError as e:  # say which mode asked, so the reason is unambiguous
            raise UnsupportedTargetError(f"native mode ({self.target}): "
                                         f"{str(e).removeprefix('cpu: ')}") from None
        # the engine knows no int4/int2/fp8/fp4: such ports travel as u8, one element a byte
        # (how NumPy holds them), and are viewed back here (narrowconv.py)
        ins, outs = model_signature(graph)
        self.narrow = {sig["name"]: sig["dtype"] for sig in ins + outs
                       if narrowconv.carrier(sig["dtype"]) != sig["dtype"]}
        self._codes, self._view = narrowconv.to_codes, narrowconv.from_codes
        ins, outs = ([{**sig, "dtype": narrowconv.carrier(sig["dtype"])} for sig in part]
                     for part in (ins, outs))
        spec = artifact_spec(name, self.target, "fp32", code, write_tensors(code.tensors(graph)),
                             (ins, outs), "none (mlpack.backend native mode)")
        self.engine = _open_alone(spec, name, threads, write_container, native.open_model,
                                  target.device)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if not self.narrow:
            return self.engine.run(feeds)
        feeds = {k: self._codes(v, self.narrow[k]) if k in self.narrow else v
                 for k, v in feeds.items()}
        outs = self.engine.run(feeds)
        return {k: self._view(v, self.narrow[k]) if k in self.narrow else v
                for k, v in outs.items()}


def _open_alone(spec, name: str, threads, write_container, open_model, device: str = "cpu"):
    """The engine opened on a temporary container holding ``spec`` alone. The file is unlinked
    at once: the engine maps it, so nothing is left behind (as runtime.engine.open_artifact)."""
    fd, path = tempfile.mkstemp(prefix="mlpack-backend-", suffix=".mlpack")
    os.close(fd)
    try:
        write_container(path, name, [spec])
        # the engine must run this artifact or say why not, never anything else
        return open_model(path, device=device, threads=threads, strict=True, verify=False)
    finally:
        os.unlink(path)


# ---------------------------------------------------------------- the rep


def _feeds_key(fixed: dict[str, np.ndarray]) -> bytes:
    return b"".join(k.encode() + np.asarray(v).tobytes() + str(np.shape(v)).encode()
                    for k, v in sorted(fixed.items()))


class MlpackRep(BackendRep):
    def __init__(self, model: onnx.ModelProto, mode: str = "interp", threads: int | None = None):
        self.model = model
        self.mode = mode
        self.threads = threads
        inits = {t.name for t in model.graph.initializer}
        self.input_names = [i.name for i in model.graph.input if i.name not in inits]
        self.output_names = [o.name for o in model.graph.output]
        self._specialized: dict[bytes, Any] = {}
        try:
            self.executor = self._executor(compile_onnx(model))
        except NeedsValue:
            self.executor = None  # compile per integer-input values, in run()

    def _executor(self, graph):
        if self.mode == "native":
            return _Native(graph, self.model.graph.name or "model", self.threads)
        return _Interpreted(graph)

    def _executor_for(self, feeds: dict[str, np.ndarray]):
        if self.executor is not None:
            return self.executor
        # the inputs that can decide a shape: integer/bool tensors, scalars of any type and
        # short float vectors (Resize's scales and roi)
        fixed = {k: v for k, v in feeds.items()
                 if np.asarray(v).dtype.kind in "iub" or np.ndim(v) == 0
                 or (np.ndim(v) == 1 and np.size(v) <= 8)}
        key = _feeds_key(fixed)
        if key not in self._specialized:
            self._specialized[key] = self._executor(compile_onnx(self.model, specialize=fixed))
        return self._specialized[key]

    def run(self, inputs: Any, **kwargs) -> tuple[np.ndarray, ...]:
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        else:
            if isinstance(inputs, (np.ndarray, onnx.TensorProto)):
                inputs = [inputs]
            feeds = dict(zip(self.input_names, inputs))
        feeds = {k: numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else v
                 for k, v in feeds.items()}
        executor = self._executor_for(feeds)
        outs = executor.run({k: np.asarray(v) for k, v in feeds.items() if k in executor.inputs})
        return tuple(outs[n] for n in self.output_names)


class MlpackBackend(Backend):
    @classmethod
    def is_compatible(cls, model, device: str = "CPU", **kwargs) -> bool:
        return device.upper().startswith("CPU")

    @classmethod
    def prepare(cls, model, device: str = "CPU", mode: str | None = None,
                threads: int | None = None, **kwargs) -> MlpackRep:
        """``mode``: "interp" or "native" (default: $MLPACK_BACKEND, else "interp");
        ``threads``: the engine's thread count in native mode (default: the engine's)."""
        return MlpackRep(load_model(model), backend_mode(mode), threads)

    @classmethod
    def run_model(cls, model, inputs, device: str = "CPU", **kwargs):
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.upper().startswith("CPU")


prepare = MlpackBackend.prepare
run_model = MlpackBackend.run_model
run_node = MlpackBackend.run_node
supports_device = MlpackBackend.supports_device
is_compatible = MlpackBackend.is_compatible
