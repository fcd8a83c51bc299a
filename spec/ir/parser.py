"""The text form of the IR: parsing what ``printer.py`` writes, back into an equal graph.

The parser builds expression nodes as written (no folding), so print -> parse is exact.
Errors name the line and column and what was expected.
"""

from __future__ import annotations

import base64
import json
import re

import numpy as np

from mlpack.spec.ir import dtypes as dt
from mlpack.spec.ir.expr import BINARY, UNARY, Expr, result_dtype
from mlpack.spec.ir.graph import (REDUCTIONS, Comprehension, Constant, For, Graph, If, Let, Port,
                                  Procedure, SetSize, Store, TensorType, While)
from mlpack.spec.errors import IRParseError

_TOKEN = re.compile(r"""
    (?P<ws>\s+|\#[^\n]*)
  | (?P<tensor>%(?:"(?:[^"\\]|\\.)*"|[A-Za-z0-9_.]+))
  | (?P<sym>\$[A-Za-z_][A-Za-z0-9_]*)
  | (?P<string>"(?:[^"\\]|\\.)*")
  | (?P<number>\d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+|\d+)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<punct>//|[{}\[\]()<>=,;:+\-*%])
""", re.VERBOSE)


class _Tokens:
    def __init__(self, text: str):
        self.text = text
        self.toks: list[tuple[str, str, int]] = []
        pos = 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if not m:
                raise self._error(pos, f"unexpected character {text[pos]!r}")
            kind = m.lastgroup
            if kind != "ws":
                self.toks.append((kind, m.group(), pos))
            pos = m.end()
        self.toks.append(("eof", "", len(text)))
        self.i = 0

    def _error(self, pos: int, msg: str) -> IRParseError:
        line = self.text.count("\n", 0, pos) + 1
        col = pos - (self.text.rfind("\n", 0, pos) + 1) + 1
        return IRParseError(f"IR text, line {line}, column {col}: {msg}")

    def peek(self, k: int = 0):
        return self.toks[min(self.i + k, len(self.toks) - 1)]

    def next(self):
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def error(self, msg: str) -> IRParseError:
        kind, text, pos = self.peek()
        return self._error(pos, f"{msg}, found {text or 'end of text'!r}")

    def accept(self, text: str) -> bool:
        if self.peek()[1] == text and self.peek()[0] in ("punct", "name"):
            self.i += 1
            return True
        return False

    def expect(self, text: str):
        if not self.accept(text):
            raise self.error(f"expected {text!r}")

    def expect_kind(self, kind: str) -> str:
        k, text, _ = self.peek()
        if k != kind:
            raise self.error(f"expected a {kind}")
        self.i += 1
        return text


def _unquote(sigiled: str) -> str:
    body = sigiled[1:]
    return json.loads(body) if body.startswith('"') else body


class _Parser:
    def __init__(self, text: str):
        self.t = _Tokens(text)
        self.types: dict[str, TensorType] = {}

    # -------------------------------------------------------------- pieces
    def dtype(self) -> str:
        name = self.t.expect_kind("name")
        if name not in dt.DTYPES:
            self.t.i -= 1
            raise self.t.error(f"unknown dtype {name!r}")
        return name

    def tensor_name(self) -> str:
        return _unquote(self.t.expect_kind("tensor"))

    def literal(self):
        """A scalar literal: (python value, dtype or None when unsuffixed, kind)."""
        neg = self.t.accept("-")
        kind, text, _ = self.t.peek()
        if kind == "number":
            self.t.next()
            is_float = any(c in text for c in ".eE")
            value = float(text) if is_float else int(text)
            default = "f32" if is_float else "i64"
        elif kind == "name" and text in ("inf", "nan"):
            self.t.next()
            value, default = float(text), "f32"
        elif kind == "name" and text in ("true", "false") and not neg:
            self.t.next()
            value, default = text == "true", "bool"
        else:
            raise self.t.error("expected a number")
        if neg:
            value = -value
        dtype = None
        if self.t.peek()[1] == ":" and self.t.peek(1)[1] in dt.DTYPES:
            self.t.next()
            dtype = self.dtype()
        return value, dtype, default

    def const(self, forced: str | None = None) -> Expr:
        from mlpack.spec.ir.expr import _normalize
        value, dtype, default = self.literal()
        dtype = dtype or forced or default
        return Expr("const", (), _normalize(value, dtype), dtype)

    def dims(self) -> dict[str, Expr]:
        self.t.expect("{")
        out: dict[str, Expr] = {}
        while not self.t.accept("}"):
            name = self.t.expect_kind("name")
            self.t.expect("=")
            out[name] = self.expr()
            if not self.t.accept(","):
                self.t.expect("}")
                break
        return out

    def type_(self) -> TensorType:
        dtype = self.dtype()
        return TensorType(dtype, self.dims())

    def layout(self) -> tuple[str, ...]:
        self.t.expect("(")
        names = []
        while not self.t.accept(")"):
            names.append(self.t.expect_kind("name"))
            if not self.t.accept(","):
                self.t.expect(")")
                break
        return tuple(names)

    # -------------------------------------------------------------- expressions
    def expr(self) -> Expr:
        left = self.term()
        while self.t.peek()[1] in ("+", "-") and self.t.peek()[0] == "punct":
            op = "add" if self.t.next()[1] == "+" else "sub"
            right = self.term()
            left = Expr(op, (left, right), None, dt.promote(left.dtype, right.dtype))
        return left

    def term(self) -> Expr:
        left = self.primary()
        ops = {"*": "mul", "//": "floordiv", "%": "mod"}
        while self.t.peek()[1] in ops and self.t.peek()[0] == "punct":
            op = ops[self.t.next()[1]]
            right = self.primary()
            left = Expr(op, (left, right), None, dt.promote(left.dtype, right.dtype))
        return left

    def args(self) -> list[Expr]:
        self.t.expect("(")
        out = []
        while not self.t.accept(")"):
            out.append(self.expr())
            if not self.t.accept(","):
                self.t.expect(")")
                break
        return out

    def primary(self) -> Expr:
        kind, text, _ = self.t.peek()
        if text == "(" and kind == "punct":
            self.t.next()
            e = self.expr()
            self.t.expect(")")
            return e
        if kind == "number" or text == "-" or (kind == "name" and text in ("inf", "nan", "true", "false")):
            return self.const()
        if kind == "sym":
            self.t.next()
            return Expr("sym", (), text[1:], dt.INDEX)
        if kind == "tensor":
            return self.read()
        if kind == "name":
            at = self.t.i  # errors about a call point at its name
            self.t.next()
            if text == "cast" and self.t.peek()[1] == "<":
                self.t.expect("<")
                to = self.dtype()
                self.t.expect(">")
                (x,) = self._arity(self.args(), 1, text, at)
                return Expr("cast", (x,), None, to)
            if self.t.peek()[1] == "(":
                return self.call(text, self.args(), at)
            if self.t.peek()[1] == ":" and self.t.peek(1)[1] in dt.DTYPES:
                self.t.next()
                return Expr("var", (), text, self.dtype())
            return Expr("var", (), text, dt.INDEX)
        raise self.t.error("expected an expression")

    def _arity(self, args, n, op, at: int):
        if len(args) != n:
            self.t.i = at
            raise self.t.error(f"{op} takes {n} operand(s), got {len(args)}")
        return args

    def call(self, op: str, args: list[Expr], at: int) -> Expr:
        arity = 1 if op in UNARY else 2 if op in BINARY else 3 if op == "select" else None
        if arity is None:
            self.t.i = at
            raise self.t.error(f"unknown operation {op!r}")
        args = self._arity(args, arity, op, at)
        return Expr(op, tuple(args), None, result_dtype(op, [a.dtype for a in args]))

    def read(self) -> Expr:
        name = self.tensor_name()
        if name not in self.types:
            self.t.i -= 1
            raise self.t.error(f"read of undeclared tensor %{name}")
        dtype = self.types[name].dtype
        self.t.expect("[")
        dims, args, pad = [], [], None
        while self.t.peek()[1] not in ("]", ";"):
            dims.append(self.t.expect_kind("name"))
            self.t.expect("=")
            args.append(self.expr())
            if not self.t.accept(","):
                break
        if self.t.accept(";"):
            if self.t.expect_kind("name") != "pad":
                raise self.t.error("expected 'pad'")
            self.t.expect("=")
            pad = self.const(dtype).arg
        self.t.expect("]")
        return Expr("read", tuple(args), (name, tuple(dims), pad), dtype)

    # -------------------------------------------------------------- statements
    def stmts(self) -> list:
        self.t.expect("{")
        out = []
        while not self.t.accept("}"):
            out.append(self.stmt())
        return out

    def stmt(self):
        kind, text, _ = self.t.peek()
        if kind == "tensor":
            name = self.tensor_name()
            self.t.expect("[")
            index = {}
            while not self.t.accept("]"):
                d = self.t.expect_kind("name")
                self.t.expect("=")
                index[d] = self.expr()
                if not self.t.accept(","):
                    self.t.expect("]")
                    break
            self.t.expect("=")
            return Store(name, index, self.expr())
        self.t.next()
        if text == "let":
            name = self.t.expect_kind("name")
            self.t.expect(":")
            self.dtype()
            self.t.expect("=")
            return Let(name, self.expr())
        if text == "size":
            s = self.t.expect_kind("sym")[1:]
            self.t.expect("=")
            return SetSize(s, self.expr())
        if text == "for":
            v = self.t.expect_kind("name")
            self.t.expect("in")
            extent = self.expr()
            return For(v, extent, self.stmts())
        if text == "while":
            cond = self.expr()
            return While(cond, self.stmts())
        if text == "if":
            cond = self.expr()
            then = self.stmts()
            orelse = self.stmts() if self.t.accept("else") else []
            return If(cond, then, orelse)
        self.t.i -= 1
        raise self.t.error("expected a statement")

    # -------------------------------------------------------------- graph
    def constant(self, g: Graph):
        name = self.tensor_name()
        self.t.expect(":")
        ty = self.type_()
        layout = self.layout()
        self.t.expect("=")
        np_dtype = dt.to_numpy(ty.dtype)
        shape = ty.static_shape(layout)
        if shape is None:
            raise self.t.error(f"constant %{name} must have static sizes")
        if self.t.accept("dense"):
            raw = base64.b64decode(json.loads(self.t.expect_kind("string")))
            data = np.frombuffer(raw, dtype=np_dtype.newbyteorder("<")).astype(np_dtype).reshape(shape)
        else:
            self.t.expect("[")
            vals = []
            while not self.t.accept("]"):
                vals.append(self.const(ty.dtype).arg)
                if not self.t.accept(","):
                    self.t.expect("]")
                    break
            data = np.array(vals, dtype=np_dtype).reshape(shape)
        g.add_constant(Constant(name, ty, layout, data))
        self.types[name] = ty

    def op(self, g: Graph):
        results: dict[str, TensorType] = {}
        while True:
            name = self.tensor_name()
            self.t.expect(":")
            results[name] = self.type_()
            if not self.t.accept(","):
                break
        self.t.expect("=")
        if self.t.accept("proc"):
            bounds, locals_ = {}, {}
            if self.t.accept("bounds"):
                self.t.expect("{")
                while not self.t.accept("}"):
                    s = self.t.expect_kind("sym")[1:]
                    self.t.expect("=")
                    bounds[s] = self.expr()
                    if not self.t.accept(","):
                        self.t.expect("}")
                        break
            if self.t.accept("locals"):
                self.t.expect("{")
                while not self.t.accept("}"):
                    n = self.tensor_name()
                    self.t.expect(":")
                    locals_[n] = self.type_()
                    if not self.t.accept(","):
                        self.t.expect("}")
                        break
            self.types.update(results)
            self.types.update(locals_)
            g.add_op(Procedure(results, self.stmts(), locals_, bounds))
            return
        if len(results) != 1:
            raise self.t.error("a comprehension has one result")
        (name, ty), = results.items()
        reduce, rdims = None, {}
        if self.t.peek()[1] in REDUCTIONS and self.t.peek(1)[1] == "{":
            reduce = self.t.next()[1]
            rdims = self.dims()
        body = self.expr()
        self.types[name] = ty
        g.add_op(Comprehension(name, ty, body, reduce, rdims))

    def graph(self) -> Graph:
        self.t.expect("graph")
        g = Graph(json.loads(self.t.expect_kind("string")))
        self.t.expect("{")
        while not self.t.accept("}"):
            kind, text, _ = self.t.peek()
            if text == "in" and kind == "name":
                self.t.next()
                name = self.tensor_name()
                self.t.expect(":")
                ty = self.type_()
                g.add_input(name, ty, self.layout())
                self.types[name] = ty
            elif text == "const" and kind == "name":
                self.t.next()
                self.constant(g)
            elif text == "out" and kind == "name":
                self.t.next()
                name = self.tensor_name()
                g.outputs.append(Port(name, self.layout()))
            elif kind == "tensor":
                self.op(g)
            else:
                raise self.t.error("expected 'in', 'const', 'out' or an op")
        if self.t.peek()[0] != "eof":
            raise self.t.error("expected end of text")
        return g


def parse_graph(text: str) -> Graph:
    """Parse the text form of a graph."""
    return _Parser(text).graph()


def parse_expr(text: str, types: dict[str, TensorType] | None = None) -> Expr:
    """Parse one expression (tests and pass lit files use this)."""
    p = _Parser(text)
    p.types.update(types or {})
    e = p.expr()
    if p.t.peek()[0] != "eof":
        raise p.t.error("expected end of expression")
    return e
