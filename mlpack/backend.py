"""``mlpack.backend``: an ``onnx.backend.base.Backend``, so ONNX's backend test suite runs on mlpack.

Like ``onnxruntime.backend``: ``prepare(model)`` compiles and returns a rep whose ``run(inputs)``
gives the outputs. Every result is computed through mlpack's IR. When a model needs an input's
*value* at compile time (a Reshape whose target shape is a graph input), compilation waits for
``run`` and specializes on the values of the integer (and scalar) inputs it is given, cached
per value.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.backend.base import Backend, BackendRep

from .codegen.compile import compile_onnx
from .spec.ir.interp import run_graph
from .codegen.onnx.builder import NeedsValue
from .codegen.onnx.importer import load_model


class MlpackRep(BackendRep):
    def __init__(self, model: onnx.ModelProto):
        self.model = model
        inits = {t.name for t in model.graph.initializer}
        self.input_names = [i.name for i in model.graph.input if i.name not in inits]
        self.output_names = [o.name for o in model.graph.output]
        self._specialized: dict[bytes, Any] = {}
        try:
            self.graph = compile_onnx(model)
        except NeedsValue:
            self.graph = None  # compile per integer-input values, in run()

    def _graph_for(self, feeds: dict[str, np.ndarray]):
        if self.graph is not None:
            return self.graph
        # the inputs that can decide a shape: integer/bool tensors, scalars of any type and
        # short float vectors (Resize's scales and roi)
        fixed = {k: v for k, v in feeds.items()
                 if np.asarray(v).dtype.kind in "iub" or np.ndim(v) == 0
                 or (np.ndim(v) == 1 and np.size(v) <= 8)}
        key = b"".join(k.encode() + np.asarray(v).tobytes() + str(np.shape(v)).encode()
                       for k, v in sorted(fixed.items()))
        if key not in self._specialized:
            self._specialized[key] = compile_onnx(self.model, specialize=fixed)
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
        graph = self._graph_for(feeds)
        wanted = {p.name for p in graph.inputs}
        outs = run_graph(graph, {k: np.asarray(v) for k, v in feeds.items() if k in wanted})
        return tuple(outs[n] for n in self.output_names)


class MlpackBackend(Backend):
    @classmethod
    def is_compatible(cls, model, device: str = "CPU", **kwargs) -> bool:
        return device.upper().startswith("CPU")

    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs) -> MlpackRep:
        return MlpackRep(load_model(model))

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
