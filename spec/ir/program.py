"""The portable program: an IR graph as compact, versioned JSON (media type
``application/vnd.mlpack.program.portable.v1+json``).

Every container carries one, so every container runs somewhere: the runtime executes it with
the reference interpreter (interp.py), the C engine with its own. Constant data is not in the
program: each constant names a tensor of the artifact's weights archive (tensorfile.py).

    {"program": "mlpack.portable", "version": [1, 0], "name": "mlp",
     "inputs":  [{"name": "x", "dtype": "f32", "dims": [["n", "$batch"], ["k", 784]]}],
     "constants": [{"name": "w", "dtype": "f32", "dims": [["k", 784], ["m", 10]]}],
     "ops": [{"out": "y", "dtype": "f32", "dims": [["n", "$batch"], ["m", 10]],
              "reduce": "sum", "rdims": [["k", 784]], "body": EXPR}],
     "outputs": [{"name": "y", "layout": ["n", "m"]}]}

dims are listed in layout order (inputs, constants, outputs) or declaration order (ops).
EXPR is prefix JSON: a plain integer is an i64 constant; ``"$s"`` a symbol; ``["c", v, dtype]``
a constant (v may be "inf", "-inf", "nan"); ``["v", name]`` / ``["v", name, dtype]`` a variable;
``["r", tensor, [dims], [index EXPRs], pad]`` a read; ``["cast", dtype, x]``; otherwise
``[op, operand...]`` with the result dtype given by the op's rule (``expr.result_dtype``).
Procedures are ``{"proc": {"results": [...], "locals": [...], "bounds": [[sym, EXPR]], "body": [STMT]}}``
with STMT one of ``["let", name, EXPR]``, ``["store", tensor, [[dim, EXPR]...], EXPR]``,
``["for", var, EXPR, [STMT]]``, ``["while", EXPR, [STMT]]``, ``["if", EXPR, [STMT], [STMT]]``,
``["size", sym, EXPR]``.
An optional ``"origins"``, ``[[tensor, dim, node, wraps], ...]``, names the ONNX node that
indexes a tensor's dim with data, for the message an index out of range gives (origins.py).

A reader refuses a newer major version and reads every older minor; unknown keys are ignored.
"""

from __future__ import annotations

import json
import math
import sys

from mlpack.spec import jsondepth
from mlpack.spec.errors import FormatError
from mlpack.spec.ir import dtypes as dt
from mlpack.spec.ir import origins as org
from mlpack.spec.ir.expr import Expr, _normalize, result_dtype
from mlpack.spec.ir.graph import (Comprehension, Constant, For, Graph, If, Let, Port, Procedure,
                                  SetSize, Store, TensorType, While)

FORMAT = "mlpack.portable"
VERSION = (1, 0)


# ---------------------------------------------------------------- encoding


def _num(v):
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


def encode_expr(e: Expr):
    op = e.op
    if op == "const":
        if e.dtype == dt.INDEX:
            return e.arg
        return ["c", _num(e.arg), e.dtype]
    if op == "sym":
        return "$" + e.arg
    if op == "var":
        return ["v", e.arg] if e.dtype == dt.INDEX else ["v", e.arg, e.dtype]
    if op == "read":
        tensor, dims, pad = e.arg
        return ["r", tensor, list(dims), [encode_expr(a) for a in e.args], _num(pad)]
    if op == "cast":
        return ["cast", e.dtype, encode_expr(e.args[0])]
    return [op, *[encode_expr(a) for a in e.args]]


def _dims(dims: dict) -> list:
    return [[d, encode_expr(s)] for d, s in dims.items()]


def _encode_stmts(stmts) -> list:
    out = []
    for s in stmts:
        if isinstance(s, Let):
            out.append(["let", s.name, encode_expr(s.value)])
        elif isinstance(s, Store):
            out.append(["store", s.tensor, [[d, encode_expr(i)] for d, i in s.index.items()],
                        encode_expr(s.value)])
        elif isinstance(s, For):
            out.append(["for", s.var, encode_expr(s.extent), _encode_stmts(s.body)])
        elif isinstance(s, While):
            out.append(["while", encode_expr(s.cond), _encode_stmts(s.body)])
        elif isinstance(s, If):
            out.append(["if", encode_expr(s.cond), _encode_stmts(s.then), _encode_stmts(s.orelse)])
        elif isinstance(s, SetSize):
            out.append(["size", s.sym, encode_expr(s.value)])
    return out


def encode_program(g: Graph) -> dict:
    """The JSON-able portable program of ``g`` (constant data goes to the weights archive)."""
    ops = []
    for op in g.ops:
        if isinstance(op, Comprehension):
            ops.append({"out": op.out, "dtype": op.type.dtype, "dims": _dims(op.type.dims),
                        "reduce": op.reduce, "rdims": _dims(op.rdims), "body": encode_expr(op.body)})
        else:
            ops.append({"proc": {
                "results": [{"name": n, "dtype": t.dtype, "dims": _dims(t.dims)} for n, t in op.results.items()],
                "locals": [{"name": n, "dtype": t.dtype, "dims": _dims(t.dims)} for n, t in op.locals_.items()],
                "bounds": [[s, encode_expr(b)] for s, b in op.bounds.items()],
                "body": _encode_stmts(op.body)}})
    out = {
        "program": FORMAT, "version": list(VERSION), "name": g.name,
        "inputs": [{"name": p.name, "dtype": g.types[p.name].dtype,
                    "dims": [[d, encode_expr(g.types[p.name].dims[d])] for d in p.layout]} for p in g.inputs],
        "constants": [{"name": c.name, "dtype": c.type.dtype,
                       "dims": [[d, encode_expr(c.type.dims[d])] for d in c.layout]} for c in g.constants.values()],
        "ops": ops,
        "outputs": [{"name": p.name, "layout": list(p.layout)} for p in g.outputs],
    }
    if g.origins:   # (an optional key: older readers skip it)
        out["origins"] = org.encode(g.origins)
    return out


def dumps_program(g: Graph) -> bytes:
    return json.dumps(encode_program(g), sort_keys=True, separators=(",", ":")).encode()


# ---------------------------------------------------------------- decoding


class _Decoder:
    def __init__(self):
        self.types: dict[str, TensorType] = {}

    def fail(self, msg: str) -> FormatError:
        return FormatError(f"portable program: {msg}")

    def value(self, v, dtype: str):
        if isinstance(v, str) and v in ("inf", "-inf", "nan"):
            v = float(v)
        if not isinstance(v, (int, float, bool)) or dtype not in dt.DTYPES:
            raise self.fail(f"bad constant {v!r} of dtype {dtype!r}")
        return _normalize(v, dtype)

    def expr(self, j) -> Expr:
        if isinstance(j, bool):
            raise self.fail(f"bad expression {j!r}")
        if isinstance(j, int):
            return Expr("const", (), j, dt.INDEX)
        if isinstance(j, str):
            if not j.startswith("$"):
                raise self.fail(f"bad expression {j!r}")
            return Expr("sym", (), j[1:], dt.INDEX)
        if not isinstance(j, list) or not j or not isinstance(j[0], str):
            raise self.fail(f"bad expression {str(j)[:80]}")
        op, rest = j[0], j[1:]
        try:
            if op == "c":
                return Expr("const", (), self.value(rest[0], rest[1]), rest[1])
            if op == "v":
                dtype = rest[1] if len(rest) > 1 else dt.INDEX
                if dtype not in dt.DTYPES:
                    raise self.fail(f"bad dtype {dtype!r}")
                return Expr("var", (), str(rest[0]), dtype)
            if op == "r":
                tensor, dims, index, pad = rest
                if tensor not in self.types:
                    raise self.fail(f"read of undeclared tensor {tensor!r}")
                dtype = self.types[tensor].dtype
                args = tuple(self.expr(a) for a in index)
                if len(args) != len(dims):
                    raise self.fail(f"read of {tensor!r}: {len(dims)} dims, {len(args)} indices")
                pad = None if pad is None else self.value(pad, dtype)
                return Expr("read", args, (tensor, tuple(str(d) for d in dims), pad), dtype)
            if op == "cast":
                if rest[0] not in dt.DTYPES:
                    raise self.fail(f"cast to unknown dtype {rest[0]!r}")
                return Expr("cast", (self.expr(rest[1]),), None, rest[0])
        except (IndexError, TypeError, ValueError):
            raise self.fail(f"malformed {op!r} expression") from None
        args = tuple(self.expr(a) for a in rest)
        try:
            return Expr(op, args, None, result_dtype(op, [a.dtype for a in args]))
        except ValueError as e:
            raise self.fail(str(e)) from None

    def dims(self, j) -> dict:
        if not isinstance(j, list):
            raise self.fail("dims must be a list")
        try:
            return {str(d): self.expr(s) for d, s in j}
        except (TypeError, ValueError):
            raise self.fail(f"malformed dims {str(j)[:80]}") from None

    def ttype(self, j) -> TensorType:
        if j.get("dtype") not in dt.DTYPES:
            raise self.fail(f"unknown dtype {j.get('dtype')!r}")
        return TensorType(j["dtype"], self.dims(j["dims"]))

    def stmts(self, j) -> list:
        out = []
        for s in j:
            kind = s[0]
            if kind == "let":
                out.append(Let(s[1], self.expr(s[2])))
            elif kind == "store":
                out.append(Store(s[1], {d: self.expr(i) for d, i in s[2]}, self.expr(s[3])))
            elif kind == "for":
                out.append(For(s[1], self.expr(s[2]), self.stmts(s[3])))
            elif kind == "while":
                out.append(While(self.expr(s[1]), self.stmts(s[2])))
            elif kind == "if":
                out.append(If(self.expr(s[1]), self.stmts(s[2]), self.stmts(s[3])))
            elif kind == "size":
                out.append(SetSize(s[1], self.expr(s[2])))
            else:
                raise self.fail(f"unknown statement {kind!r}")
        return out

    def program(self, j: dict, weights: dict) -> Graph:
        g = Graph(str(j.get("name", "model")))
        for i in j["inputs"]:
            ty = self.ttype(i)
            g.add_input(i["name"], ty, [d for d, _ in i["dims"]])
            self.types[i["name"]] = ty
        for c in j["constants"]:
            ty = self.ttype(c)
            layout = tuple(d for d, _ in c["dims"])
            if c["name"] not in weights:
                raise self.fail(f"constant {c['name']!r} is missing from the weights")
            data = weights[c["name"]]
            if ty.static_shape(layout) != tuple(data.shape) or data.dtype != dt.to_numpy(ty.dtype):
                raise self.fail(f"constant {c['name']!r}: weights hold {data.dtype}{list(data.shape)}")
            g.add_constant(Constant(c["name"], ty, layout, data))
            self.types[c["name"]] = ty
        for o in j["ops"]:
            if "proc" in o:
                p = o["proc"]
                results = {r["name"]: self.ttype(r) for r in p["results"]}
                locals_ = {r["name"]: self.ttype(r) for r in p.get("locals", [])}
                self.types.update(results)
                self.types.update(locals_)
                bounds = {s: self.expr(b) for s, b in p.get("bounds", [])}
                g.add_op(Procedure(results, self.stmts(p["body"]), locals_, bounds))
            else:
                ty = TensorType(o["dtype"], self.dims(o["dims"]))
                self.types[o["out"]] = ty
                g.add_op(Comprehension(o["out"], ty, self.expr(o["body"]), o.get("reduce"),
                                       self.dims(o.get("rdims", []))))
        for p in j["outputs"]:
            g.outputs.append(Port(p["name"], tuple(p["layout"])))
        g.origins = org.decode(j.get("origins"))
        return g


# A program nests at most jsondepth.MAX_DEPTH levels (512, as the C reader allows), so its
# expressions almost as deep; decoding, verifying (verify.py) and interpreting (interp.py) one
# recurse up to 4 frames a level, past Python's default limit of 1,000 frames. The limit is raised
# to fit once a program is read, and never lowered (another thread may be deep in a run).
_RECURSION_LIMIT = 1000 + 4 * jsondepth.MAX_DEPTH


def _room_to_recurse() -> None:
    if sys.getrecursionlimit() < _RECURSION_LIMIT:
        sys.setrecursionlimit(_RECURSION_LIMIT)


def decode_program(raw: bytes, weights: dict) -> Graph:
    """The graph of a portable program (``weights``: name -> array, e.g. from the weights blob).

    Raises FormatError for a newer major version or a malformed program; the caller verifies it
    (verify.verify) before running it.
    """
    deep = jsondepth.too_deep(raw)   # json.loads would recurse into a RecursionError
    if deep is not None:
        raise FormatError(f"portable program is not valid JSON: nested too deeply at byte {deep}")
    try:
        j = json.loads(raw)
    except ValueError as e:
        raise FormatError(f"portable program is not valid JSON: {e}") from None
    if not isinstance(j, dict) or j.get("program") != FORMAT:
        raise FormatError("not a portable program (missing 'program': 'mlpack.portable')")
    version = j.get("version")
    if not (isinstance(version, list) and len(version) >= 1 and isinstance(version[0], int)):
        raise FormatError("portable program has no version")
    if version[0] > VERSION[0]:
        raise FormatError(f"portable program version {version[0]}.{version[1] if len(version) > 1 else 0} "
                          f"is newer than this runtime reads ({VERSION[0]}.x); upgrade mlpack")
    _room_to_recurse()
    try:
        return _Decoder().program(j, weights)
    except FormatError:
        raise
    except RecursionError:   # only where the caller was deep already: still no crash
        raise FormatError("portable program nests too deeply for this Python runtime") from None
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        raise FormatError(f"portable program is malformed ({type(e).__name__}: {e})") from None
