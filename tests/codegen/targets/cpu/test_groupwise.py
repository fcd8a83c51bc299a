"""Grouped convolutions of 4, 8 and 16 channels per group as direct kernels of whole vectors
(codegen/targets/cpu/groupwise.py) against the float64 reference (ONNX Runtime's outputs agree
with it to the same tolerance), on x86_64-v2, v3 and v4 (each the host runs) and on aarch64
under qemu where the host has it.

Each case puts the grouped convolution between 1x1 convolutions, as ResNeXt and RegNet do, so
its input and output are laid out channels last: padding on every side, stride 2, a window
whose columns do not divide the row (the last unit starts early), channels that are not whole
vectors (masked lanes), a 5x5 window, 1x3 and 3x1 windows, a dynamic batch and SiLU in the
epilogue.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper
from mlpack.codegen.compile import compile_onnx
from mlpack.codegen.targets.cpu import compile_cpu
from mlpack.packager.reference import as_written, float64_outputs
from support import best_host_target, host_lacks, one_output_model, oracle_outputs

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# tests/codegen/targets/plan_runner.py
from plan_runner import ATOL, HOST_TARGETS, RTOL, rand, run_plan

F = TP.FLOAT


def grouped_case(channels, per_group, size, kernel=(3, 3), stride=1, batch=1, dyn=False,
                 silu=False):
    """1x1 convolution, ReLU, the grouped convolution (bias, 'same' padding), ReLU (or SiLU),
    1x1 convolution."""
    c, kh, kw = channels, *kernel
    groups = c // per_group
    nodes = [helper.make_node("Conv", ["x", "w0"], ["e"]),
             helper.make_node("Relu", ["e"], ["r"]),
             helper.make_node("Conv", ["r", "w1", "b1"], ["g"], group=groups,
                              kernel_shape=[kh, kw], strides=[stride, stride],
                              pads=[kh // 2, kw // 2, kh // 2, kw // 2])]
    if silu:
        nodes += [helper.make_node("Sigmoid", ["g"], ["s"]),
                  helper.make_node("Mul", ["g", "s"], ["a"])]
    else:
        nodes.append(helper.make_node("Relu", ["g"], ["a"]))
    nodes.append(helper.make_node("Conv", ["a", "w2"], ["y"]))
    inits = [("w0", rand(c, c, 1, 1, seed=1, scale=1 / np.sqrt(c))),
             ("w1", rand(c, per_group, kh, kw, seed=2, scale=1 / np.sqrt(per_group * kh * kw))),
             ("b1", rand(c, seed=3)),
             ("w2", rand(c, c, 1, 1, seed=4, scale=1 / np.sqrt(c)))]
    shape = ["N" if dyn else batch, c, size, size]
    m = one_output_model(nodes, [("x", F, shape)], inits)
    return m, {"x": rand(batch, c, size, size)}


CASES = {   # grouped_case's arguments
    "4_per_group": (32, 4, 13),
    "8_per_group_stride2": (64, 8, 15, (3, 3), 2),
    "8_per_group_ragged_channels": (104, 8, 9),    # 6.5 vectors of 16
    "4_per_group_odd_groups": (20, 4, 10),         # 2.5 vectors of 8, 1.25 of 16
    "4_per_group_5x5": (16, 4, 11, (5, 5)),
    "4_per_group_1x3": (16, 4, 8, (1, 3)),
    "4_per_group_3x1": (16, 4, 8, (3, 1)),
    "8_per_group_dynamic_batch": (48, 8, 7, (3, 3), 1, 2, True),
    "4_per_group_silu": (32, 4, 12, (3, 3), 1, 1, False, True),
    "16_per_group_stride2": (64, 16, 9, (3, 3), 2),
    # ResNeXt-50's third stage: every unit of a 14-wide row touches an edge (broadcast loads
    # of a column outside the input masked off)
    "16_per_group_14x14": (32, 16, 14),
    "8_per_group_14x14": (32, 8, 14),
}
LANES = {"x86_64-v2": 4, "x86_64-v3": 8, "x86_64-v4": 16, "aarch64": 4}


def runs_here(channels: int, per_group: int, target: str) -> bool:
    """Whether groupwise.py takes the case on ``target``: a group's channels divide a vector,
    and the channels are whole vectors unless the target has masked loads (AVX2 on)."""
    vl = LANES[target]
    return vl % per_group == 0 and (channels % vl == 0 or vl >= 8)


def conv1d_case(channels=64, per_group=4, length=50, taps=5):
    """A 1-D grouped convolution between 1x1 ones over a dynamic batch: the window is one row,
    its columns the sequence."""
    c = channels
    nodes = [helper.make_node("Conv", ["x", "w0"], ["e"]),
             helper.make_node("Relu", ["e"], ["r"]),
             helper.make_node("Conv", ["r", "w1", "b1"], ["g"], group=c // per_group,
                              pads=[taps // 2] * 2),
             helper.make_node("Relu", ["g"], ["a"]),
             helper.make_node("Conv", ["a", "w2"], ["y"])]
    inits = [("w0", rand(c, c, 1, seed=1, scale=1 / np.sqrt(c))),
             ("w1", rand(c, per_group, taps, seed=2, scale=1 / np.sqrt(per_group * taps))),
             ("b1", rand(c, seed=3)),
             ("w2", rand(c, c, 1, seed=4, scale=1 / np.sqrt(c)))]
    m = one_output_model(nodes, [("x", F, ["N", c, length])], inits)
    return m, {"x": rand(2, c, length)}


@pytest.mark.parametrize("target", HOST_TARGETS)
def test_a_1d_grouped_convolution_matches_the_reference(target):
    m, feeds = conv1d_case()
    g = compile_onnx(m)
    [d] = _grouped(g, target)
    assert (d.kh, d.kws) == (None, 5)
    got = run_plan(compile_cpu(g, target), g, feeds)[g.outputs[0].name]
    [want] = float64_outputs(as_written(m), [feeds])
    np.testing.assert_allclose(got, want["y"], rtol=RTOL, atol=ATOL)


def _grouped(g, target: str) -> list:
    from mlpack.codegen.targets.cpu.compile import schedule_kernels
    from mlpack.codegen.targets.cpu.groupwise import Grouped
    from mlpack.codegen.targets.cpu.target import get_target
    _, kernels, _, _, _ = schedule_kernels(g, get_target(target))
    return [k.gemm for k in kernels if isinstance(k.gemm, Grouped)]


@pytest.mark.parametrize("target", HOST_TARGETS)
@pytest.mark.parametrize("case", list(CASES))
def test_grouped_matches_the_reference(case, target):
    args = CASES[case]
    m, feeds = grouped_case(*args)
    g = compile_onnx(m)
    assert [d.c for d in _grouped(g, target)] == [args[1]] * runs_here(*args[:2], target)
    art = compile_cpu(g, target)
    got = run_plan(art, g, feeds)[g.outputs[0].name]
    [want] = float64_outputs(as_written(m), [feeds])
    np.testing.assert_allclose(got, want["y"], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(got, oracle_outputs(m, feeds)[0], rtol=RTOL, atol=ATOL)


def test_which_grouped_convolutions_run_here():
    """Whole vectors of groups: 4, 8 or 16 channels a group dividing the target's vector, the
    input laid out channels last; channels that are not whole vectors are masked (AVX2 on).
    Two channels a group are no GEMM (gemmview.MIN_BATCHED_N) and stay depthwise.py's; 32 fill
    a GEMM's tile as they are."""
    def grouped(case, target):
        return _grouped(compile_onnx(case[0]), target)
    assert [d.c for d in grouped(grouped_case(20, 4, 8), "x86_64-v3")] == [4]
    assert [d.c for d in grouped(grouped_case(16, 8, 8), "x86_64-v2")] == []   # 4 lanes
    assert grouped(grouped_case(12, 2, 8), "x86_64-v4") == []
    assert grouped(grouped_case(64, 16, 8), "x86_64-v3") == []   # 8 lanes
    assert grouped(grouped_case(64, 32, 8), "x86_64-v4") == []
    # a dilated window's taps are no unit steps of the input's columns: a GEMM
    dilated = grouped_case(32, 4, 11)[0]
    next(n for n in dilated.graph.node if n.attribute and any(
        a.name == "group" for a in n.attribute)).attribute.append(
        helper.make_attribute("dilations", [2, 2]))
    assert _grouped(compile_onnx(dilated), "x86_64-v4") == []
    [d] = grouped(grouped_case(64, 8, 15, stride=2), "x86_64-v4")
    assert (d.vl, d.stride, d.kws, d.khs) == (16, 2, 3, 3)
    assert d.rows * -(-8 // d.rows) - 8 < d.rows   # 8 columns in units of even width
    [d] = grouped(grouped_case(64, 4, 15), "x86_64-v3")
    assert d.vl == 8 and d.rows < 8   # 16 registers: fewer columns a unit
    # a whole-vector group holds no input vectors, only an accumulator a column: at stride 2
    # (three input vectors a column when rotating) still 15 columns in two units
    [d] = grouped(grouped_case(64, 8, 15, stride=2), "x86_64-v3")
    assert d.broadcast and d.rows == 8


def test_a_group_of_a_whole_vector_broadcasts_its_channels():
    """16 channels a group on AVX-512 and 8 on AVX2 broadcast each input channel (no
    rotation, the weights as they are); 4 on SSE and 8 on AVX-512 rotate."""
    def kinds(case, target):
        return [(d.c, d.broadcast) for d in _grouped(compile_onnx(case[0]), target)]
    assert kinds(grouped_case(32, 16, 14), "x86_64-v4") == [(16, True)]
    assert kinds(grouped_case(32, 8, 14), "x86_64-v3") == [(8, True)]
    assert kinds(grouped_case(32, 8, 14), "x86_64-v4") == [(8, False)]
    assert kinds(grouped_case(32, 4, 14), "x86_64-v2") == [(4, False)]


def test_the_rotated_weights_take_each_lane_from_its_group():
    """W'[kh, kw, s, c * g + co] = W[c * g + co, (co + s) % c, kh, kw], zero past the last
    channel: the prepare kernel's output, as the engine computes it at open, from the
    artifact's packed region, on the widest level this host runs (AVX2 or AVX-512: 20
    channels are 2.5 vectors of 8, 1.25 of 16)."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from plan_runner import prepared
    if host_lacks("x86_64-v3") is not None:   # (SSE takes 20 channels as 5 whole vectors)
        pytest.skip(f"the padded lanes need AVX2 or AVX-512: {host_lacks('x86_64-v3')}")
    target = best_host_target("x86_64-v3", "x86_64-v4")
    m, _ = grouped_case(20, 4, 6)
    g = compile_onnx(m)
    art = compile_cpu(g, target)
    [d] = _grouped(g, target)
    assert d.padded > 20
    packed = prepared(art)
    [name] = [n for n in packed if "#rot" in n]
    rot = packed[name].view(np.float32).reshape(3, 3, 4, d.padded)
    w = next(c.data for c in g.constants.values() if c.data.shape == (20, 4, 3, 3))
    for s in range(4):
        for p in range(20):
            co = p % 4
            np.testing.assert_array_equal(rot[:, :, s, p], w[p, (co + s) % 4])
    assert not rot[:, :, :, 20:].any()


@pytest.mark.parametrize("case", ["4_per_group", "8_per_group_stride2"])
def test_grouped_on_aarch64_under_qemu(case, tmp_path):
    """The aarch64 artifact validated under qemu-aarch64 by the build. NEON's vectors hold 4
    lanes: one group of 4 channels runs here, a group of 8 stays a GEMM."""
    from mlpack.packager import build as b
    from mlpack.packager import emulate
    why = emulate.missing(emulate.EMULATORS["arm64"])
    if why:
        pytest.skip(why)
    import onnx
    args = CASES[case]
    m, _ = grouped_case(*args)
    path = tmp_path / "m.onnx"
    onnx.save(m, path)
    report = b.build(str(path), tmp_path / "m.mlpack", targets=["aarch64"], cache=False)
    [arm] = [a for a in report.artifacts if a.target == "aarch64"]
    assert arm.validated and arm.emulator == "qemu-aarch64"
    assert len(_grouped(compile_onnx(m), "aarch64")) == runs_here(*args[:2], "aarch64")

