"""ONNX -> IR: load a model, walk its nodes, and build one IR graph.

Each node goes to its importer in ops/ (looked up in the registry); a node with no importer
whose schema defines it as a function (LayerNormalization, Gelu, ...) is expanded into that
function's body and imported node by node, so every op ONNX defines by composition works
without code of its own. Graph inputs keep their symbolic dims (``dim_param`` becomes a
symbol ``$name``; an unnamed dynamic dim a fresh one).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from mlpack.spec.errors import Error
from mlpack.codegen.errors import ModelError, UnsupportedOpError
from mlpack.spec.ir import dtypes as dt
from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.graph import Graph, Port, TensorType
from mlpack.codegen.passes.rename import rename_in_graph
from mlpack.codegen.onnx import ops as _ops  # noqa: F401  (registers the importers)
from mlpack.codegen.onnx.builder import Builder, NeedsValue, Node, _ident
from mlpack.codegen.onnx.checks import check_model, subgraphs
from mlpack.codegen.onnx import mapped
from mlpack.codegen.onnx.mapped import MappedModel
from mlpack.codegen.onnx.registry import lookup
# custom ops users write in the DSL and register (mlpack.codegen.dsl.register, build --ops)
from mlpack.codegen.dsl.onnx_bridge import importer as custom_importer
from mlpack.codegen.onnx.values import Value, tensor_value

MIN_OPSET = 1
MAX_OPSET = onnx.defs.onnx_opset_version()

# ONNX TensorProto element types -> IR dtypes
ONNX_DTYPES = {
    onnx.TensorProto.FLOAT: "f32", onnx.TensorProto.DOUBLE: "f64", onnx.TensorProto.FLOAT16: "f16",
    onnx.TensorProto.BFLOAT16: "bf16", onnx.TensorProto.INT8: "i8", onnx.TensorProto.INT16: "i16",
    onnx.TensorProto.INT32: "i32", onnx.TensorProto.INT64: "i64", onnx.TensorProto.UINT8: "u8",
    onnx.TensorProto.UINT16: "u16", onnx.TensorProto.UINT32: "u32", onnx.TensorProto.UINT64: "u64",
    onnx.TensorProto.BOOL: "bool",
    onnx.TensorProto.FLOAT8E4M3FN: "f8e4m3fn", onnx.TensorProto.FLOAT8E4M3FNUZ: "f8e4m3fnuz",
    onnx.TensorProto.FLOAT8E5M2: "f8e5m2", onnx.TensorProto.FLOAT8E5M2FNUZ: "f8e5m2fnuz",
    onnx.TensorProto.INT4: "i4", onnx.TensorProto.UINT4: "u4",
}
for _proto, _name in (("FLOAT4E2M1", "f4e2m1"), ("INT2", "i2"), ("UINT2", "u2"), ("FLOAT8E8M0", "f8e8m0")):
    if hasattr(onnx.TensorProto, _proto) and _name in dt.DTYPES:
        ONNX_DTYPES[getattr(onnx.TensorProto, _proto)] = _name


def onnx_dtype(elem_type: int, where: str, node=None) -> str:
    """The IR dtype of an ONNX element type; UnsupportedOpError naming ``where`` if it has none."""
    try:
        return ONNX_DTYPES[elem_type]
    except KeyError:
        known = elem_type in onnx.TensorProto.DataType.values()
        name = onnx.TensorProto.DataType.Name(elem_type) if known else str(elem_type)
        detail = f"{where} has element type {name}, which mlpack does not support"
        if node is not None:
            raise node.fail(detail) from None
        raise UnsupportedOpError(None, detail=detail) from None


def load_model(model: Any) -> onnx.ModelProto:
    """A ModelProto from a path, bytes or a ModelProto; a clear ModelError if it is malformed
    or declares a bad dim or a name twice (checks.py), before anything is allocated for it."""
    if isinstance(model, onnx.ModelProto):
        check_model(model, "the model")
        return model
    where = "the model bytes"
    try:
        if isinstance(model, (bytes, bytearray)):
            m = onnx.load_model_from_string(bytes(model))
        else:
            where = os.fspath(model)
            if not os.path.exists(where):
                raise ModelError(f"{where}: no such file")
            m = onnx.load(where)
    except Error:
        raise
    except Exception as e:  # protobuf decode errors, truncated files, missing external data
        raise ModelError(f"{where}: not a readable ONNX model ({type(e).__name__}: {e})") from None
    return _checked(m, where)


def load_file_bytes(path: str, data) -> tuple[onnx.ModelProto | MappedModel, bool]:
    """(the model of the file ``path`` whose bytes ``data`` are at hand (read, or mapped), whether
    some tensor's data is in an external file): as ``load_model(path)``, the external data loaded
    from the file's folder. A model without external data comes as a ``MappedModel``: its
    message without the initializers' raw data, those arrays views of ``data`` (mapped.py)."""
    from onnx.external_data_helper import load_external_data_for_model, uses_external_data

    split = mapped.split_weights(data)
    try:
        m = onnx.load_model_from_string(split.light if split else bytes(data))
        external = any(uses_external_data(t) for t in _all_tensors(m.graph))
        if external:
            if split is not None:   # (keyed by its parsed message, weights included: whole)
                m, split = onnx.load_model_from_string(bytes(data)), None
            load_external_data_for_model(m, os.path.dirname(os.path.abspath(path)))
    except Exception as e:  # protobuf decode errors, truncated files, missing external data
        raise ModelError(f"{path}: not a readable ONNX model ({type(e).__name__}: {e})") from None
    m = _checked(m, path)
    return (m if split is None else MappedModel(m, split.views(data), path, split)), external


def _all_tensors(graph):
    """Every TensorProto of ``graph``: initializers and node attributes, subgraphs included."""
    yield from graph.initializer
    for node in graph.node:
        for a in node.attribute:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors
            for g in subgraphs(a):
                yield from _all_tensors(g)


def _checked(m: onnx.ModelProto, where: str) -> onnx.ModelProto:
    """``m`` once it is seen to be a whole model (checks.py's ``check_model`` too)."""
    if not m.graph.node and not m.graph.output:
        raise ModelError(f"{where}: not an ONNX model (the graph is empty; is the file truncated?)")
    if m.graph.node and not m.opset_import and m.ir_version >= 3:
        # opset_import is serialized after the graph: a file cut just there parses without it
        raise ModelError(f"{where}: the model imports no opset (is the file truncated?)")
    check_model(m, where)
    return m


class _Importer:
    def __init__(self, model: onnx.ModelProto, specialize: dict[str, np.ndarray] | None,
                 weights: dict[str, np.ndarray] | None = None):
        self.model = model
        self.specialize = specialize or {}
        self.weights = weights or {}   # the main graph's arrays the message lacks (mapped.py)
        self.opsets = {(o.domain or ""): o.version for o in model.opset_import}
        if "ai.onnx" in self.opsets:
            self.opsets[""] = self.opsets.pop("ai.onnx")
        self.graph = Graph(model.graph.name or "model")
        self.b = Builder(self.graph)
        self.env: dict[str, Value] = {}
        self._sym_counter = 0
        self._scope_opsets = self.opsets   # the opsets of the nodes being imported
        self.b.import_subgraph = self.import_subgraph

    # -------------------------------------------------------------- graph boundary
    def _input(self, vi: onnx.ValueInfoProto) -> None:
        where = f"graph input {vi.name!r}"
        if not vi.type.HasField("tensor_type"):
            raise UnsupportedOpError(None, detail=f"{where} is not a tensor "
                                     "(sequences, maps and optionals are not supported)")
        tt = vi.type.tensor_type
        dtype = onnx_dtype(tt.elem_type, where)
        if vi.name in self.specialize:
            data = np.asarray(self.specialize[vi.name]).astype(dt.to_numpy(dtype))
            self.env[vi.name] = self.b.constant(data, name=vi.name)
            return
        if not tt.HasField("shape"):
            raise UnsupportedOpError(None, detail=f"{where} has no rank; mlpack needs "
                                     "the rank of every input")
        names, dims = [], []
        for i, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value"):
                size = ex.const(int(d.dim_value))
                names.append(f"d{i}")
            else:
                param = _ident(d.dim_param) if d.dim_param else None
                if param is None:
                    param = f"{_ident(vi.name)}_{i}"
                size = ex.sym(param)
                names.append(param)
            dims.append(size)
        names = list(Builder.dim_names(names, len(dims)))
        ty = TensorType(dtype, dict(zip(names, dims)))
        self.b.reserve(vi.name)
        self.graph.add_input(vi.name, ty, names)
        self.env[vi.name] = tensor_value(vi.name, dtype, list(zip(names, dims)))

    def _initializer(self, t: onnx.TensorProto) -> None:
        data = self.weights.get(t.name)   # (a view of the mapped file, where mapped.py split it)
        if data is None or t.raw_data or data.shape != tuple(t.dims) or \
                data.dtype != mapped.DTYPES.get(t.data_type):
            try:
                data = numpy_helper.to_array(t, base_dir=getattr(self, "base_dir", ""))
            except Exception as e:
                raise ModelError(f"initializer {t.name!r} cannot be read: {e}") from None
        onnx_dtype(t.data_type, f"initializer {t.name!r}")
        self.env[t.name] = self.b.constant(np.asarray(data), name=t.name)

    def _outputs(self, outputs) -> None:
        """Bind each graph output to a tensor of the output's own name.

        An output that is a view, or a tensor already named otherwise, is copied into a
        comprehension; if an intermediate tensor took the output's name, it is renamed.
        """
        renames: dict[str, str] = {}
        for vi in outputs:
            v = self.env.get(vi.name)
            if v is None:
                raise ModelError(f"graph output {vi.name!r} is not produced by any node")
            if v.tensor != vi.name or vi.name in renames.values():
                v = self.b.materialize(self.b.map(v.dtype, v.shape, v.at, v.names, hint=vi.name))
                renames[v.tensor] = vi.name
            self.graph.outputs.append(Port(v.tensor, self._layout_of(v)))
        taken = {new for old, new in renames.items() if old != new and new in self.graph.types}
        mapping = {name: self.b.fresh(name + ".t") for name in taken}
        mapping.update({old: new for old, new in renames.items() if old != new})
        rename_in_graph(self.graph, mapping)

    def _layout_of(self, v: Value) -> tuple[str, ...]:
        if v.tensor in self.graph.constants:
            return tuple(self.graph.constants[v.tensor].layout)
        return tuple(v.names)

    # -------------------------------------------------------------- nodes
    def run(self) -> Graph:
        g = self.model.graph
        inits = {t.name for t in g.initializer}
        for vi in g.input:
            if vi.name not in inits:
                self._input(vi)
        for t in g.initializer:
            if t.name in self.specialize:
                continue
            self._initializer(t)
        for sp in getattr(g, "sparse_initializer", []):
            raise UnsupportedOpError(None, detail=f"initializer {sp.values.name!r} is sparse")
        self.import_nodes(list(g.node), self.opsets)
        self._outputs(g.output)
        return self.graph

    def import_nodes(self, nodes: list[onnx.NodeProto], opsets: dict[str, int]) -> None:
        outer, self._scope_opsets = self._scope_opsets, opsets
        try:
            for proto in nodes:
                self.import_node(proto, opsets)
        finally:
            self._scope_opsets = outer

    def import_subgraph(self, graph: onnx.GraphProto, inputs: list[Value]) -> list[Value]:
        """Import a subgraph (an If branch, a Loop or Scan body) with its formal inputs bound
        to ``inputs``; returns the Values of its outputs.

        The subgraph sees the enclosing scope (ONNX subgraphs may read outer values) through a
        copy of the env that is dropped afterwards, so its names never leak out and importing
        one body many times (unrolled iterations) never collides; IR tensor names are fresh.
        """
        if len(inputs) != len(graph.input):
            raise ModelError(f"subgraph {graph.name!r} takes {len(graph.input)} inputs, "
                             f"given {len(inputs)}")
        saved, node = self.env, self.b.node
        self.env = dict(saved)
        try:
            for vi, v in zip(graph.input, inputs):
                self.env[vi.name] = v
            for t in graph.initializer:
                self._initializer(t)
            self.import_nodes(list(graph.node), self._scope_opsets)
            missing = [vi.name for vi in graph.output if vi.name not in self.env]
            if missing:
                raise ModelError(f"subgraph {graph.name!r} output {missing[0]!r} is not produced")
            return [self.env[vi.name] for vi in graph.output]
        finally:
            self.env, self.b.node = saved, node

    def import_node(self, proto: onnx.NodeProto, opsets: dict[str, int]) -> None:
        domain = "" if proto.domain in ("", "ai.onnx") else proto.domain
        opset = opsets.get(domain)
        if opset is None:
            raise ModelError(f"node {proto.name or proto.op_type!r} uses domain {domain!r}, "
                             "which the model does not import")
        inputs: list[Value | None] = []
        for name in proto.input:
            if not name:
                inputs.append(None)
                continue
            if name not in self.env:
                raise ModelError(f"{proto.op_type} node {proto.name!r} reads {name!r}, which no "
                                 "earlier node, input or initializer defines")
            inputs.append(self.env[name])
        node = Node(proto, opset, inputs)
        fn = lookup(domain, proto.op_type) or custom_importer(domain, proto.op_type)
        if fn is None:
            if self._expand_function(proto, domain, opset, inputs):
                return
            if domain not in ("", "ai.onnx.ml"):
                raise node.fail(f"domain {domain!r} is not supported")
            raise node.fail("mlpack has no importer for this op")
        self.b.node = node
        ops_before = len(self.b.graph.ops)
        try:
            results = fn(self.b, node)
        except (Error, NeedsValue):
            raise
        except Exception as e:  # an importer bug must still name the node
            raise UnsupportedOpError(proto.op_type, domain, opset, node.name,
                                     f"import failed ({type(e).__name__}: {e})") from e
        finally:
            self.b.node = None
        if not isinstance(results, (list, tuple)):
            results = [results]
        results = self.b.fold_procedure(list(results), ops_before)
        for name, v in zip(proto.output, results):
            if name and v is not None:
                self.env[name] = v
        for name in list(proto.output)[len(results):]:
            if name:
                raise node.fail(f"output {name!r} is not supported")

    def _expand_function(self, proto, domain, opset, inputs) -> bool:
        """Import a node through its schema's function body, if it has one."""
        try:
            schema = onnx.defs.get_schema(proto.op_type, opset, domain)
        except onnx.defs.SchemaError:
            return False
        body = None
        if schema.has_context_dependent_function:
            versions = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
            if versions:
                types = []
                for v in inputs:
                    elem = {d: k for k, d in ONNX_DTYPES.items()}.get(v.dtype, 0) if v else 0
                    types.append(onnx.helper.make_tensor_type_proto(elem, [None] * (v.rank if v else 0)).SerializeToString())
                try:
                    raw = schema.get_context_dependent_function_with_opset_version(
                        max(versions), proto.SerializeToString(), types)
                except Exception:
                    raw = None
                if raw:
                    body = onnx.FunctionProto()
                    body.ParseFromString(raw)
        if body is None and schema.has_function:
            versions = [v for v in schema.function_opset_versions if v <= opset]
            if versions:
                body = onnx.FunctionProto()
                body.ParseFromString(schema.get_function_with_opset_version(max(versions)))
        if body is None:
            return False
        prefix = self.b.fresh(f"{proto.name or proto.op_type}.fn")
        rename = {}
        for formal, actual in zip(body.input, list(proto.input) + [""] * len(body.input)):
            rename[formal] = actual
        for formal, actual in zip(body.output, proto.output):
            rename[formal] = actual
        attrs = {a.name: a for a in proto.attribute}
        nodes = []
        for n in body.node:
            n2 = onnx.NodeProto()
            n2.CopyFrom(n)
            del n2.input[:]
            del n2.output[:]
            n2.input.extend(rename.get(x, f"{prefix}/{x}") if x else "" for x in n.input)
            n2.output.extend(rename.get(x, f"{prefix}/{x}") if x else "" for x in n.output)
            del n2.attribute[:]
            for a in n.attribute:
                if a.ref_attr_name:
                    if a.ref_attr_name in attrs:
                        a2 = onnx.AttributeProto()
                        a2.CopyFrom(attrs[a.ref_attr_name])
                        a2.name = a.name
                        n2.attribute.append(a2)
                else:
                    n2.attribute.append(_rename_captured(a, lambda x: rename.get(x, f"{prefix}/{x}")))
            n2.name = f"{prefix}/{n.name or n.op_type}"
            nodes.append(n2)
        fn_opsets = dict(self.opsets)
        for o in body.opset_import:
            fn_opsets["" if o.domain in ("", "ai.onnx") else o.domain] = o.version
        self.import_nodes(nodes, fn_opsets)
        return True


def _rename_captured(a: onnx.AttributeProto, rename) -> onnx.AttributeProto:
    """A copy of attribute ``a`` whose subgraphs read outer values under their new names
    (a function body's values are renamed when it is expanded; its subgraphs must follow)."""
    if not subgraphs(a):
        return a
    a2 = onnx.AttributeProto()
    a2.CopyFrom(a)
    for g in subgraphs(a2):
        _rename_outer_refs(g, rename, set())
    return a2


def _rename_outer_refs(g: onnx.GraphProto, rename, local: set[str]) -> None:
    local = local | {v.name for v in g.input} | {t.name for t in g.initializer}
    local |= {o for n in g.node for o in n.output}
    for n in g.node:
        n.input[:] = [rename(x) if x and x not in local else x for x in n.input]
        for a in n.attribute:
            for sub in subgraphs(a):
                _rename_outer_refs(sub, rename, local)
    for o in g.output:
        if o.name not in local:
            o.name = rename(o.name)


def import_model(model: Any, specialize: dict[str, np.ndarray] | None = None) -> Graph:
    """Import an ONNX model (path, bytes or ModelProto) into an IR graph.

    ``specialize`` binds named graph inputs to constant values (used when an input decides a
    shape, e.g. a Reshape target given as a graph input).
    Raises ``UnsupportedOpError`` or ``ModelError``; ``NeedsValue`` when an input must be
    specialized.
    """
    weights = None
    if isinstance(model, MappedModel):   # (checked when it was read)
        model, weights, base_dir = model.proto, model.weights, os.path.dirname(model.path)
    else:
        base_dir = os.path.dirname(os.fspath(model)) if isinstance(model, (str, os.PathLike)) \
            else ""
    m = load_model(model)
    opset = {(o.domain or ""): o.version for o in m.opset_import}.get("", None)
    if opset is not None and opset > MAX_OPSET:
        raise ModelError(f"the model uses opset {opset}; this mlpack knows opsets up to {MAX_OPSET}")
    if m.functions:
        try:
            m = onnx.inliner.inline_local_functions(m)
        except Exception as e:
            raise ModelError(f"the model's local functions cannot be inlined: {e}") from None
    imp = _Importer(m, specialize, weights)
    imp.base_dir = base_dir
    return imp.run()
