"""The import context op importers use: one ``Node`` per ONNX node, one ``Builder`` per graph.

An importer is a small function ``(b: Builder, n: Node) -> list[Value]`` registered with
``@op("Name")`` (see registry.py). It reads inputs as ``Value``s and attributes with the ONNX
schema's defaults (``n.attr("alpha")``), and builds results with ``b.map`` (elementwise:
one comprehension), ``b.reduce`` (a reduction), views (``b.view``) or ``b.procedure``.

Small integer results whose elements are known at import time (shape arithmetic) are folded:
their ``Value.known`` carries the element expressions, symbols included, and a constant
result becomes a constant tensor.
"""

from __future__ import annotations

import itertools
import re
from typing import Callable, Sequence

import numpy as np
import onnx

from mlpack.codegen.errors import ModelError, ShapeError, UnsupportedOpError
from mlpack.spec.ir import dtypes as dt
from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr
from mlpack.spec.ir.graph import (Comprehension, Constant, Graph, Port, Procedure, TensorType,
                                  stmt_exprs, tensors_read)
from mlpack.codegen.onnx.values import Value, tensor_value

KNOWN_LIMIT = 64          # fold integer tensors up to this many elements into known values
FOLD_LIMIT = 1 << 16      # evaluate all-constant results up to this many elements at import
_NO_DEFAULT = object()


class NeedsValue(Exception):
    """An op needs the value of an input that is only known at run time (e.g. a Reshape whose
    shape is a graph input). The backend answers by specializing on the given inputs."""

    def __init__(self, node: str, what: str):
        super().__init__(f"{node}: {what} must be known when the model is compiled")
        self.node, self.what = node, what


def _attr_value(a: onnx.AttributeProto):
    v = onnx.helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, list) and v and isinstance(v[0], bytes):
        return [x.decode("utf-8", "replace") for x in v]
    return v


class Node:
    """One ONNX node as an importer sees it."""

    def __init__(self, proto: onnx.NodeProto, opset: int, inputs: list[Value | None]):
        self.proto = proto
        self.op_type = proto.op_type
        self.domain = proto.domain
        self.opset = opset
        self.name = proto.name or (proto.output[0] if proto.output else proto.op_type)
        self.inputs = inputs
        self.input_names = list(proto.input)
        self.output_names = list(proto.output)
        self._attrs = {a.name: a for a in proto.attribute}

    def __repr__(self):
        return f"{self.op_type} node {self.name!r}"

    def has(self, name: str) -> bool:
        return name in self._attrs

    def attr(self, name: str, default=_NO_DEFAULT):
        """The attribute's value; when absent the given default, else the schema's default."""
        if name in self._attrs:
            return _attr_value(self._attrs[name])
        if default is not _NO_DEFAULT:
            return default
        try:
            schema = onnx.defs.get_schema(self.op_type, self.opset, self.domain)
        except onnx.defs.SchemaError:
            schema = None
        a = schema.attributes.get(name) if schema is not None else None
        if a is not None and a.default_value.type != 0:
            return _attr_value(a.default_value)
        if a is not None and not a.required:
            return None
        raise self.fail(f"required attribute {name!r} is missing")

    def input(self, i: int) -> Value | None:
        """Input ``i``, or None when it is absent or given as the empty name."""
        return self.inputs[i] if i < len(self.inputs) else None

    def fail(self, detail: str) -> UnsupportedOpError:
        return UnsupportedOpError(self.op_type, self.domain, self.opset, self.name, detail)

    def shape_error(self, detail: str) -> ShapeError:
        return ShapeError(f"{self.op_type} node {self.name!r}: {detail}")


def _ident(s: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_]", "_", s)
    return s if s and not s[0].isdigit() else "d" + s


class Builder:
    """Accumulates the IR graph while nodes are imported."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self._names: set[str] = set()
        self._counter = itertools.count()
        self.node: Node | None = None   # the node being imported, for messages
        # import_subgraph(graph, inputs) -> outputs: import an ONNX subgraph (If/Loop/Scan
        # bodies) with its inputs bound to the given Values; set by the importer
        self.import_subgraph: Callable[[onnx.GraphProto, list[Value]], list[Value]] | None = None

    # -------------------------------------------------------------- names
    def fresh(self, hint: str = "t") -> str:
        hint = re.sub(r"[^A-Za-z0-9_.]", "_", hint) or "t"
        name = hint
        while name in self._names or name in self.graph.types:
            name = f"{hint}.{next(self._counter)}"
        self._names.add(name)
        return name

    def reserve(self, name: str) -> None:
        self._names.add(name)

    @staticmethod
    def dim_names(names: Sequence[str], rank: int, avoid: set[str] = frozenset()) -> tuple[str, ...]:
        """Distinct dim names, taken from ``names`` where usable."""
        out: list[str] = []
        taken = set(avoid)
        for i in range(rank):
            cand = _ident(names[i]) if i < len(names) and names[i] else f"d{i}"
            base, k = cand, 1
            while cand in taken:
                cand = f"{base}_{k}"
                k += 1
            out.append(cand)
            taken.add(cand)
        return tuple(out)

    # -------------------------------------------------------------- results
    def map(self, dtype: str, shape: Sequence, fn: Callable[[list[Expr]], Expr],
            names: Sequence[str] = (), hint: str | None = None, fold: bool = True) -> Value:
        """out[i...] = fn(i...): one comprehension with no reduction."""
        return self.reduce(None, dtype, shape, (), lambda o, r: fn(o), names, (), hint, fold)

    def reduce(self, kind: str | None, dtype: str, shape: Sequence, rshape: Sequence,
               fn: Callable[[list[Expr], list[Expr]], Expr], names: Sequence[str] = (),
               rnames: Sequence[str] = (), hint: str | None = None, fold: bool = True) -> Value:
        """out[i...] = kind over r... of fn(i..., r...). ``fold=False`` keeps a result of
        constants as an op (a dequantized weight, whose integers a later pass reads)."""
        shape = tuple(ex.simplify_size(s) for s in shape)
        rshape = tuple(ex.simplify_size(s) for s in rshape)
        onames = self.dim_names(names, len(shape))
        rn = self.dim_names(rnames or [f"r{i}" for i in range(len(rshape))], len(rshape), set(onames))
        ovars = [ex.var(d) for d in onames]
        rvars = [ex.var(d) for d in rn]
        if kind is None:
            folded = self._fold_known(dtype, shape, lambda idx: fn(idx, []))
            if folded is not None:
                return folded
        body = ex.cast(fn(ovars, rvars), dtype if not (kind or "").startswith("arg") else
                       fn(ovars, rvars).dtype)
        name = self.fresh(hint or self._hint())
        ty = TensorType("i64" if (kind or "").startswith("arg") else dtype, dict(zip(onames, shape)))
        self.graph.add_op(Comprehension(name, ty, body, kind, dict(zip(rn, rshape))))
        value = tensor_value(name, ty.dtype, list(zip(onames, shape)))
        return self._maybe_fold(value) if fold else value

    def _hint(self) -> str:
        if self.node is not None and self.node.output_names and self.node.output_names[0]:
            return self.node.output_names[0]
        return "t"

    def _fold_known(self, dtype: str, shape, fn) -> Value | None:
        """Elementwise results over known small integer inputs become known values."""
        if not (dt.is_int(dtype) or dtype == "bool"):
            return None
        static = [s.value for s in shape if s.is_const]
        if len(static) != len(shape) or int(np.prod(static, dtype=np.int64)) > KNOWN_LIMIT:
            return None
        elems = []
        for idx in itertools.product(*[range(n) for n in static]):
            e = fn([ex.const(i) for i in idx])
            if any(n.op in ("read", "var") for n in ex.walk(e)):
                return None
            elems.append(e)
        return self.known_value(dtype, static, elems)

    def known_value(self, dtype: str, shape: Sequence[int], elems: list[Expr]) -> Value:
        """A small integer tensor with the given element expressions (constants or symbolic)."""
        elems = [ex.simplify_size(ex.cast(e, "i64")) if dt.is_int(dtype) else ex.cast(e, dtype)
                 for e in elems]
        if all(e.is_const for e in elems):
            data = np.array([e.value for e in elems], dtype=dt.to_numpy(dtype)).reshape(shape)
            return self.constant(data)
        names = self.dim_names([], len(shape))
        flat = ex.const(0)
        for d, n in zip(names, shape):
            flat = flat * n + ex.var(d)
        body = ex.const(0)
        for i in reversed(range(len(elems))):
            body = ex.select(ex.binary("eq", flat, i), ex.cast(elems[i], dtype), ex.cast(body, dtype)) \
                if i < len(elems) - 1 else ex.cast(elems[i], dtype)
        name = self.fresh(self._hint())
        ty = TensorType(dtype, dict(zip(names, [ex.const(n) for n in shape])))
        self.graph.add_op(Comprehension(name, ty, ex.cast(body, dtype)))
        v = tensor_value(name, dtype, list(zip(names, ty.dims.values())))
        return self._with_known(v, elems)

    def _with_known(self, v: Value, elems: list[Expr]) -> Value:
        v.known = list(elems)
        shape = v.static_shape()
        strides = [int(np.prod(shape[i + 1:], dtype=np.int64)) for i in range(len(shape))]
        plain = v.at

        def at(idx):
            if all(i.is_const for i in idx):
                flat = sum(int(i.value) * s for i, s in zip(idx, strides))
                if 0 <= flat < len(elems):
                    return ex.cast(elems[flat], v.dtype)
            return plain(idx)

        v.at = at
        return v

    def _maybe_fold(self, v: Value) -> Value:
        """Evaluate a result whose inputs are all constants, when it is small."""
        op = self.graph.ops[-1]
        shape = v.static_shape()
        if shape is None or int(np.prod(shape, dtype=np.int64)) > FOLD_LIMIT:
            return v
        if not isinstance(op, Comprehension) or any(s for s in [op.rdims] if
                                                    any(not r.is_const for r in s.values())):
            return v
        reads = set()
        for n in ex.walk(op.body):
            if n.op == "sym" or (n.op == "read" and n.arg[0] not in self.graph.constants):
                return v
            if n.op == "read":
                reads.add(n.arg[0])
        data = self._evaluate_last(reads, {op.out: op.type})[op.out]
        return self.constant(data, name=op.out, names=v.names)

    def _evaluate_last(self, reads: set[str], results: dict[str, TensorType]) -> dict:
        """The graph's last op, which reads only the constants ``reads``, run by the
        interpreter and removed with its ``results``' types: each result's data."""
        from mlpack.spec.ir.interp import run_graph
        # (only what the op reads and writes: copying every constant and type of a big model's
        # graph for each of Swin-T's 417 folds was a tenth of its import)
        g = Graph("fold", constants={k: self.graph.constants[k] for k in reads},
                  ops=[self.graph.ops[-1]],
                  types={k: self.graph.types[k] for k in (*reads, *results)})
        g.outputs.extend(Port(name, tuple(t.dims)) for name, t in results.items())
        data = run_graph(g, {})
        self.graph.ops.pop()
        for name in results:
            del self.graph.types[name]
        return data

    def fold_procedure(self, results: list, ops_before: int) -> list:
        """A node's ``results``, where the node's last op (of those after ``ops_before``) is a
        procedure of constants (a ScatterND into a ConstantOfShape: Swin-T's 45 shifted-window
        masks) whose small results are exactly the node's, plain reads: evaluated now, as
        constants, instead of element by element in every run of the interpreters and as a
        kernel in every run of the model."""
        op = self.graph.ops[-1] if len(self.graph.ops) > ops_before else None
        if not isinstance(op, Procedure) or op.bounds:
            return results
        if {v.tensor for v in results if v is not None} != set(op.results) or any(
                v is not None and tuple(op.results[v.tensor].dims) != v.names for v in results):
            return results
        sizes = [s for t in (*op.results.values(), *op.locals_.values()) for s in t.dims.values()]
        if not all(s.is_const for s in sizes) or sum(
                int(np.prod([s.value for s in t.dims.values()], dtype=np.int64))
                for t in op.results.values()) > FOLD_LIMIT:
            return results
        reads = tensors_read(op)
        if not reads <= set(self.graph.constants) or any(
                n.op == "sym" for e in stmt_exprs(op.body) for n in ex.walk(e)):
            return results
        data = self._evaluate_last(reads, op.results)
        return [v if v is None else self.constant(data[v.tensor], name=v.tensor, names=v.names)
                for v in results]

    def constant(self, data: np.ndarray, name: str | None = None, names: Sequence[str] = ()) -> Value:
        """A constant tensor (ONNX axis order); small integer ones also carry known values."""
        data = np.asarray(data)
        dtype = dt.from_numpy(data.dtype)
        dnames = self.dim_names(names, data.ndim)
        name = name if name and name not in self.graph.types else self.fresh(name or "const")
        self.reserve(name)
        ty = TensorType(dtype, {d: ex.const(int(n)) for d, n in zip(dnames, data.shape)})
        self.graph.add_constant(Constant(name, ty, dnames, np.ascontiguousarray(data).reshape(data.shape)))
        v = tensor_value(name, dtype, [(d, ex.const(int(n))) for d, n in zip(dnames, data.shape)],
                         data=data)
        if (dt.is_int(dtype) or dtype == "bool") and data.size <= KNOWN_LIMIT:
            v = self._with_known(v, [ex.const(x.item() if dtype != "bool" else bool(x), "i64" if dtype != "bool" else "bool")
                                     for x in data.reshape(-1)])
        return v

    def materialize(self, v: Value, name: str | None = None) -> Value:
        """A Value that is a plain tensor (copying a view into a comprehension if needed)."""
        if v.tensor is not None and (name is None or v.tensor == name):
            return v
        names = self.dim_names(v.names, v.rank)
        shape = v.shape
        out_name = name if name and name not in self.graph.types else self.fresh(name or self._hint())
        self.reserve(out_name)
        ty = TensorType(v.dtype, dict(zip(names, shape)))
        body = ex.cast(v.at([ex.var(d) for d in names]), v.dtype)
        self.graph.add_op(Comprehension(out_name, ty, body))
        out = tensor_value(out_name, v.dtype, list(zip(names, shape)))
        if v.known is not None:
            out = self._with_known(out, v.known)
        return out

    # -------------------------------------------------------------- helpers for importers
    def ints(self, v: Value | None, what: str) -> list[Expr]:
        """The element values of a small integer input, as i64 expressions (maybe symbolic)."""
        if v is None:
            raise self.node.fail(f"{what} is missing")
        if v.known is None:
            raise NeedsValue(self.node.name if self.node else "?", what)
        return [_strip_int_casts(k) for k in v.known]

    def static_ints(self, v: Value | None, what: str) -> list[int]:
        vals = self.ints(v, what)
        if not all(k.is_const for k in vals):
            raise self.node.fail(f"{what} must be constant, it depends on symbolic sizes {vals}")
        return [int(k.value) for k in vals]

    def scalar(self, v: Value | None, what: str, default=None):
        """A constant scalar input's value (Python number), or ``default`` when absent."""
        if v is None:
            return default
        if v.data is not None:
            return np.asarray(v.data).reshape(-1)[0].item()
        if v.known is not None and v.known and v.known[0].is_const:
            return v.known[0].value
        raise NeedsValue(self.node.name if self.node else "?", what)

    @staticmethod
    def broadcast_shape(node: Node, *values: Value) -> tuple[Expr, ...]:
        """NumPy-style broadcast of the values' shapes (sizes may be symbolic)."""
        rank = max(v.rank for v in values)
        out = []
        for i in range(rank):
            size = ex.const(1)
            for v in values:
                j = i - (rank - v.rank)
                if j < 0:
                    continue
                s = v.shape[j]
                if s.is_const and s.value == 1:
                    continue
                if size.is_const and size.value == 1:
                    size = s
                elif not ex.same_size(size, s):
                    if s.is_const and size.is_const:
                        raise node.shape_error(f"cannot broadcast dim {i}: {size.value} vs {s.value}")
                    size = ex.maximum(size, s)  # symbolic: trust the model, keep both
            out.append(size)
        return tuple(out)

    @staticmethod
    def bcast(v: Value, idx: list[Expr]) -> Expr:
        """Read ``v`` at an index of a broadcast result of rank len(idx)."""
        off = len(idx) - v.rank
        sub = []
        for j, s in enumerate(v.shape):
            sub.append(ex.const(0) if (s.is_const and s.value == 1) else idx[off + j])
        return v.at(sub)

    def broadcast_names(self, *values: Value) -> tuple[str, ...]:
        rank = max(v.rank for v in values)
        for v in values:
            if v.rank == rank and v.tensor is not None:
                return v.names
        for v in values:
            if v.rank == rank:
                return v.names
        return ()

    def elementwise(self, dtype: str, inputs: Sequence[Value], fn: Callable[..., Expr]) -> Value:
        """out = fn(a, b, ...) with NumPy broadcasting over the inputs."""
        node = self.node
        shape = self.broadcast_shape(node, *inputs)
        return self.map(dtype, shape, lambda idx: fn(*[self.bcast(v, idx) for v in inputs]),
                        self.broadcast_names(*inputs))

    def procedure(self, results: dict[str, TensorType], body, locals_=None, bounds=None) -> None:
        self.graph.add_op(Procedure(results, body, locals_ or {}, bounds or {}))


def _strip_int_casts(e: Expr) -> Expr:
    """Shape arithmetic often round-trips through i32; sizes are i64 either way."""
    while e.op == "cast" and dt.is_int(e.dtype) and dt.is_int(e.args[0].dtype):
        e = e.args[0]
    return ex.cast(e, "i64") if e.dtype != "i64" else e


def model_error(msg: str) -> ModelError:
    return ModelError(msg)
