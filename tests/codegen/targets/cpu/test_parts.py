"""A kernel library compiled as several LLVM modules at once (module.py's parts, objects.py's
helper processes) is the same library: the same kernels in the table, the same outputs bit for
bit, and only the table's symbol exported. The model has a depthwise convolution (its window
rows a loop: depthwise.py), pointwise ones and a matmul, so the parts hold different kernels."""

from __future__ import annotations

import ctypes
import os
import sys

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper

from mlpack.codegen.compile import compile_onnx
from mlpack.codegen.targets.cpu import compile as cpu_compile
from mlpack.codegen.targets.cpu import module
from mlpack.spec.ir import parse_graph

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from plan_runner import NARROW_AND_WIDE, Library, rand, run_plan  # noqa: E402

F = TP.FLOAT


def _model():
    c = 8
    inits = [helper.make_tensor("wp", F, [c, 3, 1, 1], rand(c, 3, 1, 1).ravel().tolist()),
             helper.make_tensor("wd", F, [c, 1, 5, 5], rand(c, 1, 5, 5, seed=1).ravel().tolist()),
             helper.make_tensor("bd", F, [c], rand(c, seed=2).ravel().tolist()),
             helper.make_tensor("wm", F, [c * 7 * 7, 10], rand(c * 49, 10, seed=3).ravel().tolist())]
    nodes = [helper.make_node("Conv", ["x", "wp"], ["p"]),
             helper.make_node("Relu", ["p"], ["r"]),
             helper.make_node("Conv", ["r", "wd", "bd"], ["d"], group=c, kernel_shape=[5, 5],
                              pads=[2, 2, 2, 2], strides=[2, 2]),
             helper.make_node("HardSwish", ["d"], ["h"]),
             helper.make_node("Flatten", ["h"], ["f"]),
             helper.make_node("MatMul", ["f", "wm"], ["y"])]
    g = helper.make_graph(nodes, "parts", [helper.make_tensor_value_info("x", F, [1, 3, 14, 14])],
                          [helper.make_tensor_value_info("y", F, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("target", NARROW_AND_WIDE)
def test_parts_link_into_the_same_library(target, monkeypatch, tmp_path):
    g = compile_onnx(_model())
    feeds = {"x": rand(1, 3, 14, 14, seed=4)}
    arts, outs = [], []
    for parts in (1, 3):
        build = module.build_module
        monkeypatch.setattr(cpu_compile, "build_module",
                            lambda *a, n=parts, build=build, **k: build(*a, **{**k, "parts": n}))
        art = cpu_compile.compile_cpu(g, target)
        arts.append(art)
        outs.append(run_plan(art, g, feeds, Library(art.elf))["y"])
    assert Library(arts[0].elf).names == Library(arts[1].elf).names == arts[0].kernel_names
    np.testing.assert_array_equal(outs[0], outs[1])
    path = tmp_path / "kernels.so"
    path.write_bytes(arts[1].elf)
    lib = ctypes.CDLL(str(path))
    assert lib[module.TABLE_SYMBOL]
    for name in arts[1].kernel_names:   # hidden in the link: not exported
        with pytest.raises(AttributeError):
            lib[name]


@pytest.mark.parametrize("target, realigned", [("x86_64-v4", True), ("x86_64-v2", True),
                                               ("aarch64", False)])
def test_x86_kernels_realign_their_frame_to_a_cache_line(target, realigned, monkeypatch):
    """An x86-64 kernel spills 256- and 512-bit registers and keeps its tile buffer on the stack
    of whichever thread runs it: on a caller's stack that is not on a 64-byte boundary, every
    such access split two cache lines (GoogLeNet's v4 artifact ran 20-60% slower on the
    threads whose stacks fell so). Every x86 function realigns its frame; the tile buffers sit
    on a line; aarch64's 128-bit vectors need no more than its ABI's 16 bytes."""
    texts = []
    build = module.build_module

    def spy(*a, **k):
        out = build(*a, **k)
        texts.extend(out)
        return out
    monkeypatch.setattr(cpu_compile, "build_module", spy)
    cpu_compile.compile_cpu(compile_onnx(_model()), target)
    defines = [line for t in texts for line in t.splitlines() if line.startswith("define ")]
    assert defines and all(('"stackrealign"' in line) == realigned for line in defines)
    tiles = [line for t in texts for line in t.splitlines()
             if '%"cbuf" = alloca' in line or '%"tile" = alloca' in line]
    assert tiles and all(line.endswith("align 64") for line in tiles), tiles


def _attention_twice():
    """Two attentions of the same shapes on other inputs: two row-block tiles whose code is
    the same (module._share_identical keeps one)."""
    one = """
  in %q{i}: f32{{h=4, s=512, d=64}} (h, s, d)
  in %k{i}: f32{{h=4, t=512, d=64}} (h, t, d)
  in %v{i}: f32{{h=4, t=512, d=64}} (h, t, d)
  %qk{i}: f32{{h=4, s=512, t=512}} = sum{{e=64}} %q{i}[h=h, s=s, d=e] * %k{i}[h=h, t=t, d=e]
  %m{i}: f32{{h=4, s=512, t=1}} = max{{u=512}} %qk{i}[h=h, s=s, t=u]
  %e{i}: f32{{h=4, s=512, t=512}} = exp(%qk{i}[h=h, s=s, t=t] - %m{i}[h=h, s=s, t=0])
  %z{i}: f32{{h=4, s=512, t=1}} = sum{{u=512}} %e{i}[h=h, s=s, t=u]
  %pv{i}: f32{{h=4, s=512, d=64}} = sum{{u=512}} %e{i}[h=h, s=s, t=u] * %v{i}[h=h, t=u, d=d]
  %o{i}: f32{{s=512, h=4, d=64}} = div(%pv{i}[h=h, s=s, d=d], %z{i}[h=h, s=s, t=0])
  out %o{i} (s, h, d)"""
    return parse_graph('graph "twice" {' + one.format(i=1) + one.format(i=2) + "\n}")


def test_a_tile_whose_code_repeats_leaves_no_members_behind(monkeypatch):
    """A row-block tile dropped for an identical earlier one takes its member functions with it:
    in a library of several parts they were defined hidden, so LLVM kept and compiled them
    (GPT-2's 12 attention layers: 79 functions instead of 24)."""
    texts = []
    build = module.build_module

    def recorded(*a, **k):
        texts.append(build(*a, **{**k, "parts": 2}))
        return texts[-1]
    monkeypatch.setattr(cpu_compile, "build_module", recorded)
    cpu_compile.compile_cpu(_attention_twice(), "x86_64-v2")
    defined = [line for text in texts[-1] for line in text.splitlines()
               if line.startswith("define") and ".rows." in line and ".impl" in line]
    tiles = {line.split("@")[1].split(".rows.")[0] for line in defined}
    assert len(tiles) == 1 and defined, defined
