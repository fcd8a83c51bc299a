"""Reductions written as in the maths: ``dsl.sum[kx, ky, ci, k](P(x=2*x + kx) * W)``.

A reducer subscripted with the dims it runs over (index variables or their names) and applied
to a value makes one comprehension: the value's other dims are the result's, the listed ones
its reduction dims. ``dsl.sum(body, over=(kx, ky))`` says the same. ``argmax``/``argmin`` run
over one dim and give its index (i64). The result is a tensor read back at its own dims, so it
composes with everything else: a reduction inside an expression is computed first, as its own
comprehension, and read where it is used.
"""

from __future__ import annotations

from mlpack.spec.ir import expr as ex
from mlpack.codegen.dsl.errors import DimError, DslError
from mlpack.codegen.dsl.trace import current
from mlpack.codegen.dsl.values import Dim, Value, as_value


class Reducer:
    """One of the IR's reductions, applied to named dims."""

    def __init__(self, kind: str):
        self.kind = kind

    def __repr__(self) -> str:
        return f"dsl.{self.kind}"

    def __getitem__(self, over):
        over = over if isinstance(over, tuple) else (over,)
        return lambda body, name=None: self(body, over=over, name=name)

    def __call__(self, body, over, name: str | None = None) -> Value:
        body = as_value(body)
        over = over if isinstance(over, (tuple, list)) else (over,)
        names = []
        for d in over:
            n = d.name if isinstance(d, Dim) else d
            if not isinstance(n, str):
                raise DslError(f"{self.kind} runs over dims (dsl.dims or names), not "
                               f"{type(d).__name__}")
            if n not in body.sizes:
                raise DimError(f"{self.kind} over {n}: {body.label} has no dim {n} "
                               f"(its dims: {', '.join(body.dims) or 'none'})")
            if n in names:
                raise DimError(f"{self.kind} over {n} twice")
            names.append(n)
        if not names:
            raise DslError(f"{self.kind} needs at least one dim to run over")
        if self.kind.startswith("arg") and len(names) != 1:
            raise DimError(f"{self.kind} runs over exactly one dim, not {', '.join(names)}")
        trace = body.trace or current()
        return trace.materialize(body, name, self.kind, tuple(names))


sum_ = Reducer("sum")
prod = Reducer("prod")
max_ = Reducer("max")
min_ = Reducer("min")
argmax = Reducer("argmax")
argmin = Reducer("argmin")


def mean(body, over, name: str | None = None) -> Value:
    """The sum over ``over`` divided by the number of terms (a sum, then one division)."""
    body = as_value(body)
    over = over if isinstance(over, (tuple, list)) else (over,)
    total = sum_(body, over)
    count = ex.product([body.size(d.name if isinstance(d, Dim) else d) for d in over])
    out = total / (float(count.value) if count.is_const else Value(count).astype(total.dtype))
    return out.materialize(name) if name else out
