"""Signature dim sizes (a config's ``model.inputs``/``outputs`` dims): read, write, evaluate.

A size is a count (a JSON integer >= 0), a ``"$symbol"`` bound at run time by the input axes it
sizes, or (format 1.1) a *size expression* over symbols, as text (spec/SPEC.md, "Sizes"):

    size := term (("+" | "-") term)*
    term := atom (("*" | "//" | "%") atom)*
    atom := INT | "$" NAME | "(" size ")" | ("max" | "min") "(" size "," size ")"
    INT  := "-"? [0-9]+          NAME := [A-Za-z_][A-Za-z0-9_]*      (spaces between tokens)

``//`` and ``%`` round toward minus infinity (Python's, the IR's); arithmetic is int64, and an
overflow, a division by zero or a negative value is an error when the size is evaluated. Only
output dims may be expressions: an input dim is a count or a symbol, so binding the symbols
stays one pass over the input axes and an output's size is the expression's value once they are
bound. The C engine implements the same grammar (runtime/c/src/size.c).

A parsed size is an int (a count), a str (a symbol's name, without ``$``) or a tuple
``(op, a, b)`` with op in ``add sub mul floordiv mod max min``.
"""

from __future__ import annotations

import re

from mlpack.spec.ir import expr as ex

OPS = {"+": "add", "-": "sub", "*": "mul", "//": "floordiv", "%": "mod"}
FUNCS = ("max", "min")
_TEXT = {v: k for k, v in OPS.items()}
_PREC = {"add": 1, "sub": 1, "mul": 2, "floordiv": 2, "mod": 2}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TOKEN = re.compile(r"\s*(?:(-?[0-9]+)|\$([A-Za-z_][A-Za-z0-9_]*)|(//|[-+*%(),])|([A-Za-z_]+))")
_INT64 = (-(1 << 63), (1 << 63) - 1)


# ---------------------------------------------------------------- reading


def parse_size(value):
    """A config dim size, parsed; ValueError (with the reason) when it is none of the three."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ValueError("a count must be >= 0")
        return value
    if not isinstance(value, str):
        raise ValueError(f"a size is an integer or a string, not {type(value).__name__}")
    tokens = _tokens(value)
    tree, rest = _sum(tokens)
    if rest:
        raise ValueError(f"unexpected {rest[0][1]!r}")
    if not symbols(tree):
        raise ValueError("a constant size is written as a JSON integer")
    if isinstance(tree, str) and value != "$" + tree:
        raise ValueError("a symbol size is written exactly '$name'")
    return tree


def _tokens(text: str) -> list[tuple[str, object]]:
    out, pos = [], 0
    while pos < len(text) and not text[pos:].isspace():
        m = _TOKEN.match(text, pos)
        if not m:
            raise ValueError(f"unexpected {text[pos:].strip()[:20]!r}")
        if m.group(1) is not None:
            # "$a-1": the "-" is an operator after an operand, never a sign
            if m.group(1).startswith("-") and out and out[-1][0] in ("int", "sym", ")"):
                out += [("op", "-"), ("int", int(m.group(1)[1:]))]
            else:
                out.append(("int", int(m.group(1))))
        elif m.group(2) is not None:
            out.append(("sym", m.group(2)))
        elif m.group(3) is not None:
            out.append((m.group(3) if m.group(3) in "()," else "op", m.group(3)))
        else:
            if m.group(4) not in FUNCS:
                raise ValueError(f"unknown name {m.group(4)!r} (symbols are written $name)")
            out.append(("func", m.group(4)))
        pos = m.end()
    if not out:
        raise ValueError("empty")
    return out


def _sum(ts):
    a, ts = _term(ts)
    while ts and ts[0] == ("op", "+") or ts and ts[0] == ("op", "-"):
        op = OPS[ts[0][1]]
        b, ts = _term(ts[1:])
        a = (op, a, b)
    return a, ts


def _term(ts):
    a, ts = _atom(ts)
    while ts and ts[0][0] == "op" and ts[0][1] in ("*", "//", "%"):
        op = OPS[ts[0][1]]
        b, ts = _atom(ts[1:])
        a = (op, a, b)
    return a, ts


def _expect(ts, kind: str):
    if not ts or ts[0][0] != kind:
        raise ValueError(f"expected {kind!r}, found {ts[0][1] if ts else 'the end'!r}")
    return ts[1:]


def _atom(ts):
    if not ts:
        raise ValueError("ends too early")
    kind, v = ts[0]
    if kind == "int":
        if not _INT64[0] <= v <= _INT64[1]:
            raise ValueError(f"{v} does not fit in int64")
        return v, ts[1:]
    if kind == "sym":
        return v, ts[1:]
    if kind == "(":
        a, ts = _sum(ts[1:])
        return a, _expect(ts, ")")
    if kind == "func":
        a, ts = _sum(_expect(ts[1:], "("))
        b, ts = _sum(_expect(ts, ","))
        return (v, a, b), _expect(ts, ")")
    raise ValueError(f"unexpected {v!r}")


# ---------------------------------------------------------------- queries and evaluation


def is_expression(size) -> bool:
    """Whether a parsed size is an expression (neither a count nor a plain symbol)."""
    return isinstance(size, tuple)


def symbols(size) -> set[str]:
    """The symbols a parsed size names."""
    if isinstance(size, str):
        return {size}
    if isinstance(size, tuple):
        return symbols(size[1]) | symbols(size[2])
    return set()


def evaluate(size, bound: dict[str, int]) -> int:
    """A parsed size's value with the symbols ``bound``; KeyError names an unbound symbol,
    ValueError a value the format refuses (negative, overflowing, a division by zero)."""
    v = _eval(size, bound)
    if v < 0:
        raise ValueError(f"comes out negative ({v})")
    return v


def _eval(size, bound: dict[str, int]) -> int:
    if isinstance(size, int):
        return size
    if isinstance(size, str):
        return bound[size]
    op, a, b = size[0], _eval(size[1], bound), _eval(size[2], bound)
    if op in ("floordiv", "mod") and b == 0:
        raise ValueError("division by zero")
    v = {"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b,
         "floordiv": lambda: a // b, "mod": lambda: a % b, "max": lambda: max(a, b),
         "min": lambda: min(a, b)}[op]()
    if not _INT64[0] <= v <= _INT64[1]:
        raise ValueError(f"'{_TEXT.get(op, op)}' overflows int64")
    return v


# ---------------------------------------------------------------- writing


def config_size(e: ex.Expr):
    """The config form of an IR size expression: an int, ``"$sym"`` or expression text.
    ValueError when the grammar cannot state it (a comparison, a select, a loop variable...)."""
    if e.is_const or not ex.free_syms(e) and not ex.free_vars(e) and not ex.reads(e):
        return ex.index_value(e, {})  # a closed expression the compiler left unfolded
    return _text(e, 0)


def _text(e: ex.Expr, prec: int) -> str:
    if e.dtype != ex.dt.INDEX:
        raise ValueError(f"{e!r} is not an integer size")
    if e.op == "const":
        return str(e.value)
    if e.op == "sym":
        if not _NAME.fullmatch(e.arg):
            raise ValueError(f"symbol ${e.arg} is not a NAME")
        return "$" + e.arg
    if e.op in _PREC:
        p = _PREC[e.op]
        text = f"{_text(e.args[0], p)} {_TEXT[e.op]} {_text(e.args[1], p + 1)}"
        return f"({text})" if p < prec else text
    if e.op in FUNCS:
        return f"{e.op}({_text(e.args[0], 0)}, {_text(e.args[1], 0)})"
    raise ValueError(f"'{e.op}' has no spelling in a size expression")


__all__ = ["parse_size", "is_expression", "symbols", "evaluate", "config_size"]
