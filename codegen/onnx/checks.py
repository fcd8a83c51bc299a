"""Checks on an ONNX graph's declared names and shapes, run when the model is loaded.

They read only declarations (value infos, initializer headers, node output names), never
tensor data, so they cost nothing next to the import and run before anything is allocated:
a bad dim must be reported as the model's fault, naming the input or initializer, not surface
later as a NumPy ValueError or MemoryError while test inputs are drawn.

The rules follow ONNX Runtime, the reference, where it refuses a model (a name defined twice,
an input whose declared type disagrees with its initializer) and are stricter where it is
lenient by accident: it reads a negative dim as unknown and keeps the last of two initializers
of one name, with a warning. An initializer that is also a graph input is legal ONNX (the input
overrides a default); mlpack imports it as the constant its initializer holds. Graph outputs
and value_info are hints the importer never reads, so their dims are not checked.
"""

from __future__ import annotations

import onnx

from mlpack.codegen.errors import ModelError

# The largest tensor mlpack accepts, in bytes, with size symbols at 1 (the size test vectors
# draw first). Anything bigger is a wrong dim rather than a model: drawing one test input of
# this size takes three times as much memory (NumPy draws in float64, then casts), ONNX
# Runtime allocates it again, and the container stores it twice (two cases). It also keeps
# every dim, stride and byte offset far inside the int64 index math of the compiled kernels.
MAX_TENSOR_BYTES = 4 << 30

_BITS = {  # element widths in bits; an unknown element type is reported by the importer
    onnx.TensorProto.BOOL: 8, onnx.TensorProto.INT8: 8, onnx.TensorProto.UINT8: 8,
    onnx.TensorProto.INT16: 16, onnx.TensorProto.UINT16: 16, onnx.TensorProto.FLOAT16: 16,
    onnx.TensorProto.BFLOAT16: 16, onnx.TensorProto.INT32: 32, onnx.TensorProto.UINT32: 32,
    onnx.TensorProto.FLOAT: 32, onnx.TensorProto.INT64: 64, onnx.TensorProto.UINT64: 64,
    onnx.TensorProto.DOUBLE: 64, onnx.TensorProto.COMPLEX64: 64, onnx.TensorProto.COMPLEX128: 128,
    onnx.TensorProto.INT4: 4, onnx.TensorProto.UINT4: 4,
}


def check_model(model: onnx.ModelProto, where: str) -> None:
    """Raise a one-line ``ModelError`` naming ``where`` (the file) and the input, initializer
    or node at fault if the main graph or a subgraph declares a bad dim or a name twice."""
    _check_graph(model.graph, where, "")


def _check_graph(graph: onnx.GraphProto, where: str, scope: str) -> None:
    """One graph's initializers, inputs and node outputs; ``scope`` says which subgraph."""
    inits: dict[str, onnx.TensorProto] = {}
    for t in graph.initializer:
        what = f"initializer {t.name!r}{scope}"
        if t.name in inits:
            raise ModelError(f"{where}: {what} is defined twice; ONNX names are unique")
        inits[t.name] = t
        _check_dims(list(t.dims), t.data_type, where, what)
    inputs: set[str] = set()
    for vi in graph.input:
        what = f"input {vi.name!r}{scope}"
        if vi.name in inputs:
            raise ModelError(f"{where}: {what} is listed twice; ONNX names are unique")
        inputs.add(vi.name)
        tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
        if tt is None or not tt.HasField("shape"):
            continue  # the importer says what it needs of such an input
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        _check_dims(dims, tt.elem_type, where, what)
        if vi.name in inits:
            _check_default(dims, tt.elem_type, inits[vi.name], where, what)
    defined = {**{n: f"input {n!r}" for n in inputs}, **{n: f"initializer {n!r}" for n in inits}}
    for node in graph.node:
        label = (f"{node.op_type} node {node.name!r}" if node.name
                 else f"an unnamed {node.op_type} node")
        for name in node.output:
            if not name:
                continue
            if name in defined:
                raise ModelError(f"{where}: {label}{scope} defines {name!r}, which "
                                 f"{defined[name]} already defines; ONNX names are unique")
            defined[name] = label
        for a in node.attribute:
            for sub in subgraphs(a):
                _check_graph(sub, where, f" of subgraph {sub.name or a.name!r} ({label})")


def subgraphs(a: onnx.AttributeProto) -> list[onnx.GraphProto]:
    """The graphs attribute ``a`` holds: its one graph (If's branches, Loop's body) and its list."""
    return ([a.g] if a.HasField("g") else []) + list(a.graphs)


def _check_dims(dims: list[int | None], elem_type: int, where: str, what: str) -> None:
    """Each dim a count (``None``: a symbol) and the tensor within ``MAX_TENSOR_BYTES``."""
    for i, d in enumerate(dims):
        if d is not None and d < 0:
            raise ModelError(f"{where}: {what} dim {i} is {d}; a dim is a count (0 or more) "
                             "or a symbolic size")
    # zero dims count as 1: an empty tensor allocates nothing, but its strides still grow
    # with the other dims, and they must stay addressable
    elems = 1
    for d in dims:
        elems *= max(d or 1, 1)
    nbytes = elems * _BITS.get(elem_type, 8) // 8
    if nbytes > MAX_TENSOR_BYTES:
        i = max(range(len(dims)), key=lambda k: dims[k] or 0)
        shape = "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"
        limit = size_text(MAX_TENSOR_BYTES)
        raise ModelError(f"{where}: {what} dim {i} is {dims[i]}, too large: shape {shape} takes "
                         f"{size_text(nbytes)} (size symbols at 1), over the {limit} mlpack "
                         "allows for one tensor")


def _check_default(dims, elem_type: int, init: onnx.TensorProto, where: str, what: str) -> None:
    """An input that has an initializer must declare its type (ONNX Runtime refuses otherwise)."""
    if elem_type != init.data_type:
        raise ModelError(f"{where}: {what} is declared {_type_name(elem_type)} but its "
                         f"initializer holds {_type_name(init.data_type)}")
    shape = list(init.dims)
    if len(dims) != len(shape) or any(d is not None and d != s for d, s in zip(dims, shape)):
        declared = "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"
        raise ModelError(f"{where}: {what} declares shape {declared} but its initializer "
                         f"has shape {shape}")


def _type_name(elem_type: int) -> str:
    try:
        return onnx.TensorProto.DataType.Name(elem_type)
    except ValueError:
        return str(elem_type)


def size_text(nbytes: int) -> str:
    """``nbytes`` for a message: ``4 GiB``, ``1.5 TiB``, ``512 bytes``."""
    for unit, shift in (("EiB", 60), ("PiB", 50), ("TiB", 40), ("GiB", 30), ("MiB", 20)):
        if nbytes >= 1 << shift:
            return f"{nbytes / (1 << shift):.3g} {unit}"
    return f"{nbytes} bytes"
