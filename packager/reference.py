"""Run a model on the NumPy reference interpreter: as written, or widened to float64.

``run_reference(model, {name: array})`` compiles the model (specializing integer inputs when an
op needs their values at compile time, as ``mlpack.backend`` does) and evaluates the IR graph
with ``spec.ir.interp.run_graph``. Wrong names, ranks and dtypes are ``InputError``s naming
the input, before anything runs.

``float64_outputs(graph, cases)`` is the build's oracle (``spec/accuracy.py``): the graph (the
build gives it the model as imported, ``as_written``, before any pass) with every f32, f16 and
bf16 value widened to float64 (``widen``), so what it computes is
the model's arithmetic with rounding errors some 1e-9 of fp32's. The inputs and the constants
keep their values (an fp32 weight is exactly representable in float64); fp8 and fp4 types are
quantization formats whose rounding is the model's meaning, so they stay as they are.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from mlpack.spec.errors import InputError
from mlpack.spec.ir.expr import Expr
from mlpack.spec.ir.graph import (Comprehension, Constant, For, Graph, If, Let, Procedure, SetSize,
                             Store, TensorType, While)

WIDENED = frozenset({"f16", "bf16", "f32"})  # computed in float64 by the oracle


def _signature(model) -> dict[str, tuple[str, int]]:
    """{graph input name: (IR dtype, rank)} for the inputs that are not initializers."""
    from mlpack.codegen.onnx.importer import ONNX_DTYPES

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
    from mlpack.spec.ir import dtypes as dt

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
    from mlpack.backend import MlpackRep
    from mlpack.codegen.onnx.importer import load_model

    proto = load_model(model)
    check_inputs(proto, feeds)
    rep = MlpackRep(proto)
    outs = rep.run({k: np.asarray(v) for k, v in feeds.items()})
    return dict(zip(rep.output_names, outs))


# ---------------------------------------------------------------- the float64 oracle


def _wide(dtype: str) -> str:
    return "f64" if dtype in WIDENED else dtype


class _Widen:
    """Rewrites expressions, types and statements with WIDENED dtypes made f64; shared
    subexpressions are rewritten once (by identity: hashing a deep Expr walks it)."""

    def __init__(self):
        self.done: dict[int, tuple[Expr, Expr]] = {}

    def expr(self, e: Expr) -> Expr:
        hit = self.done.get(id(e))
        if hit is not None and hit[0] is e:
            return hit[1]
        args = tuple(self.expr(a) for a in e.args)
        dtype = _wide(e.dtype)
        out = e if args == e.args and dtype == e.dtype else Expr(e.op, args, e.arg, dtype)
        self.done[id(e)] = (e, out)  # the original is kept alive so its id stays unique
        return out

    @staticmethod
    def type(t: TensorType) -> TensorType:
        return TensorType(_wide(t.dtype), dict(t.dims))

    def stmts(self, body: list) -> list:
        out = []
        for s in body:
            if isinstance(s, Let):
                out.append(Let(s.name, self.expr(s.value)))
            elif isinstance(s, Store):
                out.append(Store(s.tensor, {d: self.expr(i) for d, i in s.index.items()},
                                 self.expr(s.value)))
            elif isinstance(s, For):
                out.append(For(s.var, s.extent, self.stmts(s.body)))
            elif isinstance(s, While):
                out.append(While(self.expr(s.cond), self.stmts(s.body)))
            elif isinstance(s, If):
                out.append(If(self.expr(s.cond), self.stmts(s.then), self.stmts(s.orelse)))
            elif isinstance(s, SetSize):
                out.append(SetSize(s.sym, self.expr(s.value)))
            else:  # a statement kind this version does not know: widening would be a guess
                raise TypeError(f"cannot widen statement {type(s).__name__}")
        return out


class _Wide:
    """A constant's data as the widened graph reads it, float64, converted where it is read (the
    interpreter indexes it): the reference holds a model's weights once, in their own dtype (a
    mapped file's pages: packager/weights.py), not a float64 copy of every one as well."""

    dtype = np.dtype(np.float64)

    def __init__(self, data: np.ndarray):
        self.data, self.shape, self.size, self.ndim = data, data.shape, data.size, data.ndim

    def __getitem__(self, key):
        return np.asarray(self.data[key], dtype=np.float64)

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self.data, dtype=dtype or np.float64)


def widen(graph: Graph) -> Graph:
    """``graph`` computing in float64 wherever it computed in f32, f16 or bf16 (for the
    interpreter only: a constant's data stays in its dtype, read as float64)."""
    w = _Widen()
    out = Graph(graph.name, list(graph.inputs), list(graph.outputs))
    out.types = {n: w.type(t) for n, t in graph.types.items()}
    for c in graph.constants.values():
        data = _Wide(c.data) if c.type.dtype in WIDENED else c.data
        out.constants[c.name] = Constant(c.name, w.type(c.type), c.layout, data)
    for op in graph.ops:
        if isinstance(op, Comprehension):
            out.ops.append(Comprehension(op.out, w.type(op.type), w.expr(op.body), op.reduce,
                                         dict(op.rdims)))
        else:
            out.ops.append(Procedure({n: w.type(t) for n, t in op.results.items()},
                                     w.stmts(op.body),
                                     {n: w.type(t) for n, t in op.locals_.items()},
                                     dict(op.bounds)))
    return out


def as_written(model) -> Graph:
    """The model (what ``import_model`` takes) as imported, verified, before any pass of the
    pipeline: the graph the build's references evaluate, so that a pass that changed what the
    model computes shows up as an artifact that misses its tolerance, not as a reference that
    moved with it (and a pass that trades memory for recomputation, codegen/passes/
    recompute.py, does not make the interpreter recompute)."""
    from mlpack.codegen.onnx.importer import import_model
    from mlpack.spec.ir.verify import verify

    graph = import_model(model)
    verify(graph)
    return graph


def float64_outputs(graph: Graph, cases: list[dict], each=contextlib.nullcontext) -> list[dict]:
    """The float64 reference outputs of ``graph`` for each case, by output name. Outputs of a
    widened dtype come back as float64; integer and bool outputs in their own dtype. ``each()``:
    the context each case runs in (the build's: one BLAS thread while its workers run)."""
    from mlpack.spec.ir.interp import run_graph

    wide = widen(graph)
    outs = []
    with np.errstate(all="ignore"):  # the model's own overflow and 0/0 are part of its meaning
        for feeds in cases:
            with each():
                got = run_graph(wide, feeds)
            outs.append({p.name: got[p.name] for p in graph.outputs})
    return outs
