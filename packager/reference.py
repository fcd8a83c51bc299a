"""Run a model on the NumPy reference interpreter, with the inputs checked first.

``run_reference(model, {name: array})`` compiles the model (specializing integer inputs when an
op needs their values at compile time, as ``mlpack.backend`` does) and evaluates the IR graph
with ``spec.ir.interp.run_graph``. Wrong names, ranks and dtypes are ``InputError``s naming
the input, before anything runs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..spec.errors import InputError


def _signature(model) -> dict[str, tuple[str, int]]:
    """{graph input name: (IR dtype, rank)} for the inputs that are not initializers."""
    from ..codegen.onnx.importer import ONNX_DTYPES

    inits = {t.name for t in model.graph.initializer}
    out = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        out[vi.name] = (ONNX_DTYPES.get(tt.elem_type, "?"), len(tt.shape.dim))
    return out


def check_inputs(model, feeds: dict[str, np.ndarray]) -> None:
    """Raise InputError unless ``feeds`` gives each graph input once, with its dtype and rank."""
    from ..spec.ir import dtypes as dt

    sig = _signature(model)
    unknown = sorted(set(feeds) - set(sig))
    if unknown:
        raise InputError(f"the model has no input {unknown[0]!r}; its inputs are {sorted(sig)}")
    missing = [n for n in sig if n not in feeds]
    if missing:
        raise InputError(f"missing input {missing[0]!r}; the model needs {sorted(sig)}")
    for name, (dtype, rank) in sig.items():
        arr = np.asarray(feeds[name])
        try:
            got = dt.from_numpy(arr.dtype)
        except KeyError:
            got = str(arr.dtype)
        if dtype != "?" and got != dtype:
            raise InputError(f"input {name!r} has dtype {got}, the model wants {dtype}")
        if arr.ndim != rank:
            raise InputError(f"input {name!r} has rank {arr.ndim} (shape {list(arr.shape)}), "
                             f"the model wants rank {rank}")


def run_reference(model: Any, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The outputs of ``model`` (path, bytes or ModelProto) on ``feeds``, by output name."""
    from ..backend import MlpackRep
    from ..codegen.onnx.importer import load_model

    proto = load_model(model)
    check_inputs(proto, feeds)
    rep = MlpackRep(proto)
    outs = rep.run({k: np.asarray(v) for k, v in feeds.items()})
    return dict(zip(rep.output_names, outs))
