"""The rewrite the 16-bit precisions share: contraction weights stored in 16 bits.

A constant is a **weight** when it is an f32 tensor of at least ``MIN_ELEMENTS`` elements read
directly as a factor of a sum of products (a convolution's or matmul's or einsum's operand) and
by no procedure, and (for f16) whose values are all within the narrow type's range. Each weight
becomes a constant of the narrow dtype (its values rounded to
nearest, ties to even), and every read of it widens back: ``cast<f32>(W[...])``, so the
expressions around it keep their f32 dtype. Everything else stays f32: biases, normalization
scales, small constants, and all arithmetic, whose sums accumulate in f32 (softmax, layer norm
and exp included). The container's weight bytes then nearly halve, and targets read the 16-bit
values as they are: the cpu target packs its GEMM panels in 16 bits and widens each vector as
it loads it (codegen/targets/cpu/microkernel.py).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from mlpack.codegen.passes.fold_constants import fold_constant_maps
from mlpack.spec.ir import dtypes as dt
from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr
from mlpack.spec.ir.graph import (Comprehension, Constant, Graph, Procedure, TensorType,
                                  tensors_read)

MIN_ELEMENTS = 64   # below this a constant is a scale or a shape's worth: not worth rounding


def _factors(body: Expr) -> list[Expr]:
    """The operands of the products in ``body`` (a contraction's terms)."""
    return [a for n in ex.walk(body) if n.op == "mul" for a in n.args]


def _procedure_reads(g: Graph) -> set[str]:
    """Tensors any procedure reads (their statements are not rewritten here)."""
    return {t for op in g.ops if isinstance(op, Procedure) for t in tensors_read(op)}


def weights(g: Graph) -> list[str]:
    """The constants of ``g`` the 16-bit precisions store narrow, in graph order."""
    found: dict[str, None] = {}
    for op in g.ops:
        if isinstance(op, Comprehension) and op.reduce == "sum":
            for f in _factors(op.body):
                if f.op == "read" and f.dtype == "f32" and f.arg[0] in g.constants:
                    found[f.arg[0]] = None
    if not found:
        return []
    skip = _procedure_reads(g)
    return [c for c in found if c not in skip and g.constants[c].type.dtype == "f32"
            and g.constants[c].data.size >= MIN_ELEMENTS]


def _widen_reads(e: Expr, narrow: dict[str, str]) -> Expr:
    if e.op == "read" and e.arg[0] in narrow:
        inner = Expr("read", tuple(_widen_reads(a, narrow) for a in e.args), e.arg,
                     narrow[e.arg[0]])
        return Expr("cast", (inner,), None, e.dtype)
    if not e.args:
        return e
    args = tuple(_widen_reads(a, narrow) for a in e.args)
    return e if args == e.args else Expr(e.op, args, e.arg, e.dtype)


def store_weights(g: Graph, dtype: str) -> Graph:
    """``g`` with its weights (``weights``) stored in ``dtype`` (f16 or bf16) and read widened
    to f32; ``g`` itself when it has none. Maps of constants (a quantized model's dequantized
    weights) are evaluated first, so that their values are weights too."""
    g = fold_constant_maps(g)
    names = weights(g)
    if not names:
        return g
    np_dtype = dt.to_numpy(dtype)
    top = float(np.finfo(np_dtype).max) if dtype == "f16" else np.inf
    names = [n for n in names if not np.any(np.abs(g.constants[n].data) > top)]
    if not names:
        return g
    constants = dict(g.constants)
    types = dict(g.types)
    for n in names:
        c = constants[n]
        with np.errstate(over="ignore"):
            data = c.data.astype(np_dtype)
        t = TensorType(dtype, dict(c.type.dims))
        constants[n] = Constant(n, t, c.layout, data)
        types[n] = t
    narrow = {n: dtype for n in names}
    ops = [replace(op, body=_widen_reads(op.body, narrow)) if isinstance(op, Comprehension)
           else op for op in g.ops]
    return replace(g, constants=constants, ops=ops, types=types)
