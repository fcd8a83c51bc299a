"""What expr.py knows of sizes: a symbol is never negative, so comparisons that only that fact
decides fold to constants when they are built, and a select over them collapses (torch's
``expand(B, -1, -1)`` guard gives back a plain ``$batch``)."""

from __future__ import annotations

import pytest

from mlpack.spec.ir import expr as ex

B, S = ex.sym("batch"), ex.sym("seq")


@pytest.mark.parametrize("op, a, b, folded", [
    ("eq", B, -1, False), ("ne", B, -1, True), ("eq", B - B, 0, True), ("ge", 2, 4, False), ("lt", B, 0, False), ("ge", B, 0, True),
    ("gt", B + 1, 0, True), ("le", B + 1, 0, False), ("gt", B + 1, B, True),
    ("lt", S * B, -3, False), ("ge", ex.floordiv(S, 2), 0, True), ("lt", ex.mod(S, 4), 4, True),
    ("eq", ex.maximum(B, 1), 0, False), ("le", ex.minimum(B, -1), 0, True),
    ("ne", ex.select(ex.binary("lt", ex.var("i"), 3), B + 2, 5), 1, True),
])
def test_comparisons_the_sign_decides_fold(op, a, b, folded):
    assert ex.binary(op, a, b) == ex.const(folded)


@pytest.mark.parametrize("op, a, b", [
    ("eq", B, 0), ("eq", B, 2), ("lt", B, S), ("gt", B - 1, 0), ("eq", ex.var("i"), -1),
    ("lt", ex.read("t", {"k": 0}, "i64"), 0), ("eq", B - S, 0), ("le", ex.minimum(B, 5), 2),
])
def test_comparisons_it_cannot_decide_stay(op, a, b):
    e = ex.binary(op, a, b)
    assert e.op == op and e.dtype == "bool"


def test_the_torch_expand_guard_is_the_symbol():
    guarded = ex.select(ex.binary("eq", B, -1), 1, B)
    assert guarded == B
    assert ex.substitute(ex.select(ex.binary("eq", ex.var("n"), -1), 1, ex.var("n")),
                         {"n": B}) == B


def test_bounds():
    assert ex.bounds(B) == (0, None)
    assert ex.bounds(2 * B + 3) == (3, None)
    assert ex.bounds(ex.const(3) - B) == (None, 3)
    assert ex.bounds(ex.mod(ex.var("i"), 8)) == (0, 7)
    assert ex.bounds(ex.var("i")) == (None, None)
