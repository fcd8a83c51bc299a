"""spec/sizes.py: the config's size grammar read, written and evaluated; every size the IR can
build from symbols with + - * // % max min is written as text that reads back to its value."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlpack.spec import sizes
from mlpack.spec.ir import expr as ex


@pytest.mark.parametrize("text, parsed, value", [
    ("$batch", "batch", 3),
    ("2 * $batch", ("mul", 2, "batch"), 6),
    ("$seq + 1", ("add", "seq", 1), 8),
    ("$seq-1", ("sub", "seq", 1), 6),
    ("($seq - 3) // 2 + 1", ("add", ("floordiv", ("sub", "seq", 3), 2), 1), 3),
    ("$seq // -2 * -1", ("mul", ("floordiv", "seq", -2), -1), 4),
    ("$seq % 4", ("mod", "seq", 4), 3),
    ("max($batch, 4) - min($seq, 2)", ("sub", ("max", "batch", 4), ("min", "seq", 2)), 2),
    (5, 5, 5),
])
def test_reads_and_evaluates(text, parsed, value):
    assert sizes.parse_size(text) == parsed
    assert sizes.evaluate(parsed, {"batch": 3, "seq": 7}) == value


@pytest.mark.parametrize("text, why", [
    (-1, ">= 0"), (True, "integer or a string"), (2.0, "integer or a string"),
    ("3", "JSON integer"), ("2 * 3", "JSON integer"), ("($a)", "exactly '$name'"),
    (" $a", "exactly '$name'"), ("$", "unexpected"), ("batch", "unknown name 'batch'"),
    ("$a +", "ends too early"), ("$a $b", "unexpected"), ("select($a, 1, 2)", "unknown name"),
    ("$a / 2", "unexpected"), ("max($a)", "expected ','"), ("", "empty"),
])
def test_refuses_what_is_not_a_size(text, why):
    with pytest.raises(ValueError, match=why.replace("(", r"\(").replace("$", r"\$")):
        sizes.parse_size(text)


def test_evaluation_errors():
    with pytest.raises(KeyError):
        sizes.evaluate(sizes.parse_size("$a + $b"), {"a": 1})
    with pytest.raises(ValueError, match="negative"):
        sizes.evaluate(sizes.parse_size("$a - 3"), {"a": 1})
    with pytest.raises(ValueError, match="division by zero"):
        sizes.evaluate(sizes.parse_size("$a // $b"), {"a": 1, "b": 0})
    with pytest.raises(ValueError, match="overflows"):
        sizes.evaluate(sizes.parse_size("$a * $a"), {"a": 1 << 40})


def test_config_size_of_ir_expressions():
    b, s = ex.sym("batch"), ex.sym("seq")
    assert sizes.config_size(ex.const(4)) == 4
    assert sizes.config_size(b) == "$batch"
    assert sizes.config_size(ex.simplify_size(b + b)) == "2 * $batch"
    assert sizes.config_size(s + 1) == "$seq + 1"
    assert sizes.config_size(ex.floordiv(s - 3, 2) + 1) == "($seq - 3) // 2 + 1"
    assert sizes.config_size(b - (s - 1)) == "$batch - ($seq - 1)"
    assert sizes.config_size(ex.select(ex.binary("ge", ex.const(2), ex.const(4)), 1, 2)) == 2
    for bad in (ex.select(ex.binary("eq", b, 2), 1, b), ex.var("i") + 1, ex.unary("neg", b)):
        with pytest.raises(ValueError):
            sizes.config_size(bad)


_LEAF = st.one_of(st.integers(-5, 9).map(ex.const), st.sampled_from("abc").map(ex.sym))
_EXPR = st.recursive(_LEAF, lambda kids: st.tuples(
    st.sampled_from(["add", "sub", "mul", "floordiv", "mod", "max", "min"]), kids, kids).map(
        lambda t: ex.binary(*t)), max_leaves=8)


@given(_EXPR, st.integers(0, 50), st.integers(0, 50), st.integers(0, 50))
def test_written_text_reads_back_to_the_same_value(e, a, b, c):
    env = {"a": a, "b": b, "c": c}
    try:
        want = ex.index_value(e, env)
    except ZeroDivisionError:
        return
    written = sizes.config_size(e)
    if isinstance(written, int):
        assert written == want
        return
    parsed = sizes.parse_size(written)   # always in the grammar
    try:
        got = sizes._eval(parsed, env)
    except ValueError:  # a division by zero the IR's evaluation took another way round
        return
    assert got == want, written
