"""The IR text form: print -> parse gives back an equal graph, and bad text is located exactly."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlpack.codegen.errors import IRParseError
from mlpack.spec.ir import (Comprehension, Constant, For, Graph, If, Let, Procedure, SetSize,
                               Store, TensorType, While, format_expr, format_graph, parse_expr,
                               parse_graph, verify)
from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.graph import REDUCTIONS

B = ex.sym("batch")


def round_trip(g: Graph) -> Graph:
    """Print, parse and print again; both texts and both graphs must agree."""
    verify(g)
    text = format_graph(g)
    back = parse_graph(text)
    assert format_graph(back) == text
    assert back == g, text
    verify(back)
    return back


def _input(g: Graph, name: str, dtype: str, dims: dict) -> None:
    g.add_input(name, TensorType(dtype, dims), tuple(dims))


def _const(g: Graph, name: str, data: np.ndarray, names=None) -> Constant:
    names = tuple(names or [f"c{i}" for i in range(data.ndim)])
    from mlpack.spec.ir.dtypes import from_numpy
    ty = TensorType(from_numpy(data.dtype), dict(zip(names, data.shape)))
    return g.add_constant(Constant(name, ty, names, data))


def _comp(g: Graph, out: str, dtype: str, dims: dict, body, reduce=None, rdims=None):
    op = g.add_op(Comprehension(out, TensorType(dtype, dims), body, reduce, rdims or {}))
    return op


def _x(idx=None, pad=None):
    return ex.read("x", idx or {"n": ex.var("n"), "c": ex.var("c")}, "f32", pad)


# ---------------------------------------------------------------- hand-built graphs


def test_reads_with_pad_casts_and_selects():
    g = Graph("conv-ish")
    _input(g, "x", "f32", {"n": B, "c": 8})
    body = ex.binary("mul", _x({"n": ex.var("n"), "c": ex.var("o") * 2 + ex.var("k") - 1}, pad=0.0),
                     ex.cast(ex.var("k"), "f32"))
    _comp(g, "y", "f32", {"n": B, "o": 4}, body, "sum", {"k": 3})
    cond = ex.binary("lt", _x(), ex.const(0.5))
    _comp(g, "s", "f16", {"n": B, "c": 8},
          ex.cast(ex.select(cond, _x(), ex.unary("neg", _x())), "f16"))
    _comp(g, "i", "i32", {"n": B, "c": 8}, ex.cast(ex.unary("floor", _x()), "i32"))
    _comp(g, "b", "bool", {"n": B, "c": 8}, ex.binary("and", ex.unary("isnan", _x()), cond))
    g.outputs += [g_port("y", ("n", "o")), g_port("s", ("c", "n"))]
    back = round_trip(g)
    assert "; pad=0.0]" in format_graph(back)


def g_port(name, layout):
    from mlpack.spec.ir import Port
    return Port(name, tuple(layout))


@pytest.mark.parametrize("kind", REDUCTIONS)
def test_every_reduction(kind):
    g = Graph(f"reduce_{kind}")
    _input(g, "x", "f32", {"n": B, "c": 8})
    arg = kind.startswith("arg")
    _comp(g, "r", "i64" if arg else "f32", {"n": B}, _x({"n": ex.var("n"), "c": ex.var("k")}),
          kind, {"k": 8})
    g.outputs.append(g_port("r", ("n",)))
    round_trip(g)


def test_procedure_with_every_statement():
    g = Graph("nonzero")
    _input(g, "x", "f32", {"n": ex.sym("len")})
    count = ex.var("count")
    xi = ex.read("x", {"n": ex.var("i")}, "f32")
    body = [
        Let("count", ex.const(0)),
        Let("acc", ex.const(0.0, "f64")),
        For("i", ex.sym("len"), [
            If(ex.binary("ne", xi, ex.const(0.0)), [
                Store("idx", {"k": count}, ex.var("i")),
                Let("count", count + 1),
            ], [Let("acc", ex.binary("add", ex.var("acc", "f64"), ex.cast(xi, "f64")))]),
        ]),
        Let("j", ex.const(0)),
        While(ex.binary("lt", ex.var("j"), ex.const(2)), [
            Store('scratch/"tmp"', {"t": ex.var("j")}, ex.cast(ex.var("acc", "f64"), "f32")),
            Let("j", ex.var("j") + 1),
        ]),
        SetSize("nnz", count),
    ]
    proc = Procedure({"idx": TensorType("i64", {"k": ex.sym("nnz")})}, body,
                     locals_={'scratch/"tmp"': TensorType("f32", {"t": 2})},
                     bounds={"nnz": ex.sym("len")})
    g.add_op(proc)
    _comp(g, "twice", "i64", {"k": ex.sym("nnz")}, ex.read("idx", {"k": ex.var("k")}, "i64") * 2)
    g.outputs.append(g_port("twice", ("k",)))
    text = format_graph(round_trip(g))
    assert "bounds{$nnz=$len}" in text and "size $nnz = count" in text


def test_quoted_names_and_symbolic_sizes():
    g = Graph("model/with spaces")
    _input(g, "input/0:x", "f32", {"batch": B, "seq": ex.sym("seq")})
    size = ex.sym("seq") * 2 + 1
    body = ex.read("input/0:x", {"batch": ex.var("batch"), "seq": ex.var("s") // 2}, "f32")
    _comp(g, "layer.1/out", "f32", {"batch": B, "s": size}, body)
    g.outputs.append(g_port("layer.1/out", ("s", "batch")))
    text = format_graph(round_trip(g))
    assert '%"input/0:x"' in text and "%layer.1/out" not in text
    assert "s=$seq * 2 + 1" in text or "s=2 * $seq + 1" in text


@pytest.mark.parametrize("dtype", ["f32", "f16", "f64", "bf16", "bool", "i8", "u8", "i32", "i64", "u64"])
@pytest.mark.parametrize("size", [1, 8, 9, 300])
def test_constants_small_and_large(dtype, size):
    from mlpack.spec.ir.dtypes import to_numpy
    rng = np.random.default_rng(size)
    raw = rng.standard_normal(size) * 50
    data = (raw > 0) if dtype == "bool" else raw.astype(to_numpy(dtype))
    g = Graph("consts")
    _const(g, "w", data.reshape(size, 1) if size % 2 else data, ("a", "b") if size % 2 else ("a",))
    back = round_trip(g)
    assert ("dense\"" in format_graph(back)) == (size > 8)


@pytest.mark.parametrize("dtype", ["f32", "f16", "f64", "bf16"])
def test_inf_and_nan_constants(dtype):
    from mlpack.spec.ir.dtypes import to_numpy
    specials = [math.inf, -math.inf, math.nan, -0.0, 1e-3]
    for n in (len(specials), 40):
        g = Graph("specials")
        data = np.resize(np.array(specials), n).astype(to_numpy(dtype))
        _const(g, "c", data)
        _input(g, "x", dtype, {"n": 4})
        xv = ex.read("x", {"n": ex.var("n")}, dtype)
        body = ex.select(ex.unary("isnan", xv), ex.const(math.nan, dtype),
                         ex.binary("max", xv, ex.const(-math.inf, dtype)))
        _comp(g, "y", dtype, {"n": 4}, body)
        round_trip(g)


def test_scalar_tensors():
    g = Graph("scalar")
    _const(g, "s", np.array(2.5, np.float32))
    _comp(g, "t", "f32", {}, ex.binary("mul", ex.read("s", {}, "f32"), ex.const(2.0)))
    g.outputs.append(g_port("t", ()))
    round_trip(g)


# ---------------------------------------------------------------- random expressions


IDX_VARS = ["i", "j", "k"]
TYPES = {"t": TensorType("f32", {"a": 4, "b": 5}), "u": TensorType("i32", {"a": 4})}


def _index_exprs():
    leaves = st.one_of(st.integers(-1000, 1000).map(ex.const), st.sampled_from(IDX_VARS).map(ex.var),
                       st.sampled_from(["batch", "seq"]).map(ex.sym))

    def grow(children):
        binop = st.sampled_from(["add", "sub", "mul", "floordiv", "mod", "max", "min"])
        return st.one_of(
            st.tuples(binop, children, children).map(lambda t: ex.Expr(t[0], (t[1], t[2]), None, "i64")),
            st.tuples(children, children, children).map(
                lambda t: ex.Expr("select", (ex.Expr("lt", (t[0], t[1]), None, "bool"), t[1], t[2]),
                                  None, "i64")),
            children.map(lambda c: ex.Expr("neg", (c,), None, "i64")),
            children.map(lambda c: ex.Expr("cast", (ex.read("u", {"a": c}, "i32"),), None, "i64")),
        )

    return st.recursive(leaves, grow, max_leaves=8)


def _float_consts():
    floats = st.floats(width=32, allow_nan=True, allow_infinity=True)
    return st.tuples(floats, st.sampled_from(["f32", "f64", "f16"])).map(
        lambda t: ex.const(t[0], t[1]))


def _float_exprs():
    idx = _index_exprs()
    reads = st.tuples(idx, idx, st.one_of(st.none(), st.floats(-5, 5, width=32))).map(
        lambda t: ex.read("t", {"a": t[0], "b": t[1]}, "f32", t[2]))
    leaves = st.one_of(reads, _float_consts().map(lambda c: ex.Expr("cast", (c,), None, "f32")),
                       st.floats(width=32).map(lambda v: ex.const(v, "f32")),
                       idx.map(lambda i: ex.Expr("cast", (i,), None, "f32")))
    unary = st.sampled_from(["exp", "tanh", "neg", "abs", "sqrt", "erf", "sigmoid", "recip"])
    binary = st.sampled_from(["add", "sub", "mul", "div", "pow", "max", "min", "atan2", "fmod"])
    cmp = st.sampled_from(["lt", "le", "eq", "ne", "gt", "ge"])

    def grow(children):
        return st.one_of(
            st.tuples(unary, children).map(lambda t: ex.Expr(t[0], (t[1],), None, "f32")),
            st.tuples(binary, children, children).map(lambda t: ex.Expr(t[0], (t[1], t[2]), None, "f32")),
            st.tuples(cmp, children, children, children).map(
                lambda t: ex.Expr("select", (ex.Expr(t[0], (t[1], t[2]), None, "bool"), t[2], t[3]),
                                  None, "f32")),
        )

    return st.recursive(leaves, grow, max_leaves=12)


def _same(a: ex.Expr, b: ex.Expr) -> bool:
    """Structural equality in which nan equals nan."""
    if a.op != b.op or a.dtype != b.dtype or len(a.args) != len(b.args):
        return False
    if a.op == "const":
        if isinstance(a.arg, float) and math.isnan(a.arg):
            return isinstance(b.arg, float) and math.isnan(b.arg)
        return a.arg == b.arg and type(a.arg) is type(b.arg)
    return a.arg == b.arg and all(_same(x, y) for x, y in zip(a.args, b.args))


@given(_index_exprs())
def test_random_index_expressions_round_trip(e):
    text = format_expr(e)
    back = parse_expr(text, TYPES)
    assert back == e, text
    assert format_expr(back) == text


@given(_float_exprs())
def test_random_float_expressions_round_trip(e):
    text = format_expr(e)
    back = parse_expr(text, TYPES)
    assert _same(back, e), text
    assert format_expr(back) == text


@given(st.floats(allow_nan=False), st.sampled_from(["f16", "f32", "f64", "bf16"]))
def test_float_literals_round_trip_exactly(v, dtype):
    c = ex.const(v, dtype)
    assert parse_expr(format_expr(c)) == c


@given(st.integers(-(2 ** 63), 2 ** 63 - 1))
def test_int_literals_round_trip(v):
    c = ex.const(v)
    assert parse_expr(format_expr(c)) == c


# ---------------------------------------------------------------- errors name line and column


@pytest.mark.parametrize("text, line, col, fragment", [
    ('graph "g" {\n  in %x: f33{n=4} (n)\n}\n', 2, 10, "unknown dtype 'f33'"),
    ('graph "g" {\n  in %x: f32{n=4} (n)\n  %y: f32{n=4} = %z[n=n]\n}\n', 3, 18, "undeclared tensor %z"),
    ('graph "g" {\n  in %x: f32{n=4} (n)\n  %y: f32{n=4} = frob(%x[n=n])\n}\n', 3, 18, "unknown operation"),
    ('graph "g" {\n  in %x: f32{n=4} (n)\n  %y: f32{n=4} = exp(%x[n=n], 1.0)\n}\n', 3, 18,
     "exp takes 1 operand"),
    ('graph "g" {\n  bogus\n}\n', 2, 3, "expected 'in', 'const', 'out' or an op"),
    ('graph "g" {\n  in %x: f32{n=4} (n) @\n}\n', 2, 23, "unexpected character '@'"),
    ('graph "g" {\n  in %x: f32{n=4} (n)\n', 3, 1, "end of text"),
])
def test_parse_errors_name_line_and_column(text, line, col, fragment):
    with pytest.raises(IRParseError) as info:
        parse_graph(text)
    msg = str(info.value)
    assert f"line {line}, column {col}" in msg, msg
    assert fragment in msg, msg
