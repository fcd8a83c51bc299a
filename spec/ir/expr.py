"""Scalar expressions: the body of every comprehension, every index and every size.

One immutable node type, ``Expr(op, args, arg, dtype)``, covers constants, loop variables,
symbols, tensor reads and scalar operations; ops are data (strings listed in the tables below),
not classes. Indices and sizes are ordinary ``i64`` expressions, so an index may be affine
(``2*h + kh - 3``), quasi-affine (``m // 64``) or indirect (it reads another tensor: gather).

A read names its tensor and maps each of the tensor's *named* dimensions to an index; there is
no positional order anywhere. A read with ``pad`` set is guarded: out-of-range indices give the
pad value (convolution padding, concat, bounds checks) instead of being an error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable

from mlpack.spec.ir import dtypes as dt

UNARY = frozenset({
    "neg", "abs", "exp", "log", "sqrt", "sin", "cos", "tan", "asin", "acos", "atan",
    "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "floor", "ceil", "round",
    "sign", "not", "bitnot", "isnan", "isinf", "recip", "sigmoid",
})
# Predicates return bool whatever their operand type.
UNARY_PREDICATES = frozenset({"not", "isnan", "isinf"})
BINARY = frozenset({
    "add", "sub", "mul", "div", "floordiv", "mod", "fmod", "pow", "max", "min",
    "and", "or", "xor", "bitand", "bitor", "bitxor", "shl", "shr",
    "eq", "ne", "lt", "le", "gt", "ge", "atan2",
})
COMPARISONS = frozenset({"eq", "ne", "lt", "le", "gt", "ge"})
LOGICAL = frozenset({"and", "or", "xor"})
LEAVES = frozenset({"const", "var", "sym"})
# select(cond, a, b), cast<T>(x), read
SPECIAL = frozenset({"select", "cast", "read"})
OPS = UNARY | BINARY | LEAVES | SPECIAL
INFIX = {"add": "+", "sub": "-", "mul": "*", "floordiv": "//", "mod": "%"}


@dataclass(frozen=True)
class Expr:
    """A node of a scalar expression tree.

    op:    one of OPS.
    args:  operand expressions (for a read: the index of each named dim, in ``arg[1]`` order).
    arg:   the payload: the value of a const, the name of a var or sym, and for a read the
           triple (tensor name, dim names, pad value or None).
    dtype: the element type of the result.
    """

    op: str
    args: tuple["Expr", ...] = ()
    arg: Any = None
    dtype: str = dt.INDEX

    # Arithmetic operators build expressions, so schedules and importers read like math.
    # (== stays structural equality: expressions are hashed and compared for CSE.)
    def __add__(self, o): return add(self, o)
    def __radd__(self, o): return add(o, self)
    def __sub__(self, o): return sub(self, o)
    def __rsub__(self, o): return sub(o, self)
    def __mul__(self, o): return mul(self, o)
    def __rmul__(self, o): return mul(o, self)
    def __floordiv__(self, o): return floordiv(self, o)
    def __mod__(self, o): return mod(self, o)
    def __neg__(self): return unary("neg", self)

    @property
    def is_const(self) -> bool:
        return self.op == "const"

    @property
    def value(self):
        assert self.op == "const", self
        return self.arg

    def __repr__(self) -> str:  # the text form; see printer
        from mlpack.spec.ir.printer import format_expr
        return format_expr(self)


def result_dtype(op: str, arg_dtypes: list[str]) -> str:
    """The dtype an op gives for operands of the given dtypes (casts name theirs explicitly)."""
    n = len(arg_dtypes)
    if op in UNARY and n == 1:
        return "bool" if op in UNARY_PREDICATES else arg_dtypes[0]
    if op in BINARY and n == 2:
        if op in COMPARISONS or op in LOGICAL:
            return "bool"
        return dt.promote(*arg_dtypes)
    if op == "select" and n == 3:
        return dt.promote(arg_dtypes[1], arg_dtypes[2])
    raise ValueError(f"unknown operation {op!r} with {n} operand(s)")


# ---------------------------------------------------------------- leaves


def const(value, dtype: str | None = None) -> Expr:
    """A constant; Python ints default to i64, floats to f32, bools to bool."""
    if dtype is None:
        dtype = "bool" if isinstance(value, bool) else "i64" if isinstance(value, int) else "f32"
    return Expr("const", (), _normalize(value, dtype), dtype)


def _normalize(value, dtype: str):
    """Store a constant as the Python scalar its dtype would hold, so equal constants compare equal."""
    if dtype == "bool":
        return bool(value)
    if dt.is_int(dtype):
        return int(value)
    import numpy as np
    with np.errstate(over="ignore"):  # a literal too big for its dtype is +-inf
        v = float(np.asarray(value).astype(dt.to_numpy(dtype)).astype(np.float64))
    return _NAN if math.isnan(v) else v


# Every nan constant holds this one object: nan != nan, but tuples (so Exprs) compare
# identical members equal, so a nan constant equals itself after a print -> parse round trip.
_NAN = float("nan")


def var(name: str, dtype: str = dt.INDEX) -> Expr:
    """A loop variable (i64), or in a procedure a scalar local of any dtype."""
    return Expr("var", (), name, dtype)


def sym(name: str) -> Expr:
    return Expr("sym", (), name, dt.INDEX)


def read(tensor: str, index: dict[str, Expr | int], dtype: str, pad=None) -> Expr:
    """Read ``tensor`` at ``index`` (one entry per named dim of the tensor)."""
    dims = tuple(index)
    args = tuple(as_expr(index[d]) for d in dims)
    if pad is not None:
        pad = _normalize(pad, dtype)
    return Expr("read", args, (tensor, dims, pad), dtype)


def as_expr(x, dtype: str | None = None) -> Expr:
    if isinstance(x, Expr):
        return x
    return const(x, dtype)


# ---------------------------------------------------------------- operations


def unary(op: str, x) -> Expr:
    x = as_expr(x)
    assert op in UNARY, op
    out = "bool" if op in UNARY_PREDICATES else x.dtype
    if x.is_const and op == "neg":
        return const(-x.value, x.dtype)
    return Expr(op, (x,), None, out)


def binary(op: str, a, b) -> Expr:
    assert op in BINARY, op
    if not isinstance(a, Expr):
        a = as_expr(a, b.dtype if isinstance(b, Expr) and not isinstance(a, bool) else None)
    if not isinstance(b, Expr):
        b = as_expr(b, a.dtype if not isinstance(b, bool) else None)
    if op in LOGICAL:
        out = "bool"
    elif op in COMPARISONS:
        out = "bool"
    else:
        out = dt.promote(a.dtype, b.dtype)
    if out == dt.INDEX and a.dtype == b.dtype == dt.INDEX:
        folded = _fold_index(op, a, b)
        if folded is not None:
            return folded
    if op in COMPARISONS and a.dtype == b.dtype == dt.INDEX:
        folded = _fold_compare(op, a, b)
        if folded is not None:
            return folded
    return Expr(op, (a, b), None, out)


def _fold_index(op: str, a: Expr, b: Expr) -> Expr | None:
    """Keep index and size arithmetic small: fold constants and identities."""
    if a.is_const and b.is_const:
        x, y = a.value, b.value
        if op == "add": return const(x + y)
        if op == "sub": return const(x - y)
        if op == "mul": return const(x * y)
        if op == "floordiv" and y != 0: return const(x // y)
        if op == "div" and y != 0: return const(int(x / y) if abs(x) < 2**52 else x // y
                                                if (x < 0) == (y < 0) or x % y == 0 else x // y + 1)
        if op == "mod" and y != 0: return const(x % y)
        if op == "max": return const(max(x, y))
        if op == "min": return const(min(x, y))
        return None
    if op == "add":
        if b.is_const and b.value == 0: return a
        if a.is_const and a.value == 0: return b
        if b.is_const and b.value < 0: return binary("sub", a, const(-b.value))
        if b.is_const and a.op in ("add", "sub") and a.args[1].is_const:
            c = a.args[1].value if a.op == "add" else -a.args[1].value
            return add(a.args[0], c + b.value)
    if op == "sub":
        if b.is_const and b.value == 0: return a
        if a == b: return const(0)
        if b.is_const and b.value < 0: return add(a, -b.value)
        if b.is_const and a.op in ("add", "sub") and a.args[1].is_const:
            c = a.args[1].value if a.op == "add" else -a.args[1].value
            return add(a.args[0], c - b.value)
    if op == "mul":
        if (a.is_const and a.value == 0) or (b.is_const and b.value == 0): return const(0)
        if b.is_const and b.value == 1: return a
        if a.is_const and a.value == 1: return b
        if b.is_const and not a.is_const: return Expr("mul", (b, a), None, dt.INDEX)
    if op in ("floordiv",) and b.is_const and b.value == 1:
        return a
    if op == "mod" and b.is_const and b.value == 1:
        return const(0)
    return None


# ---- what is known of a size: symbols are sizes, so never negative

_RANGE_CHECKS = {"eq": lambda lo, hi: False if lo > 0 or hi < 0 else True if lo == hi == 0 else None,
                 "ne": lambda lo, hi: True if lo > 0 or hi < 0 else False if lo == hi == 0 else None,
                 "lt": lambda lo, hi: True if hi < 0 else False if lo >= 0 else None,
                 "le": lambda lo, hi: True if hi <= 0 else False if lo > 0 else None,
                 "gt": lambda lo, hi: True if lo > 0 else False if hi <= 0 else None,
                 "ge": lambda lo, hi: True if lo >= 0 else False if hi < 0 else None}


def _fold_compare(op: str, a: Expr, b: Expr) -> Expr | None:
    """A comparison of index expressions that constants or the range of ``a - b`` decide, as a
    constant.

    Exporters guard sizes against -1 ("infer this dim"): torch's ``expand(B, -1, -1)`` becomes
    ``where(eq(shape, -1), 1, shape)``, and only the fact that ``$batch >= 0`` makes the size a
    plain ``$batch`` again (spec/ir/expr.py is where every size is built, so it is decided once).
    """
    if a.is_const and b.is_const:
        lo = hi = a.value - b.value
    elif not (free_syms(a) or free_syms(b)):
        return None  # only sizes are reasoned about; other comparisons stay as written
    else:
        lo, hi = bounds(simplify_size(sub(a, b)))
    verdict = _RANGE_CHECKS[op](-math.inf if lo is None else lo, math.inf if hi is None else hi)
    return None if verdict is None else const(verdict)


def bounds(e: Expr) -> tuple[int | None, int | None]:
    """Lower and upper bounds of an index expression (None: unbounded), from the one fact known
    of every size symbol: it is >= 0. Loop variables and reads are unbounded here."""
    op = e.op
    if op == "const" and isinstance(e.arg, int) and not isinstance(e.arg, bool):
        return e.arg, e.arg
    if op == "sym":
        return 0, None
    if op not in ("add", "sub", "mul", "floordiv", "mod", "max", "min", "select") \
            or e.dtype != dt.INDEX:
        return None, None
    if op == "select":
        (lo1, hi1), (lo2, hi2) = bounds(e.args[1]), bounds(e.args[2])
        return (None if lo1 is None or lo2 is None else min(lo1, lo2),
                None if hi1 is None or hi2 is None else max(hi1, hi2))
    (alo, ahi), (blo, bhi) = bounds(e.args[0]), bounds(e.args[1])
    if op == "add":
        return (None if alo is None or blo is None else alo + blo,
                None if ahi is None or bhi is None else ahi + bhi)
    if op == "sub":
        return (None if alo is None or bhi is None else alo - bhi,
                None if ahi is None or blo is None else ahi - blo)
    if op in ("max", "min"):
        pick = max if op == "max" else min
        lo = pick(alo, blo) if alo is not None and blo is not None else \
            (alo if alo is not None else blo) if op == "max" else None
        hi = pick(ahi, bhi) if ahi is not None and bhi is not None else \
            (ahi if ahi is not None else bhi) if op == "min" else None
        return lo, hi
    if op == "mul" and alo is not None and blo is not None and alo >= 0 and blo >= 0:
        return alo * blo, None if ahi is None or bhi is None else ahi * bhi
    if op == "floordiv" and blo is not None and blo == bhi and blo > 0:
        return (None if alo is None else alo // blo, None if ahi is None else ahi // blo)
    if op == "mod" and blo is not None and blo == bhi and blo > 0:
        return 0, blo - 1
    return None, None


def add(a, b): return binary("add", a, b)
def sub(a, b): return binary("sub", a, b)
def mul(a, b): return binary("mul", a, b)
def floordiv(a, b): return binary("floordiv", a, b)
def mod(a, b): return binary("mod", a, b)
def maximum(a, b): return binary("max", a, b)
def minimum(a, b): return binary("min", a, b)


def select(cond, a, b) -> Expr:
    cond = as_expr(cond)
    if not isinstance(a, Expr):
        a = as_expr(a, b.dtype if isinstance(b, Expr) else None)
    if not isinstance(b, Expr):
        b = as_expr(b, a.dtype)
    if cond.is_const:
        return a if cond.value else b
    if a == b:
        return a
    return Expr("select", (cond, a, b), None, dt.promote(a.dtype, b.dtype))


def cast(x, dtype: str) -> Expr:
    x = as_expr(x)
    if x.dtype == dtype:
        return x
    if x.is_const:
        import numpy as np
        v = np.asarray(x.value, dtype=dt.to_numpy(x.dtype))
        if dt.is_float(x.dtype) and dt.is_int(dtype) and not np.isfinite(v):
            return Expr("cast", (x,), None, dtype)
        with np.errstate(all="ignore"):
            return const(v.astype(dt.to_numpy(dtype)).item(), dtype)
    return Expr("cast", (x,), None, dtype)


# ---------------------------------------------------------------- queries


def walk(e: Expr) -> Iterable[Expr]:
    """Every node of ``e``, parents before children (shared nodes repeat)."""
    stack = [e]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(n.args))


def free_vars(e: Expr) -> set[str]:
    return {n.arg for n in walk(e) if n.op == "var"}


def free_syms(e: Expr) -> set[str]:
    return {n.arg for n in walk(e) if n.op == "sym"}


def reads(e: Expr) -> list[Expr]:
    return [n for n in walk(e) if n.op == "read"]


def substitute(e: Expr, mapping: dict[str, Expr], kind: str = "var") -> Expr:
    """Replace vars (or syms, with kind='sym') by expressions, rebuilding with folding."""
    if e.op == kind and e.arg in mapping:
        return mapping[e.arg]
    if not e.args:
        return e
    args = tuple(substitute(a, mapping, kind) for a in e.args)
    if args == e.args:
        return e
    return rebuild(e, args)


def rename_tensors(e: Expr, mapping: dict[str, str]) -> Expr:
    """``e`` with reads of each tensor in ``mapping`` redirected to its new name."""
    if not e.args and e.op != "read":
        return e
    args = tuple(rename_tensors(a, mapping) for a in e.args)
    if e.op == "read":
        t, dims, pad = e.arg
        if t in mapping:
            return Expr("read", args, (mapping[t], dims, pad), e.dtype)
    if args == e.args:
        return e
    return Expr(e.op, args, e.arg, e.dtype)


def rebuild(e: Expr, args: tuple[Expr, ...]) -> Expr:
    """``e`` with new operands, folding again where the op allows."""
    if e.op in BINARY and (e.dtype == dt.INDEX or e.op in COMPARISONS):
        return binary(e.op, *args)
    if e.op == "select":
        return select(*args)
    if e.op == "cast":
        return cast(args[0], e.dtype)
    return Expr(e.op, args, e.arg, e.dtype)


def replace_node(e: Expr | None, node: Expr, repl: Expr) -> Expr | None:
    """``e`` with the node ``node`` (by identity, not by equality) replaced by ``repl``."""
    if e is None:
        return None
    if e is node:
        return repl
    if not e.args:
        return e
    args = tuple(replace_node(a, node, repl) for a in e.args)
    return e if all(a is b for a, b in zip(args, e.args)) else rebuild(e, args)


def index_value(e: Expr, env: dict[str, int]) -> int:
    """Evaluate an index/size expression with the given var and sym values (Python ints)."""
    op = e.op
    if op == "const":
        return e.arg
    if op in ("var", "sym"):
        try:
            return env[e.arg]
        except KeyError:
            raise KeyError(f"unbound {'symbol $' if op == 'sym' else 'variable '}{e.arg}") from None
    vals = [index_value(a, env) for a in e.args]
    if op == "add": return vals[0] + vals[1]
    if op == "sub": return vals[0] - vals[1]
    if op == "mul": return vals[0] * vals[1]
    if op == "floordiv": return vals[0] // vals[1]
    if op == "mod": return vals[0] % vals[1]
    if op == "max": return max(vals)
    if op == "min": return min(vals)
    if op == "neg": return -vals[0]
    if op == "div": return int(vals[0] / vals[1])
    if op == "select": return vals[1] if vals[0] else vals[2]
    if op in COMPARISONS:
        return {"eq": vals[0] == vals[1], "ne": vals[0] != vals[1], "lt": vals[0] < vals[1],
                "le": vals[0] <= vals[1], "gt": vals[0] > vals[1], "ge": vals[0] >= vals[1]}[op]
    if op == "cast": return int(vals[0])
    raise ValueError(f"not an index expression: {e!r}")


def ceildiv(a, b):
    a, b = as_expr(a), as_expr(b)
    if a.is_const and b.is_const:
        return const(-(-a.value // b.value))
    return floordiv(a + (b - 1), b)


def product(xs) -> Expr:
    out = const(1)
    for x in xs:
        out = simplify_size(mul(out, x))
    return out


def is_finite_number(v) -> bool:
    return not (isinstance(v, float) and (math.isnan(v) or math.isinf(v)))


# ---------------------------------------------------------------- sizes


def _poly(e: Expr, memo: dict | None = None):
    """``e`` as a polynomial {monomial (sorted sym names): coefficient}, or None. ``memo``:
    the polynomials of the subtrees already seen in this walk, by id (the tree keeps them
    alive); callers only read what it returns."""
    memo = {} if memo is None else memo
    if id(e) not in memo:
        memo[id(e)] = _poly_of(e, memo)
    return memo[id(e)]


def _poly_of(e: Expr, memo):
    if e.op == "const" and isinstance(e.arg, int):
        return {(): e.arg} if e.arg else {}
    if e.op == "sym":
        return {(e.arg,): 1}
    if e.op in ("add", "sub", "mul") and e.dtype == dt.INDEX:
        a, b = _poly(e.args[0], memo), _poly(e.args[1], memo)
        if a is None or b is None:
            return None
        if e.op == "mul":
            out: dict = {}
            for ma, ca in a.items():
                for mb, cb in b.items():
                    m = tuple(sorted(ma + mb))
                    out[m] = out.get(m, 0) + ca * cb
        else:
            s = 1 if e.op == "add" else -1
            out = dict(a)
            for m, c in b.items():
                out[m] = out.get(m, 0) + s * c
        return {m: c for m, c in out.items() if c}
    if e.op in ("floordiv", "div") and e.dtype == dt.INDEX:
        # (an exact quotient, or None: where it is exact, truncating division is floor division)
        a, b = _poly(e.args[0], memo), _poly(e.args[1], memo)
        if a is None or b is None or len(b) != 1:
            return None
        (mb, cb), = b.items()
        out = {}
        for m, c in a.items():
            rest = list(m)
            for s in mb:
                if s not in rest:
                    return None
                rest.remove(s)
            if c % cb:
                return None
            out[tuple(rest)] = c // cb
        return out
    return None


def _from_poly(p: dict) -> Expr:
    terms = sorted(p.items(), key=lambda mc: (-len(mc[0]), mc[0]))
    out = const(0)
    for m, c in terms:
        t = const(abs(c)) if not m or abs(c) != 1 else None
        for s in m:
            t = sym(s) if t is None else mul(t, sym(s))
        out = add(out, t) if c > 0 else sub(out, t)
    return out


def simplify_size(e) -> Expr:
    """Canonical form of a size expression over symbols (polynomials; exact division)."""
    return _simplify_size(as_expr(e), {})


def _simplify_size(e: Expr, memo: dict) -> Expr:
    # (one memo for the whole walk: a subtree's polynomial is found once, not once per level
    # above it, which made a deep max/min of sizes quadratic)
    if e.is_const:
        return e
    p = _poly(e, memo)
    if p is None:
        args = tuple(_simplify_size(a, memo) if a.dtype == dt.INDEX else a for a in e.args)
        return rebuild(e, args) if args else e
    return _from_poly(p)


def value_at_one(e) -> int:
    """A size expression's value with every symbol 1: how the schedule sizes a dynamic batch
    (the batch of one a model mostly runs at) and prices any other symbol."""
    e = as_expr(e)
    return index_value(e, {s: 1 for s in free_syms(e)})


def monomial(e) -> tuple[tuple[str, ...], int] | None:
    """A size expression as (symbols, c) when it is the constant c > 0 times the product of
    those symbols (each as often as it occurs: ``$s * $s``), else None."""
    p = _poly(as_expr(e))
    if p is None or len(p) != 1:
        return None
    (syms, c), = p.items()
    return (syms, c) if c > 0 else None


def same_size(a, b) -> bool:
    """Whether two size expressions are provably equal."""
    a, b = as_expr(a), as_expr(b)
    if a == b:
        return True
    pa, pb = _poly(a), _poly(b)
    return pa is not None and pa == pb
