"""Every precision mlpack knows, one module each: a rewrite of the optimized graph applied
before a target compiles it (fp32 is the identity), verified like any pass, with the tolerance
its artifacts are judged by (spec/accuracy.py) and the targets that build it (the registry in
codegen/targets/registry.py lists each target's precisions).

A precision module has ``NAME``, ``SUMMARY``, ``IMPLEMENTED``, ``DEFAULT`` (built when a build
names no precision) and ``rewrite(graph) -> graph``; one that needs the model's activation
ranges (int8) also has ``calibrate(graph, feeds) -> calibration`` and takes it as
``rewrite(graph, calibration)`` (``calibrates`` says which: the build runs it once for all
targets).
A name of the spec's vocabulary (spec/media.py's PRECISIONS) with no module yet is planned: it
is listed, and refused by name when asked for.
"""

from __future__ import annotations

import importlib
from types import ModuleType, SimpleNamespace

from mlpack.codegen.errors import UnsupportedTargetError
from mlpack.spec import accuracy, media
from mlpack.spec.ir.graph import Graph
from mlpack.spec.ir.verify import verify

MODULES = {"fp32": "mlpack.codegen.precisions.fp32", "fp16": "mlpack.codegen.precisions.fp16",
           "bf16": "mlpack.codegen.precisions.bf16", "int8": "mlpack.codegen.precisions.int8"}


def _planned(name: str) -> SimpleNamespace:
    def rewrite(graph):
        raise UnsupportedTargetError(f"precision {name} is not implemented yet (planned)")

    return SimpleNamespace(NAME=name, SUMMARY="planned", IMPLEMENTED=False, DEFAULT=False,
                           rewrite=rewrite)


def get(name: str) -> ModuleType | SimpleNamespace:
    if name in MODULES:
        return importlib.import_module(MODULES[name])
    if name in media.PRECISIONS:
        return _planned(name)
    raise UnsupportedTargetError(
        f"unknown precision {name!r}; precisions are: {', '.join(media.PRECISIONS)}") from None


def names() -> tuple[str, ...]:
    return tuple(media.PRECISIONS)


def implemented() -> tuple[str, ...]:
    return tuple(n for n in names() if get(n).IMPLEMENTED)


def defaults() -> tuple[str, ...]:
    """What a build makes when it names no precision."""
    return tuple(n for n in implemented() if get(n).DEFAULT)


def expand(asked) -> list[str]:
    """``--precision`` values as names: each may list several (``fp32,bf16``); ``all`` is every
    implemented precision."""
    out: list[str] = []
    for item in asked or ():
        for name in (n.strip() for n in item.split(",")):
            for n in (implemented() if name == "all" else (name,) if name else ()):
                if n not in out:
                    out.append(n)
    return out


def tolerance(name: str) -> accuracy.Tolerance:
    return accuracy.TOLERANCES[name]


def calibrates(name: str) -> bool:
    """Whether precision ``name`` needs calibration inputs (``calibrate``)."""
    return hasattr(get(name), "calibrate")


def calibrate(name: str, graph: Graph, feeds: list[dict]):
    """What ``apply`` needs for ``name`` beside the graph, from running it on ``feeds``; None
    for a precision that needs nothing."""
    module = get(name)
    return module.calibrate(graph, feeds) if hasattr(module, "calibrate") else None


def apply(name: str, graph: Graph, calibration=None) -> Graph:
    """``graph`` in precision ``name`` (with ``calibrate``'s result where it needs one),
    verified."""
    module = get(name)
    out = module.rewrite(graph, calibration) if hasattr(module, "calibrate") else \
        module.rewrite(graph)
    if out is not graph:
        verify(out)
    return out
