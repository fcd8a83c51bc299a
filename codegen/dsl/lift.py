"""Lifting: an operator written for the dims it is about runs over any others its inputs have.

    @dsl.op(image="x y ci", kernel="kx ky ci co")
    def conv2d(image, kernel):
        x, y, kx, ky, ci = dsl.dims("x y kx ky ci")
        return dsl.sum[kx, ky, ci](image(x=x + kx, y=y + ky) * kernel)

    conv2d(image=video, kernel=K)     # video has dims {b, t, x, y, ci}: the result {b, t, x, y, co}

Nothing is rewritten to lift: a read names only the dims it re-indexes, every other dim of the
tensor stays at its own variable, so ``b`` and ``t`` are free variables of the comprehension
and become dims of its result, one comprehension with no transpose or reshape. What ``op``
adds is the contract: each input must have the dims declared for it (a ``DimError`` names the
missing one), and a dim the call is lifted over must not be a dim the operator names itself
(declared for another input, made with ``dsl.dim``, or a constant's): the two would be joined
by name, silently, so that is a ``DimError`` telling to rename the input's dim.
Undeclared functions lift the same way, without the checks.
"""

from __future__ import annotations

import functools
import inspect

from mlpack.codegen.dsl.errors import DimError, DslError
from mlpack.codegen.dsl.values import Value


def _dim_set(spec, where: str) -> frozenset:
    names = spec.split() if isinstance(spec, str) else list(spec)
    if not all(isinstance(n, str) for n in names):
        raise DslError(f"{where}: declare dims as names (\"x y ci\")")
    return frozenset(names)


def op(fn=None, **declared):
    """Declare the dims an operator is about, per input: ``@dsl.op(image="x y ci", ...)``.
    Inputs left out are not checked (scalars, values the operator reads as they are)."""
    if fn is None:
        return lambda f: op(f, **declared)
    about = {p: _dim_set(d, f"{fn.__name__}: input {p}") for p, d in declared.items()}
    params = inspect.signature(fn).parameters
    for p in about:
        if p not in params:
            raise DslError(f"{fn.__name__} declares dims for {p}, which is not a parameter")

    @functools.wraps(fn)
    def lifted(*args, **kwargs):
        try:
            bound = inspect.signature(fn).bind(*args, **kwargs)
        except TypeError as e:
            raise DslError(f"{fn.__name__}: {e}") from None
        extra: dict[str, str] = {}
        trace = None
        for p, dims in about.items():
            v = bound.arguments.get(p)
            if not isinstance(v, Value):
                continue
            trace = trace or v.trace
            for d in sorted(dims - set(v.dims)):
                raise DimError(f"{fn.__name__}: input {p} has no dim {d} (it has "
                               f"{', '.join(v.dims) or 'none'}; the operator needs "
                               f"{', '.join(sorted(dims))})")
            for d in v.dims:
                if d not in dims:
                    extra.setdefault(d, p)
        own = frozenset().union(*about.values()) if about else frozenset()
        for d, p in extra.items():
            if d in own:
                users = [q for q, dims in about.items() if d in dims]
                raise DimError(f"{fn.__name__}: dim {d} of input {p} is not one of its "
                               f"declared dims, so the call is lifted over it, but the "
                               f"operator uses {d} for {', '.join(users)}; rename it "
                               f"({p}.rename({d}=...))")
        if trace is None or not extra:
            return fn(*bound.args, **bound.kwargs)
        trace.lifted.append((fn.__name__, {d: bound.arguments[p].sizes[d]
                                           for d, p in extra.items()}))
        try:
            return fn(*bound.args, **bound.kwargs)
        finally:
            trace.lifted.pop()

    lifted.declared = about
    return lifted
