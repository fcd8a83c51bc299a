"""FLOPs of an ONNX model, counted from its graph: what ``mlpack bench`` divides by a latency.

    count = count_flops(model, {"x": (64, 784)})     # ModelProto or path; input shapes optional
    count.total, count.by_op, count.unknown

Only the ops that dominate dense models are counted, each as 2 x its multiply-accumulates:
Conv and ConvTranspose (output elements x weight elements per output channel), Gemm (M N K),
MatMul (batch x M N K, with broadcasting) and Einsum (the product of every index's size, the
naive evaluation's MACs; ellipsis dims included). Elementwise ops, pooling, normalisation and
Softmax are left out: they are memory-bound and small next to the contractions, and a count that
includes them would flatter any runtime. Shapes come from ONNX shape inference after the inputs'
symbolic dims are pinned to the given shapes. Inference does not follow shapes computed at run
time (Shape -> Gather -> Concat -> Reshape, as every transformer exported from PyTorch has): given
the inputs themselves (``feeds``), the shapes it leaves unknown are read from one ONNX Runtime run
of the model with those values added as outputs. A counted op whose shapes stay unknown is listed
in ``unknown`` and contributes nothing.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

COUNTED = ("Conv", "ConvTranspose", "Gemm", "MatMul", "Einsum")


@dataclass
class FlopCount:
    """Floating-point operations of one run of a model."""

    total: int = 0
    by_op: dict[str, int] = field(default_factory=dict)  # op type -> FLOPs
    unknown: list[str] = field(default_factory=list)  # counted ops whose shapes are not known

    def add(self, op: str, macs: int) -> None:
        self.total += 2 * macs
        self.by_op[op] = self.by_op.get(op, 0) + 2 * macs


def _load(model):
    import onnx

    if isinstance(model, (str, os.PathLike)):
        return onnx.load(os.fspath(model))
    if isinstance(model, bytes):
        return onnx.load_from_string(model)
    m = onnx.ModelProto()
    m.CopyFrom(model)
    return m


def _pin_inputs(model, shapes: dict) -> None:
    """Set the graph inputs' dims to the given concrete shapes (symbolic dims become values)."""
    for vi in model.graph.input:
        if vi.name not in shapes:
            continue
        dims = vi.type.tensor_type.shape.dim
        shape = tuple(int(s) for s in shapes[vi.name])
        if len(dims) != len(shape):
            continue  # a rank mismatch is the runtime's to report; count with inference's shapes
        for d, n in zip(dims, shape):
            d.Clear()
            d.dim_value = n


def _known_shapes(model) -> dict[str, tuple[int, ...]]:
    """Every value's shape that inference fixed completely (all dims known)."""
    from onnx import numpy_helper

    out = {}
    g = model.graph
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        tt = vi.type.tensor_type
        if not tt.HasField("shape"):
            continue
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        if all(d is not None for d in dims):
            out[vi.name] = tuple(dims)
    for t in g.initializer:
        out[t.name] = tuple(t.dims)
    for node in g.node:  # Constant nodes carry weights in some exporters
        if node.op_type == "Constant":
            for a in node.attribute:
                if a.name == "value":
                    out[node.output[0]] = tuple(numpy_helper.to_array(a.t).shape)
    return out


def _attr(node, name: str, default):
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _prod(xs) -> int:
    return int(math.prod(int(x) for x in xs))


def _macs(node, shape) -> int | None:
    """Multiply-accumulates of one counted node; None when a shape it needs is unknown."""
    ins = [shape.get(x) if x else None for x in node.input]
    out = shape.get(node.output[0])
    op = node.op_type
    if op == "Conv":
        w = ins[1] if len(ins) > 1 else None
        if w is None or out is None:
            return None
        return _prod(out) * _prod(w[1:])  # per output element: Cin/group x kernel
    if op == "ConvTranspose":
        x, w = ins[0], ins[1] if len(ins) > 1 else None
        if x is None or w is None:
            return None
        return _prod(x) * _prod(w[1:])  # every input element scatters Cout/group x kernel
    if op == "Gemm":
        a = ins[0]
        if a is None or out is None or len(a) != 2:
            return None
        k = a[0] if _attr(node, "transA", 0) else a[1]
        return _prod(out) * int(k)
    if op == "MatMul":
        a = ins[0]
        if a is None or out is None or not a:
            return None
        return _prod(out) * int(a[-1])
    if op == "Einsum":
        return _einsum_macs(_attr(node, "equation", b""), ins)
    return None


def _einsum_macs(equation, shapes) -> int | None:
    """The product of every index's size (and the broadcast ellipsis dims) over the operands."""
    if isinstance(equation, bytes):
        equation = equation.decode()
    lhs = equation.replace(" ", "").split("->")[0]
    terms = lhs.split(",")
    if len(terms) != len(shapes) or any(s is None for s in shapes):
        return None
    sizes: dict[str, int] = {}
    ellipsis: list[int] = []
    for term, shape in zip(terms, shapes):
        letters = term.replace("...", "")
        n_ell = len(shape) - len(letters) if "..." in term else 0
        head = term.split("...")[0] if "..." in term else term
        dims = list(shape)
        ell = dims[len(head):len(head) + n_ell]
        named = dims[:len(head)] + dims[len(head) + n_ell:]
        for c, n in zip(letters, named):
            sizes[c] = max(sizes.get(c, 1), int(n))
        # broadcast the ellipsis parts, aligned on the right
        if len(ell) > len(ellipsis):
            ellipsis = [1] * (len(ell) - len(ellipsis)) + ellipsis
        for i, n in enumerate(ell):
            j = len(ellipsis) - len(ell) + i
            ellipsis[j] = max(ellipsis[j], int(n))
    return _prod(sizes.values()) * _prod(ellipsis)


def _counted(model) -> list:
    return [n for n in model.graph.node
            if n.op_type in COUNTED and n.domain in ("", "ai.onnx")]


def _run_shapes(model, feeds: dict, names: list[str]) -> dict[str, tuple[int, ...]]:
    """The shapes of the values ``names`` in one ONNX Runtime run of ``model`` on ``feeds``
    ({} where ONNX Runtime is missing or refuses the model: the count then says unknown)."""
    try:
        import onnxruntime as ort
    except ImportError:
        return {}
    from onnx import helper

    types = {vi.name: vi.type for vi in list(model.graph.value_info) + list(model.graph.input)}
    have = {o.name for o in model.graph.output}
    for name in names:
        if name not in have and name in types:
            model.graph.output.append(helper.make_value_info(name, types[name]))
    wanted = [o.name for o in model.graph.output if o.name in set(names)]
    try:
        session = ort.InferenceSession(model.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        names_in = {i.name for i in session.get_inputs()}
        got = session.run(wanted, {k: v for k, v in feeds.items() if k in names_in})
    except Exception:   # (ONNX Runtime's own errors have no common base class)
        return {}
    return {name: tuple(value.shape) for name, value in zip(wanted, got)}


def count_flops(model, shapes: dict | None = None, feeds: dict | None = None) -> FlopCount:
    """FLOPs of one run of ``model`` (a ModelProto, bytes or a path) on inputs of ``shapes``
    ({name: shape}; default: the shapes the model declares, or those of ``feeds``, the inputs
    themselves, {name: array}, which also settle what shape inference cannot). See the module
    docstring."""
    import onnx

    model = _load(model)
    if feeds and not shapes:
        shapes = {k: v.shape for k, v in feeds.items()}
    if shapes:
        _pin_inputs(model, shapes)
    try:
        model = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # inference refuses some models; count what the declared shapes give
        pass
    known = _known_shapes(model)
    if feeds:
        missing = [x for node in _counted(model) if _macs(node, known) is None
                   for x in list(node.input) + list(node.output[:1]) if x and x not in known]
        if missing:
            known.update(_run_shapes(model, feeds, list(dict.fromkeys(missing))))
    count = FlopCount()
    for node in _counted(model):
        macs = _macs(node, known)
        if macs is None:
            count.unknown.append(node.name or f"{node.op_type}:{node.output[0]}")
        else:
            count.add(node.op_type, macs)
    return count


__all__ = ["count_flops", "FlopCount", "COUNTED"]
