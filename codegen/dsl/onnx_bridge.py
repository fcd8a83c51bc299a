"""Importing an ONNX node through the DSL function registered for it (registry.py).

The importer (codegen/onnx/importer.py) asks ``importer(domain, op_type)`` for a node no
built-in importer handles. The node's inputs arrive as the importer's ordered values; each
becomes a DSL value whose dims are named by the registered layout, axis by axis, reading the
ONNX value through its view (a Transpose or Slice before the node folds into the reads, no
copy). An input with more axes than its layout names is lifted over the leading ones, named
``batch0`` (the innermost extra axis), ``batch1``, ... so that they line up across inputs as
NumPy broadcasting lines axes up, from the right; they lead each output's axes, outermost
first. The function's results become the node's outputs in the registered axis order, each a
tensor the function's last comprehension made (no copy) or, for a view, one map.
"""

from __future__ import annotations

import functools
import inspect

from mlpack.spec.ir import expr as ex
from mlpack.codegen.dsl.errors import DimError, DslError
from mlpack.codegen.dsl.registry import CustomOp, registered
from mlpack.codegen.dsl.tograph import call_by_name, results
from mlpack.codegen.dsl.trace import Trace
from mlpack.codegen.dsl.values import Size, Value
from mlpack.codegen.onnx.values import tensor_value

LIFTED = "batch"


def importer(domain: str, op_type: str):
    """The importer function ``(builder, node) -> values`` of a registered custom op, or None."""
    c = registered(domain, op_type)
    return None if c is None else functools.partial(import_node, c)


def _lifted_index(name: str) -> int | None:
    rest = name[len(LIFTED):]
    return int(rest) if name.startswith(LIFTED) and rest.isdigit() else None


def _inputs(c: CustomOp, node, trace: Trace, where: str) -> tuple[dict, set]:
    if len(node.input_names) > len(c.inputs):
        raise DslError(f"{where}: the node has {len(node.input_names)} inputs, the op is "
                       f"registered with {len(c.inputs)} ({', '.join(c.inputs)})")
    args, lifted = {}, {}
    for k, (param, layout) in enumerate(c.inputs.items()):
        v = node.input(k)
        if v is None:
            raise DslError(f"{where}: input {k} ({param}) is missing")
        extra = v.rank - len(layout)
        if extra < 0:
            raise DimError(f"{where}: input {param} has {v.rank} axes; its dims "
                           f"{' '.join(layout)} need {len(layout)}")
        names = [f"{LIFTED}{extra - 1 - a}" for a in range(extra)] + list(layout)
        clash = set(names[:extra]) & set(layout)
        if clash:
            raise DimError(f"{where}: input {param} has {extra} more axes than its dims, lifted "
                           f"as {', '.join(names[:extra])}, but the op names a dim "
                           f"{sorted(clash)[0]} itself; rename it in the registration")
        sizes = {n: Size(s, f"input {param}'s {n} (axis {a})")
                 for a, (n, s) in enumerate(zip(names, v.shape))}
        for n in names[:extra]:
            lifted.setdefault(n, sizes[n])
        args[param] = Value(v.at([ex.var(n) for n in names]), sizes, label=param, trace=trace)
    # outermost first, as they lead the outputs' axes
    return args, {n: lifted[n] for n in sorted(lifted, key=_lifted_index, reverse=True)}


def _attributes(c: CustomOp, node, where: str) -> dict:
    params = inspect.signature(c.fn).parameters
    out = {}
    for a in node.proto.attribute:
        if a.name not in params or a.name in c.inputs:
            raise DslError(f"{where}: attribute {a.name} is not a parameter of "
                           f"{c.function}")
        out[a.name] = node.attr(a.name)
    return out


def _output_order(value: Value, layout, oname: str, where: str) -> list[str]:
    missing = [d for d in layout if d not in value.dims]
    if missing:
        raise DimError(f"{where}: output {oname} has no dim {missing[0]} (its dims: "
                       f"{', '.join(value.dims) or 'none'})")
    extra = [d for d in value.dims if d not in layout]
    for d in extra:
        if _lifted_index(d) is None:
            raise DimError(f"{where}: output {oname} has dim {d}, which its registered dims "
                           f"({' '.join(layout)}) do not name")
    return sorted(extra, key=_lifted_index, reverse=True) + list(layout)


def import_node(c: CustomOp, b, node) -> list:
    """Import one node through ``c``'s function into the builder's graph."""
    where = f"{node.op_type} node {node.name!r}"
    trace = Trace(b.graph, fresh=b.fresh)
    try:
        args, lifted = _inputs(c, node, trace, where)
        args.update(_attributes(c, node, where))
        with trace:
            if lifted:
                trace.lifted.append((f"{where} ({c.function})", lifted))
            out = results(call_by_name(c.fn, args, where), list(c.outputs))
            values = []
            for i, (oname, layout) in enumerate(c.outputs.items()):
                value = out.get(oname)
                if value is None:
                    raise DslError(f"{where}: the function gives no output {oname}")
                order = _output_order(value, layout, oname, where)
                hint = node.output_names[i] if i < len(node.output_names) else oname
                t = trace.materialize(value, hint=hint or oname).tensor
                ty = b.graph.types[t]
                values.append(tensor_value(t, ty.dtype, [(d, ty.dims[d]) for d in order]))
    except DslError as e:
        if str(e).startswith(where):
            raise
        raise type(e)(f"{where}: {e}") from None
    return values
