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


@pytest.mark.parametrize("size, canonical", [
    # a Reshape's inferred dim: 64 * batch elements over the other dims' 64, truncated
    (ex.binary("div", 64 * B, 64), B),
    (ex.binary("div", 6 * B * S - 12 * S, 3 * S), 2 * B - 4),
    (ex.floordiv(49 * B * S, 7 * S), 7 * B),
])
def test_an_exact_quotient_of_sizes_is_a_polynomial(size, canonical):
    assert ex.simplify_size(size) == ex.simplify_size(canonical)


@pytest.mark.parametrize("size", [
    ex.binary("div", B, 2), ex.binary("div", 3 * B + 1, 3), ex.binary("div", B * S, B + 1),
    ex.binary("div", 4 * B, S),
])
def test_an_inexact_quotient_stays_a_division(size):
    simplified = ex.simplify_size(size)
    assert simplified.op == "div"
    for b, s in ((1, 1), (3, 2), (7, 5)):   # and means what it meant
        env = {"batch": b, "seq": s}
        assert ex.index_value(simplified, env) == ex.index_value(size, env)


def test_a_deep_size_keeps_its_value():
    """A max of sums of quotients, hundreds of levels deep (an arena's running total), walked
    with one memo of its subtrees' polynomials."""
    total = ex.const(0)
    for i in range(300):
        total = ex.maximum(total, ex.binary("div", 64 * B, 64) * (i + 1) + S)
    simplified = ex.simplify_size(total)
    for b, s in ((1, 1), (2, 3)):
        assert ex.index_value(simplified, {"batch": b, "seq": s}) == \
            ex.index_value(total, {"batch": b, "seq": s}) == 300 * b + s
