"""Kernels that would lower to the same code, found before they are lowered.

A repeated layer (a transformer's blocks, a CNN's stages) schedules kernels that differ only in
the names of their tensors: GPT-2's 261 kernels are 35 distinct functions, RegNetY's 239 are 95.
``module._share_identical`` finds them after lowering, by the LLVM text; building and printing
that text is most of a target's Python time, so each repeat was lowered only to be dropped.

``kernel_key`` is a kernel's structure with its tensors' names replaced by their order of first
appearance, each with how its buffer lies in memory (layout, sizes, dtype). Two kernels with
the same key are the same kernel under a renaming of tensors, and the lowering reaches a
tensor only through its binding (position in ``bound``) and its buffer: the key's order and
``bound``'s follow the same walk, so one function serves both. The key is built from every
field (dataclasses, expressions, containers, numbers by type and spelling); a value of any
other kind makes the kernel unkeyed and it is lowered on its own. Only plain ``Kernel``\\ s are
keyed (procedures and point tiles keep their own lowering).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from mlpack.spec.ir.expr import Expr
from mlpack.codegen.targets.cpu.kernel import Buffer, Kernel

# fields of a Kernel that do not reach its code: its own name (the function's, which the
# text comparison blanks too), the IR ops it computes (for messages), the index checks the
# lowering fills in (carried over by ``renamed_checks``)
_NOT_CODE = frozenset({"name", "fused", "checks"})


class _Unkeyed(Exception):
    """A value the key cannot spell for sure."""


class _Canon:
    """One kernel's canonical form: tensors numbered as first met (``order``)."""

    def __init__(self, buffers: dict[str, Buffer]):
        self.buffers = buffers
        self.order: dict[str, int] = {}
        self.exprs: dict[int, tuple] = {}   # id -> form: expressions share subtrees

    def value(self, x):
        if isinstance(x, Expr):
            got = self.exprs.get(id(x))
            if got is None:
                got = ("E", x.op, self.value(x.arg), x.dtype, tuple(self.value(a) for a in x.args))
                self.exprs[id(x)] = got
            return got
        if isinstance(x, str):
            if x in self.buffers:
                if x not in self.order:
                    self.order[x] = len(self.order)
                return ("T", self.order[x])
            return x
        if x is None or isinstance(x, (bool, int, float, np.generic)):
            return (type(x).__name__, repr(x))   # 1, 1.0, True and -0.0 apart
        if isinstance(x, (tuple, list)):
            return (type(x).__name__, tuple(self.value(v) for v in x))
        if isinstance(x, dict):
            return ("dict", tuple((self.value(k), self.value(v)) for k, v in x.items()))
        if isinstance(x, (frozenset, set)):   # (in no order: by their forms' spelling)
            return (type(x).__name__, tuple(sorted(map(repr, (self.value(v) for v in x)))))
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            return (type(x).__qualname__, tuple((f.name, self.value(getattr(x, f.name)))
                                                for f in dataclasses.fields(x)))
        raise _Unkeyed(type(x).__qualname__)


def kernel_key(k: Kernel, buffers: dict[str, Buffer]) -> tuple[tuple, list[str]] | None:
    """(the key, the kernel's tensors in key order) of a plain Kernel, None where it has none."""
    if type(k) is not Kernel:
        return None
    c = _Canon(buffers)
    try:
        form = tuple((f.name, c.value(getattr(k, f.name)))
                     for f in dataclasses.fields(k) if f.name not in _NOT_CODE)
        # the buffers of the tensors met, in key order (their own names left out); a layout
        # naming a tensor would add it to the order, so walk until none is new
        lay = []
        tensors = list(c.order)
        while len(lay) < len(tensors):
            b = buffers[tensors[len(lay)]]
            lay.append((c.value(b.layout), c.value(b.sizes), b.dtype, b.packed))
            tensors = list(c.order)
    except _Unkeyed:
        return None
    return (form, tuple(lay)), list(c.order)


def renamed_checks(checks: list, first: list[str], same: list[str]) -> list:
    """The index checks of a kernel that shares the function of one whose checks are ``checks``:
    each (tensor, dim) with the tensor at the same place in key order (``first``, ``same``)."""
    to = dict(zip(first, same))
    return [(to[t], d) for t, d in checks]
