"""Every precision mlpack knows, one module each: a rewrite of the optimized graph applied
before a target compiles it (fp32 is the identity), verified like any pass, with the tolerance
its artifacts are judged by (spec/accuracy.py) and the targets that build it (the registry in
codegen/targets/registry.py lists each target's precisions).

A precision module has ``NAME``, ``SUMMARY``, ``IMPLEMENTED`` and ``rewrite(graph) -> graph``.
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

MODULES = {"fp32": "mlpack.codegen.precisions.fp32"}


def _planned(name: str) -> SimpleNamespace:
    def rewrite(graph):
        raise UnsupportedTargetError(f"precision {name} is not implemented yet (planned)")

    return SimpleNamespace(NAME=name, SUMMARY="planned", IMPLEMENTED=False, rewrite=rewrite)


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


def tolerance(name: str) -> accuracy.Tolerance:
    return accuracy.TOLERANCES[name]


def apply(name: str, graph: Graph) -> Graph:
    """``graph`` in precision ``name``, verified."""
    out = get(name).rewrite(graph)
    if out is not graph:
        verify(out)
    return out
