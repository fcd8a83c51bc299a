"""A DSL function as an IR ``Graph``: the inputs named and typed, the outputs laid out.

    g = dsl.to_graph(capsule_conv, inputs={"P": dsl.f32(n="batch", x=16, y=16, ci=32, i=4, k=4),
                                           "W": dsl.f32(kx=3, ky=3, ci=32, co=32, k=4, j=4)})

The function is called with one keyword argument per input (a value reading the graph input of
that name) and returns a value (the output ``out``) or a dict of them (output name -> value).
The graph is verified before it is returned, and is what every pass, the interpreter and each
target take; ``optimize=True`` runs the graph passes (codegen/passes/pipeline.py) as the
ONNX path does.
"""

from __future__ import annotations

import inspect

from mlpack.spec.ir.graph import Graph, Port
from mlpack.spec.ir.verify import verify
from mlpack.codegen.dsl.errors import DimError, DslError
from mlpack.codegen.dsl.tensors import TensorSpec
from mlpack.codegen.dsl.trace import Trace
from mlpack.codegen.dsl.values import Value


def call_by_name(fn, args: dict, what: str):
    """``fn(**args)``, with a one-line DslError when they do not fit its parameters."""
    try:
        inspect.signature(fn).bind(**args)
    except TypeError as e:
        raise DslError(f"{what}: {getattr(fn, '__name__', fn)} cannot take "
                       f"{', '.join(args) or 'no arguments'}: {e}") from None
    return fn(**args)


def results(out, names) -> dict[str, Value]:
    """The function's results by output name: a dict as it is, a value as ``names[0]``, a
    tuple or list in the order of ``names``."""
    if isinstance(out, dict):
        items = dict(out)
    elif isinstance(out, (tuple, list)):
        if len(out) != len(names):
            raise DslError(f"the function returns {len(out)} values for outputs {names}")
        items = dict(zip(names, out))
    else:
        items = {names[0]: out}
    for k, v in items.items():
        if not isinstance(v, Value):
            raise DslError(f"output {k} is a {type(v).__name__}, not a DSL value")
    return items


def name_outputs(trace: Trace, out: dict[str, Value]) -> dict[str, str]:
    """Make each output a tensor of this trace named as the output: the op that computed it
    when it is a plain result of this trace, else a copy (a view, an input, a repeat). An
    intermediate that took an output's name is moved aside, as the ONNX importer does."""
    from mlpack.codegen.passes.rename import rename_in_graph

    g, made = trace.graph, {}
    for oname, value in out.items():
        t = value.tensor
        if t is None or t not in trace.made or t in made.values():
            t = trace.materialize(value, hint=oname, name=None, force=True).tensor
        made[oname] = t
    mapping = {t: o for o, t in made.items() if t != o}
    for o in made:
        if o in g.types and o not in mapping and made[o] != o:
            if o not in trace.made:
                raise DslError(f"output name {o} is already a tensor of the graph (an input)")
            mapping[o] = trace.fresh(o + ".t")
    rename_in_graph(g, mapping)
    return {o: o for o in made}


def layout_of(graph: Graph, tensor: str, given, name: str) -> tuple[str, ...]:
    dims = tuple(graph.types[tensor].dims)
    if given is None:
        return dims
    order = tuple(given.split() if isinstance(given, str) else given)
    if set(order) != set(dims) or len(order) != len(dims):
        extra = sorted(set(order) - set(dims))
        missing = sorted(set(dims) - set(order))
        what = (f"has no dim {extra[0]}" if extra else f"dim {missing[0]} is not in the layout"
                if missing else "the layout names a dim twice")
        raise DimError(f"output {name}: {what} (its dims: {', '.join(dims)})")
    return order


def to_graph(fn, inputs: dict[str, TensorSpec], *, name: str | None = None,
             outputs=("out",), layouts: dict | None = None, optimize: bool = False) -> Graph:
    """Trace ``fn`` over graph inputs of the given types into a verified IR graph.

    ``outputs``: the output names, for a function that returns a value or a tuple (a returned
    dict names its own); ``layouts``: output name -> the order of its dims outside the graph
    (default: the order the comprehension has).
    """
    g = Graph(name or getattr(fn, "__name__", "dsl"))
    trace = Trace(g)
    args = {}
    for pname, spec in inputs.items():
        if not isinstance(spec, TensorSpec):
            raise DslError(f"input {pname}: give its type as dsl.f32(dim=size, ...), not "
                           f"{type(spec).__name__}")
        g.add_input(pname, spec.type(), tuple(spec.dims))
        args[pname] = trace.tensor(pname)
    names = [outputs] if isinstance(outputs, str) else list(outputs)
    with trace:
        out = results(call_by_name(fn, args, "to_graph"), names)
        for oname, t in name_outputs(trace, out).items():
            g.outputs.append(Port(t, layout_of(g, t, (layouts or {}).get(oname), oname)))
    verify(g)
    if optimize:
        from mlpack.codegen.passes.pipeline import run_pipeline
        g = run_pipeline(g)
    return g
