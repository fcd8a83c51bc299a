"""Sizes the ONNX importer builds from exporters' shape arithmetic: torch's ``expand(B, -1, -1)``
guard (Shape, Gather, Concat with -1s, Equal, Where) gives a plain ``$batch``, and Concat,
Reshape(-1) and Pad give polynomial sizes over the input's symbols."""

from __future__ import annotations

import pytest
from support import load_models_module

from mlpack.codegen.compile import compile_onnx
from mlpack.spec.ir import expr as ex

MODELS = load_models_module("size_expressions")
B, S = ex.sym("batch"), ex.sym("seq")


@pytest.mark.parametrize("name, dims", [
    ("vit_cls_expand", [B, 4, 4]),
    ("concat_twice", [2 * B, 3]),
    ("reshape_infer", [4 * B, 3]),
    ("pad_one", [B, S + 1]),
])
def test_output_sizes(name, dims):
    model, _, _ = MODELS.MODELS[name]()
    graph = compile_onnx(model)
    port, = graph.outputs
    got = [graph.types[port.name].dims[d] for d in port.layout]
    assert got == [ex.as_expr(d) for d in dims]


def test_a_guard_the_sign_cannot_decide_stays_a_select():
    model, _, _ = MODELS.undecidable_expand()
    graph = compile_onnx(model)
    port, = graph.outputs
    assert graph.types[port.name].dims[port.layout[0]].op == "select"
