"""The text form of the IR: printing. ``parser.py`` reads exactly what this writes.

    graph "mlp" {
      in %x: f32{n=$batch, k=784} (n, k)
      const %w: f32{k=784, m=10} (k, m) = dense"...base64..."
      %y: f32{n=$batch, m=10} = sum{k=784} %x[n=n, k=k] * %w[k=k, m=m]
      out %y (n, m)
    }

Tensors are ``%name`` (quoted when the name has other characters), symbols ``$name``, loop
variables and scalar locals bare names. Constants of a non-default dtype carry it (``2:i32``,
``0.5:f16``); locals of a non-index dtype too (``m:f32``). A guarded read ends with ``; pad=V``.
"""

from __future__ import annotations

import base64
import json
import math
import re

import numpy as np

from mlpack.spec.ir import dtypes as dt
from mlpack.spec.ir.expr import INFIX, Expr
from mlpack.spec.ir.graph import (Comprehension, Constant, For, Graph, If, Let, Procedure, SetSize,
                                  Store, TensorType, While)

_PLAIN_NAME = re.compile(r"^[A-Za-z0-9_.]+$")
_PREC = {"add": 1, "sub": 1, "mul": 2, "floordiv": 2, "mod": 2}
SMALL_CONSTANT = 8  # constants with at most this many elements print as a value list


def format_name(name: str, sigil: str = "%") -> str:
    return sigil + (name if _PLAIN_NAME.match(name) else json.dumps(name))


def format_scalar(value, dtype: str, default_dtype: str | None = None) -> str:
    """A literal; the dtype suffix is left off when it is the literal's default."""
    if dtype == "bool":
        text = "true" if value else "false"
    elif dt.is_int(dtype):
        text = str(int(value))
    else:
        v = float(value)
        if math.isnan(v):
            text = "nan"
        elif math.isinf(v):
            text = "inf" if v > 0 else "-inf"
        else:
            text = repr(v)
    if default_dtype is None:
        default_dtype = "bool" if dtype == "bool" else "i64" if dt.is_int(dtype) else "f32"
    return text if dtype == default_dtype else f"{text}:{dtype}"


def format_expr(e: Expr, prec: int = 0) -> str:
    op = e.op
    if op == "const":
        return format_scalar(e.arg, e.dtype)
    if op == "var":
        return e.arg if e.dtype == dt.INDEX else f"{e.arg}:{e.dtype}"
    if op == "sym":
        return "$" + e.arg
    if op == "read":
        tensor, dims, pad = e.arg
        idx = ", ".join(f"{d}={format_expr(a)}" for d, a in zip(dims, e.args))
        tail = "" if pad is None else f"; pad={format_scalar(pad, e.dtype, e.dtype)}"
        return f"{format_name(tensor)}[{idx}{tail}]"
    if op in INFIX:
        p = _PREC[op]
        text = f"{format_expr(e.args[0], p)} {INFIX[op]} {format_expr(e.args[1], p + 1)}"
        return f"({text})" if p < prec else text
    if op == "cast":
        return f"cast<{e.dtype}>({format_expr(e.args[0])})"
    return f"{op}({', '.join(format_expr(a) for a in e.args)})"


def format_type(t: TensorType) -> str:
    dims = ", ".join(f"{d}={format_expr(s)}" for d, s in t.dims.items())
    return f"{t.dtype}{{{dims}}}"


def format_dims(dims: dict) -> str:
    return "{" + ", ".join(f"{d}={format_expr(s)}" for d, s in dims.items()) + "}"


def format_layout(layout) -> str:
    return "(" + ", ".join(layout) + ")"


def format_constant(c: Constant) -> str:
    head = f"const {format_name(c.name)}: {format_type(c.type)} {format_layout(c.layout)} = "
    data = np.ascontiguousarray(c.data)
    if data.size <= SMALL_CONSTANT:
        vals = ", ".join(format_scalar(v, c.type.dtype, c.type.dtype) for v in data.reshape(-1).tolist())
        return head + f"[{vals}]"
    return head + 'dense"' + base64.b64encode(data.astype(data.dtype.newbyteorder("<")).tobytes()).decode() + '"'


def format_comprehension(op: Comprehension) -> str:
    head = f"{format_name(op.out)}: {format_type(op.type)} = "
    if op.reduce is None:
        return head + format_expr(op.body)
    return head + f"{op.reduce}{format_dims(op.rdims)} {format_expr(op.body)}"


def _format_stmts(stmts, indent: str) -> list[str]:
    lines = []
    for s in stmts:
        if isinstance(s, Let):
            lines.append(f"{indent}let {s.name}: {s.value.dtype} = {format_expr(s.value)}")
        elif isinstance(s, Store):
            idx = ", ".join(f"{d}={format_expr(i)}" for d, i in s.index.items())
            lines.append(f"{indent}{format_name(s.tensor)}[{idx}] = {format_expr(s.value)}")
        elif isinstance(s, SetSize):
            lines.append(f"{indent}size ${s.sym} = {format_expr(s.value)}")
        elif isinstance(s, For):
            lines.append(f"{indent}for {s.var} in {format_expr(s.extent)} {{")
            lines += _format_stmts(s.body, indent + "  ")
            lines.append(indent + "}")
        elif isinstance(s, While):
            lines.append(f"{indent}while {format_expr(s.cond)} {{")
            lines += _format_stmts(s.body, indent + "  ")
            lines.append(indent + "}")
        elif isinstance(s, If):
            lines.append(f"{indent}if {format_expr(s.cond)} {{")
            lines += _format_stmts(s.then, indent + "  ")
            if s.orelse:
                lines.append(indent + "} else {")
                lines += _format_stmts(s.orelse, indent + "  ")
            lines.append(indent + "}")
        else:  # pragma: no cover
            raise TypeError(f"unknown statement {s!r}")
    return lines


def format_procedure(op: Procedure, indent: str = "  ") -> list[str]:
    outs = ", ".join(f"{format_name(n)}: {format_type(t)}" for n, t in op.results.items())
    head = f"{indent}{outs} = proc"
    if op.bounds:
        head += " bounds{" + ", ".join(f"${s}={format_expr(b)}" for s, b in op.bounds.items()) + "}"
    if op.locals_:
        head += " locals{" + ", ".join(f"{format_name(n)}: {format_type(t)}" for n, t in op.locals_.items()) + "}"
    return [head + " {"] + _format_stmts(op.body, indent + "  ") + [indent + "}"]


def format_graph(g: Graph) -> str:
    lines = [f"graph {json.dumps(g.name)} {{"]
    for p in g.inputs:
        lines.append(f"  in {format_name(p.name)}: {format_type(g.types[p.name])} {format_layout(p.layout)}")
    for c in g.constants.values():
        lines.append("  " + format_constant(c))
    for op in g.ops:
        if isinstance(op, Comprehension):
            lines.append("  " + format_comprehension(op))
        else:
            lines += format_procedure(op)
    for p in g.outputs:
        lines.append(f"  out {format_name(p.name)} {format_layout(p.layout)}")
    lines.append("}")
    return "\n".join(lines) + "\n"
