"""The config signature of a compiled graph, and the check that the container can state it.

A config dim size is a count, a ``$symbol`` or, for an output, an expression of symbols
(spec/sizes.py has the grammar). ``check_signature`` runs right after the model compiles, so a
size the format cannot state (a ``select`` the simplifier could not decide, an input dim that
is an expression) stops the build before any target is compiled, with one line naming the input
or output and the dim.
"""

from __future__ import annotations

from mlpack.spec import sizes
from mlpack.spec.container import signature
from mlpack.spec.errors import Error


class SignatureError(Error):
    """A model input or output has a dim size the container format cannot state."""


def _size(graph, kind: str, name: str, dim: str, e):
    try:
        size = sizes.config_size(e)
    except (ValueError, KeyError) as why:
        raise SignatureError(f"{kind} {name!r} dim {dim!r} has size {e!r}, which a container "
                             f"cannot state ({why}); mlpack packages sizes that are counts, "
                             "symbols or +, -, *, //, %, max, min of them") from None
    if kind == "input" and isinstance(size, str) and sizes.is_expression(sizes.parse_size(size)):
        raise SignatureError(f"input {name!r} dim {dim!r} has size {size}; an input dim must be a "
                             "count or a symbol (only outputs may have sizes that are expressions)")
    return size


def model_signature(graph) -> tuple[list[dict], list[dict]]:
    """Config inputs and outputs: the graph's ports with their dims in layout (ONNX) order, so
    the program's layouts equal the signature's and the runtime needs no transposes. Raises
    ``SignatureError`` for a size the format cannot state."""
    def sig(kind, port):
        ty = graph.types[port.name]
        return signature(port.name, ty.dtype,
                         [(d, _size(graph, kind, port.name, d, ty.dims[d])) for d in port.layout])

    return [sig("input", p) for p in graph.inputs], [sig("output", p) for p in graph.outputs]


def check_signature(graph) -> None:
    """Refuse (``SignatureError``) a graph whose signature a container cannot state."""
    model_signature(graph)


__all__ = ["SignatureError", "model_signature", "check_signature"]
