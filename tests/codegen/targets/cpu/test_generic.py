"""Micro-kernel bodies that differ only in their sizes are compiled once, as a generic body that
takes the sizes as arguments (generic.py, module.py's ``_share_sizes``): the library computes
what it computed with a body per kernel, in one part or several, and the rewrite lifts only
literals that may be any value."""

from __future__ import annotations

import os
import sys

import llvmlite.binding as llvm
import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper

from mlpack.codegen.compile import compile_onnx
from mlpack.codegen.targets.cpu import compile as cpu_compile
from mlpack.codegen.targets.cpu import generic, module

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from plan_runner import ATOL, NARROW_AND_WIDE, RTOL, Library, rand, run_plan  # noqa: E402

F = TP.FLOAT
CHANNELS = (48, 96)   # two 1x1 convolutions of one input: the same tile over other widths


def _model():
    inits, nodes = [], []
    for i, n in enumerate(CHANNELS):
        inits.append(helper.make_tensor(f"w{i}", F, [n, 32, 1, 1],
                                        rand(n, 32, 1, 1, seed=i).ravel().tolist()))
        nodes += [helper.make_node("Conv", ["x", f"w{i}"], [f"c{i}"]),
                  helper.make_node("Relu", [f"c{i}"], [f"y{i}"])]
    g = helper.make_graph(nodes, "sizes", [helper.make_tensor_value_info("x", F, [1, 32, 14, 14])],
                          [helper.make_tensor_value_info(f"y{i}", F, None)
                           for i in range(len(CHANNELS))], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _compile(target, monkeypatch, parts=None, share=True):
    texts = []
    build = module.build_module

    def spy(*a, **k):
        out = build(*a, **({**k, "parts": parts} if parts else k))
        texts.extend(out)
        return out
    with monkeypatch.context() as m:
        m.setattr(cpu_compile, "build_module", spy)
        if not share:
            m.setattr(module, "_share_sizes", lambda *a: [])
        art = cpu_compile.compile_cpu(compile_onnx(_model()), target)
    return art, texts


@pytest.mark.parametrize("target", NARROW_AND_WIDE)
def test_convolutions_of_other_widths_share_a_body_and_compute_the_same(target, monkeypatch):
    x = rand(1, 32, 14, 14, seed=7)
    g = compile_onnx(_model())
    shared, texts = _compile(target, monkeypatch)
    generics = [line for t in texts for line in t.splitlines()
                if line.startswith("define ") and '.generic"(' in line]
    assert len(generics) == 1 and "noinline" in generics[0]
    calls = [line for t in texts for line in t.splitlines() if "call void" in line and
             ".generic\"(" in line]
    assert len(calls) == len(CHANNELS)
    own, _ = _compile(target, monkeypatch, share=False)
    split, split_texts = _compile(target, monkeypatch, parts=3)
    assert len(split_texts) > 1
    # the generic body and its callers in one part (it is internal there)
    holders = [t for t in split_texts if '.generic"(' in t]
    assert len(holders) == 1 and holders[0].count('.generic"(') == 1 + len(CHANNELS)
    outs = [run_plan(art, g, {"x": x}, Library(art.elf)) for art in (shared, own, split)]
    for i, n in enumerate(CHANNELS):
        w = rand(n, 32, 1, 1, seed=i).astype(np.float64)[:, :, 0, 0]
        want = np.maximum(np.einsum("oc,nchw->nohw", w, x.astype(np.float64)), 0)
        np.testing.assert_allclose(outs[0][f"y{i}"], want, rtol=RTOL, atol=ATOL)
        np.testing.assert_array_equal(outs[0][f"y{i}"], outs[1][f"y{i}"])
        np.testing.assert_array_equal(outs[0][f"y{i}"], outs[2][f"y{i}"])


_BODY = '''define internal void @"NAME"(ptr noalias %".1", i64 %".2") alwaysinline nounwind
{
entry:
  %".3" = mul nsw i64 %".2", STRIDE
  %".4" = getelementptr inbounds float, ptr %".1", i64 %".3"
  %".5" = load <LANES x float>, ptr %".4", align 4
  %".6" = icmp slt i64 %".3", COUNT
  %".7" = select  i1 %".6", i64 STRIDE, i64 7
  ret void
}
'''


def _body(name, stride, count, lanes=4):
    return (_BODY.replace("NAME", name).replace("STRIDE", str(stride))
            .replace("COUNT", str(count)).replace("LANES", str(lanes)))


def _parses(bodies: dict[str, str]) -> None:
    llvm.parse_assembly("\n".join(bodies.values())).verify()


def test_only_the_literals_that_differ_become_arguments_one_per_pattern():
    bodies = {"a.impl": _body("a.impl", 64, 10), "b.impl": _body("b.impl", 96, 10)}
    assert generic.share_bodies(bodies, {}) == [["a.impl", "b.impl"]]
    _parses(bodies)
    head = bodies["a.impl"].split("\n\n")[0]
    assert head.startswith('define internal void @"a.impl.generic"(ptr noalias %".1", '
                           'i64 %".2", i64 %"size.0") noinline nounwind')
    # the stride, at both its places, is one argument; the count, the same in both, stays
    assert head.count('%"size.0"') == 3 and "icmp slt i64 %\".3\", 10" in head
    assert 'select  i1 %".6", i64 %"size.0", i64 7' in head
    assert 'call void @"a.impl.generic"(ptr %".1", i64 %".2", i64 64)' in bodies["a.impl"]
    assert bodies["b.impl"].startswith('define internal void @"b.impl"(ptr noalias %".1", '
                                       'i64 %".2") alwaysinline nounwind')
    assert 'call void @"a.impl.generic"(ptr %".1", i64 %".2", i64 96)' in bodies["b.impl"]


def test_bodies_that_differ_in_a_type_or_stand_alone_are_left_as_they_were():
    bodies = {"a.impl": _body("a.impl", 64, 10, lanes=4),
              "b.impl": _body("b.impl", 64, 12, lanes=8),
              "c.impl": _body("c.impl", 64, 10, lanes=4).replace("alwaysinline ", "")}
    before = dict(bodies)
    assert generic.share_bodies(bodies, {}) == []
    assert bodies == before


def test_identical_bodies_and_metadata_compare_by_content():
    a = _body("a.impl", 64, 10).replace("ret void", 'br label %"x", !llvm.loop !3\nx:\n  ret void')
    b = _body("b.impl", 96, 10).replace("ret void", 'br label %"x", !llvm.loop !9\nx:\n  ret void')
    assert generic.share_bodies({"a.impl": a, "b.impl": b}, {"3": "A", "9": "B"}) == []
    assert generic.share_bodies({"a.impl": a, "b.impl": b}, {"3": "A", "9": "A"}) != []
