"""The precisions (codegen/precisions/): every name of the spec's vocabulary is a module or
planned, fp32 the identity with a tolerance, the planned ones refused by name; every target's
precisions known."""

from __future__ import annotations

import pytest

from mlpack.codegen import precisions
from mlpack.codegen.errors import UnsupportedTargetError
from mlpack.codegen.targets import registry
from mlpack.spec import media
from support import parse_ir

GRAPH = """graph "g" {
  in %x: f32{n=4} (n)
  %y: f32{n=4} = %x[n=n] * 2.0
  out %y (n)
}"""


def test_every_precision_of_the_spec_is_a_module_or_planned():
    assert precisions.names() == media.PRECISIONS
    assert set(precisions.MODULES) <= set(media.PRECISIONS)
    for name in precisions.names():
        module = precisions.get(name)
        assert module.NAME == name and module.SUMMARY
        assert module.IMPLEMENTED == (name in precisions.MODULES)
    assert precisions.implemented() == ("fp32",)
    for name in precisions.implemented():
        assert precisions.tolerance(name).multiple > 0
    for t in registry.TARGETS.values():
        assert set(t.precisions) <= set(precisions.names()), t.name


def test_fp32_is_the_identity_and_planned_ones_are_refused_by_name():
    g = parse_ir(GRAPH)
    assert precisions.apply("fp32", g) is g
    with pytest.raises(UnsupportedTargetError, match=r"precision bf16 is not implemented yet \(planned\)"):
        precisions.apply("bf16", g)
    with pytest.raises(UnsupportedTargetError, match=r"unknown precision 'fp64'"):
        precisions.get("fp64")
